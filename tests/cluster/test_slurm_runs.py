"""Runs whose ranks Slurm starts, against the session's real one-node Slurm (``conftest.py``): a hosts file whose
second line launches through ``srun``, and ``workbench run --slurm`` inside an allocation."""

import json
import os
import subprocess
import sys
import time

import leaks

from workbench.results.run_result import RunResult

WORKBENCH = [sys.executable, "-m", "workbench"]


def steps_while(slurm, proc, timeout):
    """Wait for ``proc`` (bounded); meanwhile collect the ids of the job steps Slurm lists (``J.0`` ...)."""
    seen = set()
    deadline = time.monotonic() + timeout
    while proc.poll() is None:
        assert time.monotonic() < deadline, f"the run did not end within {timeout} s"
        seen |= set(slurm.run("squeue", "-h", "-s", "-o", "%i").stdout.split())
        time.sleep(0.2)
    return {s for s in seen if "." in s and s.split(".")[1].isdigit()}


def summary_of(text):
    return json.loads(text.strip().splitlines()[-1])


def run_in_allocation(slurm, argv, tmp_path, salloc=("-N1", "-n1", "-c2"), timeout=200):
    before = {p.key for p in leaks.project_processes()}
    proc = subprocess.Popen(["salloc", *salloc, *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=tmp_path)
    try:
        steps = steps_while(slurm, proc, timeout)
        out, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    left = leaks.wait_gone(before, os.environ[leaks.TAG_VAR], timeout=10)
    assert not left, "left running:\n" + "\n".join(map(str, left))
    return proc.returncode, out, err, steps


def test_ranks_started_by_srun_from_a_hosts_file_and_one_killed_there(slurm, tmp_path):
    """Line 2 of the hosts file launches through srun: ranks 2 and 3 run in a job step of the allocation (their
    rank template is the step), rank 3 is killed there at step 100, and shrink finishes with 3 ranks."""
    hosts = tmp_path / "hosts"
    hosts.write_text(f"127.0.0.1 2\n127.0.0.2 2 srun --overlap -N1 -n1 -w {slurm.node}\n")
    code, out, err, steps = run_in_allocation(
        slurm, [*WORKBENCH, "run", "--hosts-file", str(hosts), "--steps", "200", "--fault", "kill:rank=3,step=100",
                "--strategy", "shrink", "--out", str(tmp_path / "run"), "--json"], tmp_path)
    assert code == 0, err
    summary = summary_of(out)
    assert (summary["outcome"], summary["world_size_initial"], summary["world_size_final"]) == ("completed", 4, 3)
    (failure,) = summary["failures"]
    assert failure["rank"] == 3 and failure["step"] == 100 and failure["world_size_after"] == 3
    assert "on 127.0.0.2 lost its connection" in failure["cause"] and failure["steps_redone"] == 0
    assert steps, "no job step was seen: the ranks of line 2 did not run through srun"
    assert slurm.queue() == ""


def test_run_slurm_places_every_rank_through_srun_under_salloc(slurm, tmp_path):
    """``--slurm`` under salloc (not in a job step: this machine holds no rank): the allocation's 4 tasks become
    4 ranks on its node, started through srun; a kill there, shrink, 3 ranks finish."""
    code, out, err, steps = run_in_allocation(
        slurm, [*WORKBENCH, "run", "--slurm", "--steps", "200", "--fault", "kill:rank=3,step=100", "--strategy",
                "shrink", "--out", str(tmp_path / "run"), "--json"], tmp_path,
        salloc=("-N1", "-n4", "--overcommit"))
    assert code == 0, err
    summary = summary_of(out)
    assert (summary["outcome"], summary["world_size_initial"], summary["world_size_final"]) == ("completed", 4, 3)
    assert "lost its connection" in summary["failures"][0]["cause"]
    hosts = RunResult.load(tmp_path / "run" / "result.h5").config["hosts"]
    assert hosts == [{"address": "127.0.0.1", "slots": 0, "launch": None},
                     {"address": "127.0.0.1", "slots": 4,
                      "launch": ["srun", "--overlap", "-N1", "-n1", f"-w{slurm.node}", "--cpus-per-task=1"]}]
    assert steps


def test_run_slurm_in_a_batch_script_forks_this_nodes_ranks_here(slurm, tmp_path):
    """``--slurm 2`` in an sbatch script: the batch step's node is this node; its 2 ranks are forked there, no
    step is started for them; asking for more ranks than tasks is one line, exit 2."""
    script = tmp_path / "job.sh"
    script.write_text(f"#!/bin/bash\ncd {tmp_path}\n"
                      f"{' '.join(WORKBENCH)} run --slurm 2 --steps 60 --out run --json > summary.json\n"
                      f"{' '.join(WORKBENCH)} run --slurm 9 --steps 60 2> refused.txt; echo $? > refused.code\n")
    done = slurm.run("sbatch", "--wait", "-N1", "-n3", "--overcommit", "-o", str(tmp_path / "job.log"), str(script),
                     timeout=200)
    assert done.returncode == 0, done.stderr + (tmp_path / "job.log").read_text()
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert (summary["outcome"], summary["world_size_initial"]) == ("completed", 2)
    hosts = RunResult.load(tmp_path / "run" / "result.h5").config["hosts"]
    assert hosts == [{"address": "127.0.0.1", "slots": 2, "launch": None}]  # forked here: no srun
    assert (tmp_path / "refused.code").read_text().strip() == "2"
    assert (tmp_path / "refused.txt").read_text() == (
        "workbench: error: slurm: --slurm 9: the allocation has 3 tasks (SLURM_TASKS_PER_NODE=3 on "
        f"{slurm.node}); ask for 1..3 ranks\n")
