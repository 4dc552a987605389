"""The rank-time clock: column names and defaults, the supervisor's bookkeeping fed with planted CPU stamps, the
rank's CPU clock leaving gloo's transport thread out, and both clocks in a real run's result."""

from __future__ import annotations

import ctypes
import json
import math
import os
import socket
import threading
import time

import pandas as pd
import pytest

import workbench
from workbench.base import machine
from workbench.base.fallbacks import FallbackWarning
from workbench.launch.cli import main
from workbench.rank.channel import _CpuClock
from workbench.results import clock
from workbench.supervisor.recorder import Failure


def test_columns_labels_and_defaults():
    assert clock.column("train_s", "wall") == "train_s" and clock.column("train_s", "rank") == "rank_train_s"
    with pytest.raises(ValueError, match="clock must be one of wall, rank"):
        clock.column("train_s", "cpu")
    assert clock.label("runtime overhead (%)", "rank") == "runtime overhead (%, rank-time clock)"
    assert clock.label("seconds", "wall") == "seconds (wall clock)"
    assert clock.default({"oversubscribed": True}) == "rank"
    assert clock.default({"oversubscribed": False}, {"steal_pct": 5.0}) == "rank"
    assert clock.default({"oversubscribed": False}, {"steal_pct": 0.5}) == "wall"
    frame = pd.DataFrame({"oversubscribed": [False, None], "prov.steal_pct": [0.1, None]})
    assert clock.frame_default(frame) == "wall"
    frame.loc[1, "oversubscribed"] = True
    assert clock.frame_default(frame) == "rank" and clock.resolve("wall", frame) == "wall"
    assert machine.steal_pct((10, 1000), (30, 2000)) == 2.0 and machine.steal_pct(None, (1, 2)) is None


def test_speed_variables_are_checked(monkeypatch):
    monkeypatch.setenv(machine.NET_MIB_VAR, "-3")
    with pytest.raises(ValueError, match=r"\$WORKBENCH_NET_MIBS='-3': a positive number is allowed"):
        machine.check_given()
    monkeypatch.setenv(machine.NET_MIB_VAR, "250")
    assert machine.net_mibs() == (250.0, machine.NET_MIB_VAR)


def rows(gen: int, steps: range) -> list[dict]:
    return [{"step": s, "generation": gen, "time": 1.0 + s, "step_time": 1.0} for s in steps]


def steady(rt: clock.RankTime, steps: int) -> list[dict]:
    """Ranks 0 and 1 of generation 0 spend 10 ms of CPU on each of ``steps`` steps; their rows."""
    for spawn in (0, 1):
        rt.last[spawn] = 0.0
    table = rows(0, range(steps))
    for row in table:
        for spawn in (0, 1):
            rt.on_step(spawn, {"gen": 0, "step": row["step"], "cpu": 0.01 * (row["step"] + 1)})
        rt.on_row(0, row)
    return table


def test_steps_take_the_slowest_rank_over_a_window(monkeypatch):
    monkeypatch.setenv(machine.NET_MIB_VAR, "1")  # 1 MiB/s: a rank's bytes are visible in its step
    monkeypatch.setenv(machine.LATENCY_VAR, "1000")  # 1 ms a message
    rt = clock.RankTime()
    for spawn in (0, 1):
        rt.on_ready(spawn, {"cpu": 0.5})
        rt.last[spawn] = 1.0  # joined generation 0 at CPU 1.0
    table = rows(0, range(10))
    cpu = {0: 1.0, 1: 1.0}
    for row in table:
        for spawn, spent in ((0, 0.010), (1, 0.030 if row["step"] % 2 else 0.0)):  # rank 1's CPU lands unevenly
            cpu[spawn] += spent
            rt.on_step(spawn, {"gen": 0, "step": row["step"], "cpu": cpu[spawn], "sent": 2**20 // 100, "msgs": 2})
        rt.on_row(0, row)
    assert table[1]["rank_step_time"] == pytest.approx(0.030)  # live: the slowest stamp of the step
    total = (rt.finish(), rt.timeline(table))[1]
    # rank 1 spent 5 x 30 ms and rank 0 10 x 10 ms; each step also sends 10 ms of bytes and 2 ms of messages
    assert total == pytest.approx(0.150 + 10 * 0.012, abs=1e-4)
    assert sum(r["rank_step_time"] for r in table) == pytest.approx(total)
    assert table[-1]["rank_time"] == pytest.approx(total)


def test_a_recovery_costs_detection_or_abandoned_work_start_and_join(monkeypatch):
    monkeypatch.setenv(machine.NET_MIB_VAR, "1")
    monkeypatch.setenv(machine.LATENCY_VAR, "1")
    rt = clock.RankTime()
    before = steady(rt, 3)
    fault = time.time()
    rt.on_ready(2, {"cpu": 0.2})  # a replacement started after the fault: 0.2 s of start-up CPU
    # survivor 0 abandoned 0.05 s of work, then joined in 0.03 s; the replacement joined in 0.04 s, 1 MiB received
    rt.on_joined(0, {"gen": 1, "cpu": 0.03 + 0.05 + 0.03, "sync_cpu": 0.03}, wait=0.02, since=fault)
    rt.on_joined(2, {"gen": 1, "cpu": 0.2 + 0.04, "sync_cpu": 0.04, "bytes_in": 2**20}, wait=0.02, since=fault)
    after = rows(1, range(2, 4))
    for row in after:
        for spawn, base in ((0, 0.11), (2, 0.24)):
            rt.on_step(spawn, {"gen": 1, "step": row["step"], "cpu": base + 0.01 * (row["step"] - 1)})
        rt.on_row(1, row)
    rt.finish()
    total = rt.timeline(before + after)
    change = 0.05 + 0.2 + 0.04 + 1.0  # max(detection 0.02, abandoned 0.05) + start + join + 1 MiB at 1 MiB/s
    assert rt.cost(1) == pytest.approx(change)
    assert total == pytest.approx(0.03 + change + 0.02)
    record = Failure(rank=1, step=3, cause="died", fault_time=fault, detect_time=fault + 0.02, committed=3,
                     lost_share=0, recovery_gen=1, replacement=2)
    wall = {"detection_s": 0.02, "resume_s": 2.0, "settle_s": 1.5, "join_s": 0.5, "regrow_s": None}
    figures = rt.failure(wall, record, before + after)
    assert figures["rank_detection_s"] == 0.02 and figures["rank_settle_s"] == pytest.approx(change, abs=1e-4)
    assert figures["rank_join_s"] == pytest.approx(0.04) and figures["rank_regrow_s"] is None
    assert figures["rank_resume_s"] == pytest.approx(change + 0.01, abs=1e-4)


def test_a_killed_rank_is_detected_after_its_teardown_cpu_and_a_timeout_after_its_wall_wait(monkeypatch):
    monkeypatch.setenv(machine.NET_MIB_VAR, "1")
    monkeypatch.setenv(machine.LATENCY_VAR, "1000")  # 1 ms a message
    proc = type("Reaped", (), {"cpu_s": 2.5})()  # the dead rank's whole CPU, from its template's wait4
    kill = {"kind": "kill", "step": 3, "t": 0.0, "process_cpu": 2.47}
    assert clock.teardown_s(proc, kill) == pytest.approx(0.03)
    assert clock.teardown_s(proc, {**kill, "kind": "stall"}) is None  # found by the progress timeout: by design
    assert clock.teardown_s(object(), kill) is None  # started afresh: no reaped usage, the wall detection stays
    fault = time.time()
    # the supervisor saw the death 0.4 s after it on shared cores; the rank's own teardown was 30 ms of CPU
    killed = Failure(rank=1, step=3, cause="died", fault_time=fault, detect_time=fault + 0.4, committed=3,
                     lost_share=0, recovery_gen=1, teardown=0.03)
    froze = Failure(rank=2, step=3, cause="froze", fault_time=fault, detect_time=fault + 0.25, committed=3,
                    lost_share=0, recovery_gen=1)
    assert clock.detection([killed]) == (0.03, True)
    assert clock.detection([froze]) == (0.25, False) and clock.detection([]) == (0.0, False)
    rt = clock.RankTime()
    before = steady(rt, 3)
    wait, hop = clock.detection([killed])
    rt.on_joined(0, {"gen": 1, "cpu": 0.03 + 0.01, "sync_cpu": 0.01}, wait, fault, hop)
    rt.finish()
    assert rt.cost(1) == pytest.approx(0.03 + 0.001 + 0.01)  # teardown + one message + the join
    wall = {"detection_s": 0.4, "resume_s": 0.6, "settle_s": 0.5, "join_s": 0.1, "regrow_s": None}
    assert rt.failure(wall, killed, before)["rank_detection_s"] == pytest.approx(0.031)
    assert rt.failure(wall, froze, before)["rank_detection_s"] == 0.4  # its wall figure


def test_a_run_charges_a_killed_rank_its_own_teardown(monkeypatch):
    monkeypatch.setenv(machine.NET_MIB_VAR, "1000")
    monkeypatch.setenv(machine.LATENCY_VAR, "100000")  # 0.1 s a message: the detection on the rank clock is past it
    result = workbench.run(world_size=2, steps=20, strategy="shrink", faults=["kill:rank=1,step=10"], seed=0)
    failure = result.failures[0]
    teardown = failure["rank_detection_s"] - 0.1  # not the wall detection (tens of ms): that would be negative
    # the kernel tearing the process down is CPU of its own (tens of ms for a rank), never more than the wall
    # from the fault to its sighting with a core to spare
    assert 0 < teardown <= 2 * failure["detection_s"]
    assert failure["rank_settle_s"] >= failure["rank_detection_s"]


def test_an_unstamped_generation_keeps_its_wall_gap():
    rt = clock.RankTime()
    rt.on_joined(5, {"gen": 1}, wait=0.0, since=None)  # a peer's rank: no CPU stamp
    later = rows(1, range(2, 4))
    for row in later:
        row["time"] += 1.0  # the change took 1 s of wall time
    table = rows(0, range(2)) + later
    with pytest.warns(FallbackWarning, match="no CPU stamp") as said:  # said: rank_time_wall
        total = rt.timeline(table)
    assert [w.message.what for w in said] == ["rank_time_wall"]
    # no stamps at all: every step at its wall time, the change at its wall gap
    assert total == pytest.approx(4.0 + 1.0)


def test_the_cpu_clock_leaves_the_transport_thread_out():
    cpu_time = _CpuClock()
    libc = ctypes.CDLL(None)
    done, release = threading.Event(), threading.Event()

    def transport() -> None:  # lives as long as the rank, as gloo's does
        libc.prctl(15, _CpuClock.TRANSPORT.encode(), 0, 0, 0)  # PR_SET_NAME, as gloo names its thread
        end = time.thread_time() + 0.3
        while time.thread_time() < end:
            pass
        done.set()
        release.wait(10)

    before, process_before = cpu_time(), time.process_time()
    thread = threading.Thread(target=transport)
    thread.start()
    assert done.wait(10)
    spent, process_spent = cpu_time() - before, time.process_time() - process_before
    release.set()
    thread.join(10)
    assert process_spent >= 0.3 and spent < 0.1  # the 0.3 s the transport burned is not the rank's


def test_a_run_has_both_clocks():
    result = workbench.run(world_size=2, steps=30, strategy="shrink", faults=["kill:rank=1,step=15"], seed=0)
    baseline = workbench.run(world_size=2, steps=30, seed=0)
    result.set_baseline(baseline)
    s = result.summary
    assert result.completed and s["rank_train_s"] > 0 and s["clock"] in clock.CLOCKS
    assert s["oversubscribed"] == (2 > machine.usable_cores()) and s["world_changed"] is True
    assert math.isfinite(s["rank_overhead_pct"]) and s["net_mibs"] > 0 and s["latency_us"] > 0
    steps = [r["rank_step_time"] for r in result.metrics]
    assert all(math.isfinite(v) and v > 0 for v in steps)
    assert result.metrics[-1]["rank_time"] == pytest.approx(s["rank_train_s"], abs=2e-3)
    failure = result.failures[0]
    for name in clock.TIME_FIGURES:
        assert clock.PREFIX + name in failure
    assert failure["rank_settle_s"] >= failure["rank_detection_s"] > 0
    assert "rank_time_wall" not in s["fallbacks"]  # every step and the generation change measured
    assert result.provenance["usable_cores"] == machine.usable_cores() and "steal_pct" in result.provenance


def test_a_pipeline_step_is_stretched_by_its_bubble():
    rt = clock.RankTime(bubble=(4 + 2 - 1) / 4)  # 4 micro-batches through 2 stages
    table = steady(rt, 4)
    assert rt.timeline(table) == pytest.approx(0.04 * 1.25)


@pytest.mark.parametrize("parallelism", ["pipeline", "gossip"])
def test_every_mode_reports_rank_time(parallelism):
    result = workbench.run(world_size=2, steps=12, parallelism=parallelism, seed=0)
    assert result.completed and result.summary["rank_train_s"] > 0
    assert all(math.isfinite(r["rank_step_time"]) and r["rank_step_time"] > 0 for r in result.metrics)
    assert "rank_time_wall" not in result.summary["fallbacks"]  # every rank stamped its CPU time


def test_speeds_are_measured_once_per_machine(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    calls = []

    def measure() -> float:
        calls.append(1)
        return 123.0

    assert machine._speed("net", machine.NET_MIB_VAR, measure) == (123.0, "measured now")
    assert machine._speed("net", machine.NET_MIB_VAR, measure) == (123.0, "cached") and len(calls) == 1


def test_a_damaged_speed_cache_is_said_and_kept_aside(tmp_path, monkeypatch):
    """No run in progress: a FallbackWarning; the damaged file (other hosts' figures) is moved aside, not lost."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    cache = tmp_path / "workbench" / "speeds.json"
    cache.parent.mkdir()
    cache.write_text('{"other-host": {"net": 9')  # cut short
    with pytest.warns(FallbackWarning, match="speeds.json is damaged") as said:
        assert machine._speed("net", machine.NET_MIB_VAR, lambda: 123.0) == (123.0, "measured now")
    assert [w.message.what for w in said] == ["speed_cache_damaged"]
    assert (tmp_path / "workbench" / "speeds.json.damaged").read_text() == '{"other-host": {"net": 9'
    assert json.loads(cache.read_text()) == {socket.gethostname(): {"net": 123.0}}


def test_an_unwritable_speed_cache_is_said_at_each_measurement(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "file"))
    (tmp_path / "file").write_text("")  # its "workbench" folder cannot be made: a read-only home does the same
    for _ in range(2):
        with pytest.warns(FallbackWarning, match=r"cannot write .*: the net speed \(123\) was measured now") as said:
            assert machine._speed("net", machine.NET_MIB_VAR, lambda: 123.0) == (123.0, "measured now")
        assert [w.message.what for w in said] == ["speed_cache_unwritable"]


def test_a_latency_measured_by_echo_is_said_in_its_source_and_not_cached(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv(machine.LATENCY_VAR, raising=False)
    monkeypatch.setattr(machine, "_HOPS", "import sys; sys.exit(3)")  # gloo's processes give no figure
    with pytest.warns(FallbackWarning, match="gloo hop failed") as said:
        value, source = machine.latency_us()
    assert value > 0 and source == "echo (gloo hop failed: no figure from its processes, exit codes [3, 3])"
    assert [w.message.what for w in said] == ["latency_echo"] and not (tmp_path / "workbench").exists()


def test_a_run_lists_its_fallbacks_and_speed_sources(monkeypatch, tmp_path, capsys):
    """A fallback taken while a run goes on is its ``fallback`` event, listed in its summary; none taken: []."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "file"))
    (tmp_path / "file").write_text("")
    for variable in (machine.NET_MIB_VAR, machine.LATENCY_VAR):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv(machine.DISK_MIB_VAR, "500")  # a checkpoint's disk figure, if learnt, is given
    monkeypatch.setattr(machine, "_measure_net", lambda: 321.0)
    monkeypatch.setattr(machine, "_measure_latency", lambda: 12.0)
    code = main(["run", "--world-size", "2", "--steps", "3", "--hidden", "16", "--out", str(tmp_path / "run"),
                 "--json"])
    out, err = capsys.readouterr()
    summary = json.loads(out.splitlines()[-1])
    assert code == 0 and summary["fallbacks"] == ["speed_cache_unwritable"]
    assert [line.split(" (")[0] for line in err.splitlines()] == [  # the net, the latency: stderr, as warnings
        f"workbench: warning: cannot write {tmp_path}/file/workbench/speeds.json"] * 2
    said = [e for e in workbench.RunResult.load(tmp_path / "run").events if e["kind"] == "fallback"]
    assert {e["what"] for e in said} == {"speed_cache_unwritable"} and len(said) == 2
    assert {**summary["speed_sources"], "disk_mibs": None} == {
        "net_mibs": "measured now", "latency_us": "measured now", "disk_mibs": None}
    monkeypatch.setenv(machine.NET_MIB_VAR, "250")
    monkeypatch.setenv(machine.LATENCY_VAR, "30")
    given = workbench.run(world_size=2, steps=3, hidden=[16], seed=0)
    assert given.summary["fallbacks"] == [] and not [e for e in given.events if e["kind"] == "fallback"]
    assert {**given.summary["speed_sources"], "disk_mibs": None} == {
        "net_mibs": machine.NET_MIB_VAR, "latency_us": machine.LATENCY_VAR, "disk_mibs": None}


def test_the_latency_is_a_gloo_hop_and_its_processes_are_gone_after_measuring():
    """The latency charged per message is half a one-float gloo allreduce between two processes: more than the
    bare loopback echo (the transport threads and the waiting thread's wake-up are in it); neither measurement
    leaves a process behind."""
    from leaks import all_processes, descendants

    before = descendants(os.getpid(), all_processes())  # this process's rank template, if it has one
    hop, echo = machine._measure_latency(rounds=50), machine._measure_echo(rounds=50)
    assert hop > echo > 0, (hop, echo)
    assert descendants(os.getpid(), all_processes()) <= before
