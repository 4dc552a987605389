"""Slurm's formats and ``workbench run --slurm``'s placement, without a cluster: node lists (through a scripted
``scontrol show hostnames``, and read here where scontrol is absent), tasks per node, which node forks its ranks and
which are launched through srun, and the one-line refusals; and when a Slurm sweep's wait takes the array for ended,
against scripted ``squeue`` answers."""

import shlex

import pytest

from workbench.base.errors import ConfigError
from workbench.base.slurm_commands import (
    SlurmError,
    _indices,
    expand_nodelist,
    expand_nodelist_here,
    expand_tasks_per_node,
)
from workbench.launch.cli import _config_from_args, build_parser, main
from workbench.launch.slurm_allocation import allocation_hosts

ADDRESSES = {"n01": "10.1.0.1", "n02": "10.1.0.2", "n03": "10.1.0.3"}
RACKS = ["rack1-node01", "rack1-node02", "rack2-node01", "rack2-node02"]


@pytest.fixture(autouse=True)
def bin_dir(tmp_path, monkeypatch):
    """PATH is one empty directory: no test here reaches this machine's Slurm (no scontrol: node lists are read
    here) unless it puts a scripted ``scontrol`` in that directory."""
    path = tmp_path / "bin"
    path.mkdir()
    monkeypatch.setenv("PATH", str(path))
    return path


def scripted_scontrol(bin_dir, names=(), error=""):
    """An ``scontrol`` that appends its arguments to ``bin_dir/argv``, prints ``names`` one a line and ``error`` on
    stderr, and exits 0 (as Slurm's does on a list it cannot read). Shell builtins only: PATH holds nothing else."""
    script = bin_dir / "scontrol"
    script.write_text(f"#!/bin/sh\necho \"$@\" >> '{bin_dir}/argv'\n"
                      + (f"printf '%s\\n' {' '.join(names)}\n" if names else "")
                      + (f"echo {shlex.quote(error)} >&2\n" if error else ""))
    script.chmod(0o755)
    return bin_dir / "argv"


def test_node_lists_go_through_scontrol_show_hostnames(bin_dir):
    argv = scripted_scontrol(bin_dir, RACKS)
    assert expand_nodelist("rack[1-2]-node[01-02]") == RACKS
    assert argv.read_text() == "show hostnames rack[1-2]-node[01-02]\n"
    scripted_scontrol(bin_dir, error="scontrol: error: _parse_single_range: Invalid range: `1-x'")
    with pytest.raises(SlurmError, match=r"^cannot read the node list 'node\[1-x\]': Invalid range: `1-x'$"):
        expand_nodelist("node[1-x]")
    scripted_scontrol(bin_dir, ["a]"])  # what Slurm 22.05 answers to "a[1-2": an unclosed bracket
    with pytest.raises(SlurmError, match="cannot read the node list 'a\\[1-2'"):
        expand_nodelist("a[1-2")


def test_without_scontrol_node_lists_are_read_here_as_slurm_reads_them():
    for read in (expand_nodelist, expand_nodelist_here):  # no scontrol on PATH: the first is the second
        assert read("rack[1-2]-node[01-02]") == RACKS  # every bracket of a name, the first varying slowest
        assert read("node[01-03,7],gpu1") == ["node01", "node02", "node03", "node7", "gpu1"]
        assert read("n[1-2],m[5,7]-k[1-2]") == ["n1", "n2", "m5-k1", "m5-k2", "m7-k1", "m7-k2"]
        assert read("n[009-011],x[1-10]")[:4] == ["n009", "n010", "n011", "x1"] and read("x[1-10]")[-1] == "x10"
        assert read("a[8-10]b,c") == ["a8b", "a9b", "a10b", "c"]
        for bad in ("node[1-x]", "n[3-1]", "a[1-2", "a]", "n[[1]]", "n[]", "a,,b", ""):
            with pytest.raises(SlurmError, match="cannot read the node list"):
                read(bad)


def test_tasks_per_node_and_array_indices_expand_as_slurm_writes_them():
    assert expand_tasks_per_node("2(x3),1") == [2, 2, 2, 1]
    with pytest.raises(SlurmError, match="SLURM_TASKS_PER_NODE"):
        expand_tasks_per_node("two")
    assert _indices("3") == [3] and _indices("1,4-6%2") == [1, 4, 5, 6] and _indices("1-7:3") == [1, 4, 7]


def test_an_allocation_on_racks_places_a_rank_on_each_node(bin_dir):
    env = {"SLURM_JOB_NODELIST": "rack[1-2]-node[01-02]", "SLURM_TASKS_PER_NODE": "1(x4)",
           "SLURMD_NODENAME": "rack1-node01"}
    addresses = {name: f"10.2.0.{i}" for i, name in enumerate(RACKS, 1)}
    here = allocation_hosts(None, env, addresses.get)  # read without scontrol
    argv = scripted_scontrol(bin_dir, RACKS)
    assert allocation_hosts(None, env, addresses.get) == here and argv.exists()  # and through scontrol
    assert [(h["address"], h["slots"], h["launch"] and h["launch"][-1]) for h in here] == [
        ("10.2.0.1", 1, None), ("10.2.0.2", 1, "-wrack1-node02"), ("10.2.0.3", 1, "-wrack2-node01"),
        ("10.2.0.4", 1, "-wrack2-node02")]


def test_a_node_list_slurm_cannot_read_is_one_line_and_exit_2(monkeypatch, capsys):
    monkeypatch.setenv("SLURM_JOB_NODELIST", "rack[1-x]")
    monkeypatch.setenv("SLURM_TASKS_PER_NODE", "4")
    assert main(["run", "--slurm"]) == 2
    err = capsys.readouterr().err
    assert err == "workbench: error: slurm: cannot read the node list 'rack[1-x]': '1-x' is no number or range\n"


def test_in_a_batch_script_this_node_forks_its_ranks_and_the_others_go_through_srun():
    env = {"SLURM_JOB_NODELIST": "n[01-03]", "SLURM_TASKS_PER_NODE": "2(x3)", "SLURM_JOB_CPUS_PER_NODE": "4(x3)",
           "SLURMD_NODENAME": "n02"}
    hosts = allocation_hosts(None, env, ADDRESSES.get)
    srun = ["srun", "--overlap", "-N1", "-n1"]
    assert hosts == [{"address": "10.1.0.2", "slots": 2, "launch": None},
                     {"address": "10.1.0.1", "slots": 2, "launch": [*srun, "-wn01", "--cpus-per-task=4"]},
                     {"address": "10.1.0.3", "slots": 2, "launch": [*srun, "-wn03", "--cpus-per-task=4"]}]
    three = allocation_hosts(3, env, ADDRESSES.get)  # this node's tasks first, then the next node's
    assert [(h["address"], h["slots"]) for h in three] == [("10.1.0.2", 2), ("10.1.0.1", 1)]
    assert allocation_hosts(2, env, ADDRESSES.get) == [{"address": "10.1.0.2", "slots": 2, "launch": None}]


def test_off_the_allocation_every_node_is_launched_and_refusals_are_one_line():
    env = {"SLURM_JOB_NODELIST": "n[01-02]", "SLURM_TASKS_PER_NODE": "1,3"}  # salloc on a login node
    hosts = allocation_hosts(None, env, {"n01": "127.0.0.1", "n02": "127.0.0.2"}.get)
    assert hosts[0] == {"address": "127.0.0.1", "slots": 0, "launch": None}
    assert [(h["slots"], h["launch"][-1]) for h in hosts[1:]] == [(1, "-wn01"), (3, "-wn02")]
    with pytest.raises(ConfigError, match=r"--slurm 5: the allocation has 4 tasks .*ask for 1\.\.4 ranks"):
        allocation_hosts(5, env, ADDRESSES.get)
    with pytest.raises(ConfigError, match="does not match the 2 nodes"):
        allocation_hosts(None, {**env, "SLURM_TASKS_PER_NODE": "4"}, ADDRESSES.get)
    with pytest.raises(ConfigError, match="not inside a Slurm allocation"):
        allocation_hosts(None, {}, ADDRESSES.get)


def test_cli_slurm_flag(monkeypatch):
    monkeypatch.setenv("SLURM_JOB_NODELIST", "n01")
    monkeypatch.setenv("SLURM_TASKS_PER_NODE", "4")
    monkeypatch.setenv("SLURMD_NODENAME", "n01")
    monkeypatch.setattr("workbench.launch.slurm_allocation.node_address", lambda node: "127.0.0.1")
    config = _config_from_args(build_parser().parse_args(["run", "--slurm"]))
    assert (config.world_size, config.bind, config.hosts[0]["slots"]) == (4, "127.0.0.1", 4)
    config = _config_from_args(build_parser().parse_args(["run", "--slurm", "--world-size", "3"]))
    assert config.world_size == 3 and config.hosts[0]["slots"] == 3
    with pytest.raises(ConfigError, match="give --slurm or --hosts-file, not both"):
        _config_from_args(build_parser().parse_args(["run", "--slurm", "--hosts-file", "h"]))


def _scripted_wait(monkeypatch, tmp_path, script):
    """Run the sweep's wait for one unfinished point (task 5_0) against ``script``: a function of the n-th squeue
    answer (0, 1, ...) returning the task states; the time it took and what it returned."""
    import itertools
    import time

    from workbench.base import slurm_commands as slurm
    from workbench.launch.sweeps import slurm_run as sweep_sbatch

    monkeypatch.setattr(sweep_sbatch, "POLL_S", 0.01)
    monkeypatch.setattr(sweep_sbatch, "SQUEUE_EVERY_S", 0.01)
    monkeypatch.setattr(sweep_sbatch, "REQUEUE_GRACE_S", 2.0)
    answers = itertools.count()
    monkeypatch.setattr(slurm, "task_states", lambda job: script(next(answers)))
    (tmp_path / "p0").mkdir()
    began = time.monotonic()
    done = sweep_sbatch._wait("5", tmp_path, {"p0": None}, {"p0": "5_0"}, progress=False)
    return time.monotonic() - began, done


def test_a_cancelled_task_ends_the_sweep_wait_at_once(monkeypatch, tmp_path):
    took, done = _scripted_wait(monkeypatch, tmp_path, lambda n: {"5_0": "CANCELLED"})
    assert done == {} and took < 1.0  # the 2 s grace is not waited for: scancel is final


def test_a_task_requeued_after_it_failed_is_waited_for(monkeypatch, tmp_path):
    """FAILED for a while (longer than two polls), then PENDING, then the point's second attempt ends."""
    import json

    def script(n):
        if n < 20:
            return {"5_0": "FAILED"}
        if n == 20:
            (tmp_path / "p0" / "point.json").write_text(json.dumps({"status": "failed", "started": 1.0}))
            return {"5_0": "PENDING (BeginTime)"}
        return {"5_0": "FAILED"}

    _, done = _scripted_wait(monkeypatch, tmp_path, script)
    assert done == {"p0": "failed"}  # the second attempt's end, not the first one's


def test_a_task_that_failed_for_good_ends_the_wait_after_the_grace(monkeypatch, tmp_path):
    took, done = _scripted_wait(monkeypatch, tmp_path, lambda n: {"5_0": "FAILED"})
    assert done == {} and 2.0 <= took < 5.0
