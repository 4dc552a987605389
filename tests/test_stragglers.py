"""Slow ranks and stragglers (docs/permanent-faults.md, "Slow ranks and stragglers"): ``slow:rank=R,factor=F``,
``run.slow`` and random slow-downs make a rank burn CPU in proportion to its own compute
(workbench/rank/throttle.py); the straggler detector (workbench/supervisor/stragglers.py) flags it, and with
``straggler_response="drop"`` it is recovered from like a failed rank. The detector on synthetic step times first,
then the throttle, then real runs."""

from __future__ import annotations

import queue
import statistics
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

import workbench
from workbench.base.errors import ConfigError
from workbench.config.run import FaultSpec, RandomFailures, RunConfig
from workbench.faults import events
from workbench.faults.slow import check_live_slow
from workbench.rank import throttle as throttle_module
from workbench.rank.throttle import Throttle
from workbench.results.run_result import RunResult
from workbench.supervisor.core import Supervisor
from workbench.supervisor.stragglers import Stragglers, find

ROOT = Path(__file__).resolve().parents[1]


def feed(detector, steps, time_of, gen=0, slow_of=lambda key, step: None, keys=range(4)):
    """Every member's step time for ``steps``; the (step, straggler) of each flag."""
    flags = []
    for step in steps:
        for key in keys:
            _, new = detector.step(key, key, gen, step, time_of(key, step), slow_of(key, step))
            flags += [(step, s) for s in new]
    return flags


# -- the detector ------------------------------------------------------------------------------------------------
def test_a_rank_three_times_slower_is_flagged_once_half_its_window_is_slow():
    detector = Stragglers(factor=1.5, window=10)
    flags = feed(detector, range(40), lambda key, step: 0.010 * (3 if key == 2 and step >= 10 else 1))
    (step, straggler), = flags  # once for the whole episode
    assert step == 14 and straggler.label == 2  # the window's median is half slow after 5 slow steps of 10
    assert straggler.own == pytest.approx(0.020) and straggler.others == pytest.approx(0.010)
    assert "rank 2 is a straggler at step 14: 20.00 ms per step against the others' median 10.00 ms (2.00x" \
        in straggler.detail(10)
    late = Stragglers(factor=2.5, window=10)  # a higher threshold: the median must be all slow
    assert [(s, x.label) for s, x in feed(late, range(40), lambda key, step: 0.010 * (
        3 if key == 2 and step >= 10 else 1))] == [(15, 2)]


def test_noise_is_not_a_straggler_and_the_threshold_decides():
    rng = np.random.default_rng(7)
    noise = rng.lognormal(0.0, 0.25, size=(2000, 4))  # ±25 % per step, heavier than the shared cores measured
    spikes = np.where(np.arange(2000) % 25 == 0, 5.0, 1.0)  # rank 0's evaluation steps
    assert feed(Stragglers(1.5, 10), range(2000), lambda key, step: 0.01 * noise[step, key]
                * (spikes[step] if key == 0 else 1.0)) == []
    steady = lambda key, step: 0.010 * (1.4 if key == 1 else 1.0)  # noqa: E731
    assert feed(Stragglers(1.5, 10), range(50), steady) == []
    assert [s.label for _, s in feed(Stragglers(1.3, 10), range(50), steady)] == [1]
    assert find({0: [1e-5] * 10, 1: [4e-5] * 10}, 1.5, 10) == []  # microseconds apart: the machine's noise


def test_a_new_generation_starts_a_new_window_and_a_rank_that_caught_up_may_be_flagged_again():
    detector = Stragglers(factor=1.5, window=5)
    assert [s for s, _ in feed(detector, range(10), lambda key, step: 0.03 if key == 3 else 0.01)] == [4]
    assert feed(detector, range(10, 14), lambda key, step: 0.03 if key == 3 else 0.01, gen=1, keys=range(3, 4)) \
        == []  # alone in its generation so far: nobody to compare with
    detector = Stragglers(factor=1.5, window=5)
    slow = lambda key, step: 0.03 if key == 1 and (step < 10 or step >= 20) else 0.01  # noqa: E731
    # at step 4 rank 1 reports before ranks 2 and 3 fill their windows: it is judged at its next report
    assert [(s, x.label) for s, x in feed(detector, range(30), slow)] == [(5, 1), (22, 1)]
    detector.forget(1)
    assert 1 not in detector.times and 1 not in detector.flagged
    stages = Stragglers(factor=1.5, window=5)  # a pipeline's stages differ by design: each among its replicas
    for step in range(10):
        for key in range(4):
            _, new = stages.step(key, key, 0, step, 0.01 * (1 + key // 2) * (3 if key == 3 and step >= 5 else 1),
                                 None, group=key // 2)
            assert not new or (step, [s.label for s in new]) == (7, [3])
    assert stages.flagged == {3}
    off = Stragglers(factor=1.5, window=5, enabled=False)
    assert feed(off, range(30), slow) == [] and len(off.table()["step"]) == 120  # off: no flags, the strip kept


def test_slow_downs_are_events_and_every_step_time_is_kept():
    detector = Stragglers(factor=1.5, window=5)
    seen = []
    for step in range(6):
        for key in range(2):
            slow = 3.0 if key == 1 and 2 <= step < 4 else None
            events, _ = detector.step(key, key + 10, 0, step, 0.01, slow)
            seen += [(step, kind, detail, fields) for kind, detail, fields in events]
    assert seen == [(2, "slow", "rank 11 runs 3x slower", {"factor": 3.0}),
                    (4, "slow_end", "rank 11 runs at full speed again", {"factor": 3.0})]
    table = detector.table()
    assert list(table) == ["step", "generation", "rank", "cpu_s", "slow"] and len(table["step"]) == 12
    assert table["slow"][5] == 3.0 and table["rank"][5] == 11


# -- the throttle ------------------------------------------------------------------------------------------------
def throttled_steps(throttle, compute):
    """20 steps of a rank (slow from step 10, factor 3), the step's own part by ``compute``: the median CPU time of
    a slowed step over an unslowed one's, on the CPU clock the throttle reads (the test may replace it)."""
    spent = []
    for step in range(20):
        began = throttle_module.cpu_time()
        throttle.begin(step)
        compute()  # the step's own compute, the same every step
        throttle.burn()
        throttle.burn()  # once per step: a second call burns nothing
        assert throttle.end() == (3.0 if step >= 10 else None)
        spent.append(throttle_module.cpu_time() - began)
    return statistics.median(spent[12:]) / statistics.median(spent[2:10])


def test_the_throttle_makes_a_step_take_factor_times_its_own_cpu(monkeypatch):
    def fresh():
        throttle = Throttle()
        throttle.plan([FaultSpec.parse("slow:rank=0,step=10,factor=3,until=20"), FaultSpec.parse("kill:rank=0,step=5")])
        return throttle

    assert [fresh().factor_at(s) for s in (9, 10, 19, 20)] == [1.0, 3.0, 3.0, 1.0]
    # on real CPU: the burn is CPU time, not a sleep (a sleep reads 0 on the thread's clock), and exactly the
    # target: each slowed step's burn, read on this thread's own CPU clock (which the host's load and speed do not
    # move, unlike a ratio of two halves' compute: 2.3 to 5.2 seen), is (3 - 1) x the median compute so far, give
    # or take one turn of its busy loop
    throttle = fresh()
    for step in range(20):
        throttle.begin(step)
        sum(i * i for i in range(60_000))  # the step's own compute
        target = 2.0 * statistics.median(throttle.computes) if step >= 10 else 0.0
        before = time.thread_time()
        throttle.burn()
        spent = time.thread_time() - before
        assert target <= spent <= target + 2e-3, (step, spent, target)
        throttle.end()
    # on a CPU clock that moves only when the rank computes: exactly 2 more of its own steps' compute per step
    clock = [0.0]

    def tick():
        clock[0] += 1e-5  # each look at the thread's clock costs a tick, so the burn loop ends
        return clock[0]

    monkeypatch.setattr(throttle_module, "cpu_time", lambda: clock[0])
    monkeypatch.setattr(throttle_module.time, "thread_time", tick)
    ratio = throttled_steps(fresh(), lambda: clock.__setitem__(0, clock[0] + 0.004))
    assert 2.99 <= ratio <= 3.02, ratio  # a factor of 2 or no throttle fails, whatever the machine's load
    throttle = fresh()
    throttle.set_live(2.0, 0.0)  # a live slow-down whose time is up: full speed
    assert throttle.factor_at(30) == 1.0 and throttle.live == (1.0, None)


def test_live_and_timed_slow_downs_reach_the_rank_as_throttle_messages():
    sent = []
    supervisor = Supervisor.__new__(Supervisor)  # no run: only the parts that a slow-down touches
    supervisor.commands = queue.Queue()
    supervisor.membership = SimpleNamespace(members=[0, 1])
    supervisor.control = SimpleNamespace(send=lambda w, m: sent.append((w.label, m)))
    supervisor.slow_sources = {}
    supervisor.recorder = SimpleNamespace(event=lambda kind, step, detail, rank, **fields: sent.append(
        (events.name(kind), detail, fields)))
    supervisor.worker = lambda label: SimpleNamespace(proc=object(), conn=None, label=label) if label in (0, 1) \
        else None
    supervisor._inject("slow", 1, "planned", fault=FaultSpec.parse("slow:rank=1,time=1.5,factor=3,until=4"))
    supervisor.commands.put(("slow", (0, 4.0, None)))
    supervisor.commands.put(("slow", (7, 2.0, None)))
    supervisor._run_commands()
    assert sent == [(1, {"type": "throttle", "factor": 3.0, "seconds": 2.5}),
                    (0, {"type": "throttle", "factor": 4.0, "seconds": None}),
                    ("fault_skipped", "slow of rank 7: not alive", {"fault": "slow", "source": "live",
                                                                    "reason": "not_alive"})]
    assert supervisor.slow_sources == {1: "planned", 0: "live"}  # what their slow events will say


# -- bad input -----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("values, message", [
    ({"faults": ["random:mtbf_steps=30,factor=3"]}, "random: factor= and duration= apply to kind=slow only"),
    ({"faults": ["random:mtbf_steps=30,kind=slow,factor=1"]}, "random: factor=1.0 must be a number > 1"),
    ({"faults": ["random:mtbf_steps=30,kind=slower"]}, "random: kind='slower' is not known: allowed kill, slow"),
    ({"faults": ["random:mtbf_steps=30,kind=slow,duration=0"]}, "duration=0 must be an integer >= 1"),
    ({"faults": ["slow:rank=1,step=5"]}, "slow needs factor=F, a number > 1"),
    ({"straggler_response": "kick"}, "straggler_response: 'kick' is not known: allowed off, flag, drop"),
    ({"straggler_factor": 1.0}, "straggler_factor: 1.0 must be a number > 1"),
    ({"straggler_window": 2}, "straggler_window: 2 is out of range: allowed integers 3..10000"),
    ({"strategy": "torchft", "straggler_response": "drop"}, "drop is ours: 'torchft' runs the peer system"),
    ({"strategy": "torchft", "faults": ["slow:rank=1,step=5,factor=2"]}, "slow faults are ours"),
])
def test_bad_slow_settings_are_one_line_errors(values, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(".", r"\.")) as caught:
        RunConfig.from_dict(values)
    assert "\n" not in str(caught.value)


def test_random_slow_downs_are_drawn_up_front_and_read_back():
    config = RunConfig(steps=100, faults=["random:mtbf_steps=30,kind=slow,seed=2,factor=4,duration=10"])
    process = config.faults[0]
    assert isinstance(process, RandomFailures) and str(process).endswith(",kind=slow,factor=4,duration=10")
    assert RandomFailures.parse(str(process)) == process and config.random_failures == []  # no kills
    drawn = config.step_faults
    assert drawn == RunConfig(steps=100, faults=[str(process)]).step_faults  # the same seed, the same slow-downs
    assert drawn and all(f.kind == "slow" and f.factor == 4 and 0 <= f.rank < 4 for f in drawn)
    assert all(f.until == f.step + 10 or (f.until is None and f.step + 10 >= 100) for f in drawn)
    with pytest.raises(ConfigError, match=r"factor: 0\.5 must be a number >= 1"):
        check_live_slow(0.5, None)
    with pytest.raises(ConfigError, match="seconds: -1 must be a number of seconds > 0"):
        check_live_slow(2, -1)
    assert check_live_slow(1, 2) == (1.0, 2.0)


# -- real runs -----------------------------------------------------------------------------------------------------
@pytest.mark.usefixtures("no_leaks")
def test_a_slow_rank_is_flagged_and_dropped_and_the_step_time_returns(tmp_path):
    """The acceptance line. Factor 3 on rank 2 of 4 from step 10, drop under shrink: flagged within 20 steps.
    The fair comparison after the drop is a failure-free run at the world size the drop leaves (3: each rank's
    share of the global batch is the same), over the same steps, on the rank-time clock (each step its slowest
    rank's CPU); both runs train side by side, so the shared cores load them alike.

    The detector judges on the rank clock (each rank's own CPU per step), which time-sharing does not move; but a
    neighbour that competes for memory bandwidth and caches does raise a healthy rank's CPU for the same work. A
    memory-copy hog beside a failure-free 4-rank run of this model flagged a healthy rank once (rank 0: 8.1 ms
    against 5.39 ms, 1.50x over 10 steps; CI once flagged a second rank here); over 20 steps the worst healthy
    ratio in the same runs was 1.34x. So the runs take the detector's own remedy for a noisy host, a window of
    20 steps (its median lets more short-lived slow steps pass); the planned 3x still crosses 1.5x once 11 of 20
    steps are slow, at step ~20: within the same 20 steps as before, every bound unchanged."""
    kw = dict(steps=60, eval_interval=60, strategy="shrink", hidden=[512, 512], batch_size=128, straggler_window=20)
    baseline = workbench.start(world_size=3, **kw)
    slow = workbench.start(world_size=4, out=tmp_path, straggler_response="drop",
                           faults=["slow:rank=2,step=10,factor=3"], **kw)
    base, result = baseline.wait(300), slow.wait(300)
    assert base.completed and result.completed, result.summary["reason"]
    (flag,) = [e for e in result.events if e["kind"] == "straggler"]
    assert flag["rank"] == 2 and 10 <= flag["step"] < 10 + 20 and flag["detail"].endswith("; dropped")
    (failure,) = result.failures
    assert failure["rank"] == 2 and failure["cause"].startswith("was dropped as a straggler")
    assert failure["world_size_after"] == 3 and result.summary["stragglers"] == 1 and base.summary["stragglers"] == 0
    # the throttle on the rank's own CPU: its slowed steps against its own before (4 or more steps each side)
    steps = result.rank_steps
    # exact, from the ranks' own reports: rank 2's every step from 10 ran at factor 3, no other step was slowed
    slowed = {(s, r) for s, r, f in zip(steps["step"], steps["rank"], steps["slow"]) if f != 1.0}
    assert {f for s, r, f in zip(steps["step"], steps["rank"], steps["slow"]) if f != 1.0} == {3.0}
    assert slowed == {(s, 2) for s, r in zip(steps["step"], steps["rank"]) if r == 2 and s >= 10}
    own = {s: t for s, r, t in zip(steps["step"], steps["rank"], steps["cpu_s"]) if r == 2}
    factor = statistics.median(own[s] for s in range(10, flag["step"] + 1)) / statistics.median(
        own[s] for s in range(2, 10))
    assert 2.4 <= factor <= 3.6, factor  # 3 within 20 %: a handful of steps on loaded shared cores
    settled = flag["step"] + 5  # the steps after the drop (the flag's event): the world of 3 settled
    after = statistics.median(r["rank_step_time"] for r in result.metrics if r["step"] >= settled)
    reference = statistics.median(r["rank_step_time"] for r in base.metrics if r["step"] >= settled)
    print(f"flagged at step {flag['step']}, throttle {factor:.2f}x, after the drop {after * 1e3:.2f} ms against "
          f"{reference * 1e3:.2f} ms failure-free ({100 * (after / reference - 1):+.1f} %)")  # pytest -s shows it
    # back to the failure-free step within a quarter (+17 % once beside the slow tier's other worker); a straggler
    # still in the world, or one not dropped, keeps the step 2-3x slower
    assert abs(after / reference - 1) <= 0.25, (after, reference)
    assert all(r["world_size"] == 3 for r in result.metrics if r["step"] >= settled)
    assert RunResult.load(tmp_path).rank_steps == steps  # kept in result.h5


@pytest.mark.usefixtures("no_leaks")
def test_the_lab_slows_a_rank_down_and_its_strip_shows_it():
    from workbench.launch.lab import Lab

    lab = Lab(world_size=2, steps=100_000, strategy="shrink", hidden=[256, 256])
    try:
        lab.start_button.click()
        wait_for(lambda: len(lab.strip.data[0].x or ()) > 5)
        assert lab.rank_buttons.children[1].children[-1].description == "Slow 1"
        lab.slow_factor.value = 4.0
        lab.rank_buttons.children[1].children[-1].click()  # "Slow 1": run.slow(1, factor=4)
        trace = next(t for t in lab.figure.data if t.name == "straggler")
        wait_for(lambda: len(trace.x) == 1)
        assert "rank 1 is a straggler" in trace.hovertext[0]
        heat = lab.strip.data[0]  # redrawn after the figure, so it may be one refresh behind the flag

        def bright() -> bool:  # rank 1's row is the bright one: 4x over the mean of two is ~1.6
            return list(heat.y) == ["rank 0", "rank 1"] and max(v for v in heat.z[1][-5:] if v is not None) > 1.4

        wait_for(bright)
        with pytest.raises(ConfigError, match="no rank 5 in this run"):
            lab.run.slow(5)
    finally:
        lab.stop_button.click()
    wait_for(lambda: lab.run.result is not None)
    assert [e["detail"] for e in lab.run.result.events if e["kind"] == "slow"] == ["rank 1 runs 4x slower"]
    lab.close()


@pytest.mark.usefixtures("no_leaks")
def test_a_sweep_over_a_slow_fault_reports_the_per_rank_strip(tmp_path):
    from workbench.launch.sweeps.report import report
    from workbench.launch.sweeps.run import load_sweep, sweep

    out = tmp_path / "slow"
    frame = sweep(ROOT / "notebooks" / "quickstart.ipynb", {"world_size": [2], "steps": [40], "strategy": ["shrink"],
                                                             "fault": ["slow:rank=1,step=5,factor=3"]},
                  out=out, jobs=1, progress=False)
    assert list(frame.status) == ["completed"], frame.get("error")
    table = load_sweep(out)
    assert table.stragglers.iloc[0] == 1 and table.n_failures.iloc[0] == 0  # flagged, tolerated
    assert set(RunResult.load(table.path.iloc[0]).rank_steps["rank"]) == {0, 1}  # what the strip draws
    page = report(out).read_text()
    assert "Per-rank step times" in page


def wait_for(predicate, timeout=120.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.05)
