"""No silent fallback (docs/concepts.md, "No silent fallback"): each fallback below is taken on a planted condition
and seen said, as a run's ``fallback`` event, a ``FallbackWarning`` outside a run, or an error where going on is
wrong."""

from __future__ import annotations

import json
import os
import threading
import warnings
from collections import deque
from types import SimpleNamespace

import pytest
import torch
from sweep_fixtures import fake_sweep

import workbench
from workbench.base import machine
from workbench.base.errors import ConfigError, SweepError
from workbench.base.fallbacks import FallbackWarning
from workbench.config import devices
from workbench.launch.slurm_allocation import allocation_hosts
from workbench.launch.sweeps import slurm_run, table
from workbench.launch.sweeps.plan import notebook_parameters
from workbench.rank import channel, gossip
from workbench.rank.comm import CommError
from workbench.results import clock


class Said(list):
    """A run's ``say``: the names of the fallbacks it heard, in order."""

    def __call__(self, what: str, detail: str) -> None:
        self.append(what)


def whats(record) -> list[str]:
    return [w.message.what for w in record if isinstance(w.message, FallbackWarning)]


# -- the rank clock ----------------------------------------------------------------------------------------------
def test_unstamped_steps_and_generations_counted_at_their_wall_time_are_said_once():
    said = Said()
    rt = clock.RankTime(say=said)
    rt.on_joined(5, {"gen": 1}, wait=0.0, since=None)  # a peer's rank: no CPU stamp
    rows = [{"step": s, "generation": 0 if s < 2 else 1, "time": 1.0 + s, "step_time": 1.0} for s in range(4)]
    assert rt.timeline(rows) == pytest.approx(4.0)
    assert said == ["rank_time_wall"]
    stamped = clock.RankTime(say=Said())
    stamped.last[0] = 0.0
    stamped.on_step(0, {"gen": 0, "step": 0, "cpu": 0.01})
    stamped.on_row(0, {"step": 0, "generation": 0, "time": 1.0, "step_time": 1.0})
    assert stamped.timeline([stamped.rows[(0, 0)]]) == pytest.approx(0.01) and stamped.say == []


def test_a_killed_rank_not_reaped_in_time_has_its_unmeasured_teardown_said():
    said = Said()
    kill = {"kind": "kill", "step": 3, "t": 0.0, "process_cpu": 2.47}
    unreaped = SimpleNamespace(pid=4242, cpu_s=None)  # a forked rank whose template's wait timed out
    assert clock.teardown_s(unreaped, kill, said) is None and said == ["teardown_unmeasured"]
    assert clock.teardown_s(object(), kill, said) is None  # started afresh: no reaped usage by design, not said
    assert clock.teardown_s(unreaped, {**kill, "kind": "hang"}, said) is None and said == ["teardown_unmeasured"]


def test_a_resumed_checkpoint_that_cannot_be_sized_is_said(tmp_path):
    said = Said()
    rt = clock.RankTime(say=said)
    rt.reads_from(2, str(tmp_path / "gone.h5"))
    assert rt.gens[2].read == 0 and said == ["checkpoint_unsized"]


def test_a_disk_speed_learnt_late_is_said(monkeypatch):
    monkeypatch.setattr(clock, "DISK_WAIT_S", 0.01)
    monkeypatch.setenv(machine.DISK_MIB_VAR, "500")
    said, stuck = Said(), threading.Event()
    rt = clock.RankTime(say=said)
    rt._disk_thread = threading.Thread(target=stuck.wait, args=(10,), daemon=True)  # a disk thread still writing
    rt._disk_thread.start()
    rt.gens[1] = clock._Generation(read=2**20)
    try:
        rt.finish()
    finally:
        stuck.set()
    assert said == ["disk_speed_late"] and rt.disk == (500.0, machine.DISK_MIB_VAR)


# -- this machine ------------------------------------------------------------------------------------------------
def test_cores_taken_from_the_machine_count_are_said(monkeypatch):
    def unreadable(pid):
        raise OSError("no affinity here")

    monkeypatch.setattr(os, "sched_getaffinity", unreadable)
    with pytest.warns(FallbackWarning, match="affinity cannot be read") as record:
        assert machine.usable_cores() == (os.cpu_count() or 1)
    assert whats(record) == ["usable_cores_unknown"]


def test_an_unpinned_latency_on_one_core_is_said_and_not_cached(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv(machine.LATENCY_VAR, raising=False)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0})
    monkeypatch.setattr(machine, "_HOPS", "print(0.00004)")  # each process: a hop of 40 µs a round trip
    with pytest.warns(FallbackWarning, match="gloo hop unpinned") as record:
        assert machine.latency_us() == (20.0, "gloo hop unpinned (one usable core)")
    assert whats(record) == ["latency_unpinned"] and not (tmp_path / "workbench").exists()


def test_a_gpu_wait_nvidia_smi_cannot_tell_is_said(monkeypatch):
    monkeypatch.setattr(devices, "gpu_holders", lambda: None)
    with pytest.warns(FallbackWarning, match="without waiting for 1 dead ranks") as record:
        assert devices.wait_for_release([os.getpid() + 1], timeout=5) < 1.0
    assert whats(record) == ["gpu_wait_unknown"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        devices.wait_for_release([])  # no dead rank: nothing to wait for, nothing to say


# -- ranks' processes ---------------------------------------------------------------------------------------------
def test_a_cpu_clock_without_proc_tasks_says_so_once(monkeypatch):
    real = os.listdir

    def listdir(path="."):
        if str(path) == "/proc/self/task":
            raise FileNotFoundError(2, "No such file or directory")
        return real(path)

    monkeypatch.setattr(channel.os, "listdir", listdir)
    cpu = channel._CpuClock()
    with pytest.warns(FallbackWarning, match="transport threads count") as record:
        cpu(), cpu()
    assert whats(record) == ["rank_cpu_with_transport"]


def test_a_diffusion_cut_short_by_a_lost_member_is_said(monkeypatch):
    def lost(*args):
        raise CommError("a member is gone")

    monkeypatch.setattr(gossip, "diffusion", lost)
    trainer = SimpleNamespace(_flat=lambda: torch.zeros(3), comm=None, schedule=None, step=10,
                              trained_cycle=lambda: [1, 2])
    with pytest.warns(FallbackWarning, match="diffusion is None") as record:
        assert gossip.GossipTrainer._done_figures(trainer) == {}
    assert whats(record) == ["diffusion_unmeasured"]


def test_a_diffusion_without_a_trained_partner_cycle_follows_the_schedule_and_says_so(monkeypatch):
    replayed = []

    def measured(comm, schedule, vector, after_step, partners=None):
        replayed.append(partners)
        return {"after": 0.0}, vector

    monkeypatch.setattr(gossip, "diffusion", measured)
    trainer = SimpleNamespace(_flat=lambda: torch.zeros(3), _unflat=lambda v: None, comm=None, step=1,
                              schedule=gossip.GossipSchedule(4, 0), evaluate=lambda: {"test_acc": 0.5})
    trainer.exchanged = deque([(0, 1)])  # one step of a two-step cycle trained since the last membership change
    trainer.trained_cycle = lambda: gossip.GossipTrainer.trained_cycle(trainer)
    with pytest.warns(FallbackWarning, match="follow the schedule") as record:
        assert gossip.GossipTrainer._done_figures(trainer)["diffusion"]["test_acc"] == 0.5
    assert whats(record) == ["diffusion_from_schedule"] and replayed == [None]
    trainer.exchanged, trainer.step = deque([(2, 1), (3, 2), (4, 1)]), 5  # steps 2-3: the last complete cycle
    assert gossip.GossipTrainer.trained_cycle(trainer) == [1, 2]


def test_a_rank_that_takes_a_fallback_has_it_said_in_the_run():
    """A rank slowed from its first step has no unslowed step to throttle against: its process says so, the
    ``fallback`` message carries it to the supervisor, and the run records it as its own."""
    result = workbench.run(world_size=2, steps=4, hidden=[16], seed=0, faults=["slow:rank=1,step=0,factor=2"])
    said = [e for e in result.events if e["kind"] == "fallback"]
    assert result.completed and result.summary["fallbacks"] == ["throttle_no_baseline"]
    assert len(said) == 1 and said[0]["detail"].startswith("rank 1: slowed x2 before any step was measured")


def test_a_listener_that_raises_is_said_once():
    heard = []

    def broken(kind, payload):
        heard.append(kind)
        raise KeyError("no such column")

    result = workbench.start(workbench.RunConfig(world_size=2, steps=3, hidden=[16], seed=0), on_event=broken).wait()
    said = [e for e in result.events if e["kind"] == "fallback"]
    assert len(heard) > 1 and result.summary["fallbacks"] == ["listener_failed"] and len(said) == 1
    assert "broken raised KeyError: 'no such column'" in said[0]["detail"]


# -- sweeps and Slurm --------------------------------------------------------------------------------------------
def test_damaged_sweep_files_are_said(tmp_path):
    ids = fake_sweep(tmp_path)
    assert table.point_status(tmp_path / "no-such-point") is None  # never started: nothing to say
    (tmp_path / ids[0] / "point.json").write_text("{damaged")
    (tmp_path / "tracking.json").write_text("[not a record")
    with pytest.warns(FallbackWarning) as record:
        frame = table.aggregate(tmp_path)
    assert set(whats(record)) == {"point_status_damaged", "tracking_record_damaged"}
    assert frame.set_index("point").loc[ids[0], "status"] == "pending"  # run again by the next sweep
    (tmp_path / table.TABLE_FILE).write_bytes(b"not an HDF5 file")
    with pytest.warns(FallbackWarning) as record:
        assert len(table.load_sweep(tmp_path)) == len(ids)
    assert whats(record)[0] == "sweep_table_damaged" and "rebuilt from its points" in str(record[0].message)


def test_a_parameters_cell_that_is_not_plain_python_is_said(tmp_path):
    cell = {"id": "params", "cell_type": "code", "metadata": {"tags": ["parameters"]},
            "source": "%matplotlib inline\nsteps = 5\n", "outputs": [], "execution_count": None}
    notebook = tmp_path / "magic.ipynb"
    notebook.write_text(json.dumps({"cells": [cell], "nbformat": 4, "nbformat_minor": 5, "metadata": {
        "kernelspec": {"name": "python3", "language": "python", "display_name": "Python 3"},
        "language_info": {"name": "python"}}}))
    with pytest.warns(FallbackWarning, match="not plain Python") as record:
        assert notebook_parameters(notebook) == {"steps": "5"}  # papermill's reading: the default's source
    assert whats(record) == ["parameters_cell_not_python"]


def test_a_malformed_cpus_per_node_is_an_error():
    env = {"SLURM_JOB_NODELIST": "n[01-02]", "SLURM_TASKS_PER_NODE": "2(x2)", "SLURMD_NODENAME": "n01"}
    addresses = {"n01": "10.1.0.1", "n02": "10.1.0.2"}.get
    for cpus in ("4 cores", "4"):  # unreadable; one count for two nodes
        with pytest.raises(ConfigError, match="SLURM_JOB_CPUS_PER_NODE"):
            allocation_hosts(None, {**env, "SLURM_JOB_CPUS_PER_NODE": cpus}, addresses)
    assert allocation_hosts(None, env, addresses)[1]["launch"][-1] == "-wn02"  # not set: Slurm's default


def test_an_earlier_array_squeue_cannot_tell_about_is_an_error(tmp_path, monkeypatch):
    (tmp_path / slurm_run.JOB_FILE).write_text(json.dumps({"job": 77}))
    monkeypatch.setattr(slurm_run.slurm, "active_tasks", lambda job: None)  # squeue gave no answer
    with pytest.raises(SweepError, match="squeue did not answer whether it still runs"):
        slurm_run._refuse_if_running(tmp_path)
    monkeypatch.setattr(slurm_run.slurm, "active_tasks", lambda job: {})
    slurm_run._refuse_if_running(tmp_path)  # ended: the sweep goes on
