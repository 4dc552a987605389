"""Stalls: a rank alive (its heartbeat goes on) that commits no step — ``stall:rank=R,step=S`` blocks its training
thread — is found by the progress watchdog (workbench/supervisor/watchdog.py), killed, and recovered from like a
death; the watchdog alone, then real runs under shrink, rollback and reinit."""

from __future__ import annotations

import re
import time

import pytest

import workbench
from workbench.base.errors import ConfigError
from workbench.config.run import RunConfig
from workbench.supervisor.watchdog import FIRST_STEP_S, FLOOR_S, STALE_S, Progress, Watchdog, stalled, timeout

# the watchdog's floor, given: the lowest timeout it takes on its own (below it a loaded machine's hiccup would be a
# stall), so detection is bounded below by the limit and otherwise told by the events, not by a wall-time ceiling
TIMEOUT = FLOOR_S


def test_nobody_is_stalled_while_a_member_commits_within_the_limit():
    members = {0: Progress(9.0, waiting=True, commits=3), 1: Progress(5.0, waiting=False, commits=3)}
    assert stalled(members, now=10.0, limit=2.0) == []  # member 0 committed 1 s ago
    assert stalled(members, now=11.5, limit=2.0) == [1]  # the one busy in its own code while 0 waits


def test_when_every_member_waits_the_one_behind_in_collectives_is_named():
    members = {0: Progress(0.0, waiting=True, ops=41, commits=1), 1: Progress(0.0, waiting=True, ops=40, commits=1),
               2: Progress(0.0, waiting=True, ops=41, commits=1)}
    assert stalled(members, now=10.0, limit=2.0) == [1]
    members[1].ops = 41  # all in the same collective: every one of them
    assert stalled(members, now=10.0, limit=2.0) == [0, 1, 2]
    members[2].waiting = None  # a heartbeat that says nothing (a peer's rank): no verdict
    assert stalled(members, now=10.0, limit=2.0) == []


def test_the_default_limit_follows_the_slowest_gap_and_never_goes_under_the_floor():
    assert timeout(None, 2.0, 0.01) == FLOOR_S and timeout(None, 6.0, 0.01) == 6.0
    assert timeout(None, 2.0, 0.5) == 10.0 and timeout(0.7, 2.0, 0.5) == 0.7
    dog = Watchdog(None, 2.0)
    dog.joined(7, gen=1, now=0.0)
    for t in (1.0, 1.2, 1.7, 1.8):  # the first commit's gap (the join) is left out
        dog.committed(7, gen=1, now=t)
    assert dog.slowest_gap == pytest.approx(0.5) and dog.limit == pytest.approx(10.0)
    assert dog.check([7, 8], gen=1, now=30.0) == []  # member 8 has not joined generation 1 yet
    dog.joined(8, gen=1, now=1.8)
    dog.committed(8, gen=1, now=1.8)
    for now in (11.0, 12.0):
        dog.heartbeat(7, {"waiting": False, "ops": 3}, now=now)
        dog.heartbeat(8, {"waiting": True, "ops": 3}, now=now)
    assert dog.check([7, 8], gen=1, now=11.0) == []
    assert dog.check([7, 8], gen=1, now=12.0) == [(7, pytest.approx(10.2))]
    assert dog.check([7, 8], gen=1, now=12.0 + STALE_S + 0.1) == []  # heartbeats gone stale: a freeze, not ours


def test_a_generations_first_step_is_given_longer():
    members = {0: Progress(0.0, waiting=False), 1: Progress(0.0, waiting=True)}  # no commit yet
    assert stalled(members, now=FIRST_STEP_S - 1, limit=2.0) == []
    assert stalled(members, now=FIRST_STEP_S + 1, limit=2.0) == [0]


def test_a_stall_fault_is_ours_alone():
    assert str(RunConfig(faults=["stall:rank=1,step=5"]).faults[0]) == "stall:rank=1,step=5"
    with pytest.raises(ConfigError, match="stall faults is ours and does not apply"):
        RunConfig(strategy="torchrun", faults=["stall:rank=1,step=5"])
    with pytest.raises(ConfigError, match="progress_timeout: 0 must be a number > 0"):
        RunConfig(progress_timeout=0)


@pytest.mark.usefixtures("no_leaks")
@pytest.mark.parametrize("strategy", ["shrink", "rollback", "reinit"])
def test_a_stalled_rank_is_found_after_the_timeout_and_the_run_completes(strategy, tmp_path):
    result = workbench.run(world_size=4, steps=160, eval_interval=160, strategy=strategy, out=tmp_path,
                           progress_timeout=TIMEOUT, faults=["stall:rank=2,step=80"])
    assert result.completed, result.summary["reason"]
    (failure,) = result.failures
    assert failure["rank"] == 2 and failure["cause"] == f"stalled (alive, but no step committed for {TIMEOUT:g} s)"
    assert failure["detection_s"] >= TIMEOUT and failure["step"] == 80  # not before the limit; at the stalled step
    assert_no_step_between_the_stall_and_its_failure(result, 2)
    assert failure["world_size_after"] == (4 if strategy == "reinit" else 3)
    assert result.summary["replicas_identical"] and result.summary["steps_completed"] == 160


def assert_no_step_between_the_stall_and_its_failure(result: workbench.RunResult, rank: int) -> None:
    """The watchdog's verdict told by the events: the stall, then its failure at the very step it stalled in (no
    step was committed meanwhile: the others waited for the stalled rank), then the recovery."""
    found = [e for e in result.events if e["kind"] in ("stall", "failure", "recovered")]
    assert [(e["kind"], e["rank"]) for e in found] == [("stall", rank), ("failure", rank), ("recovered", -1)], found
    assert found[0]["step"] == found[1]["step"] == result.failures[0]["step"]


@pytest.mark.usefixtures("no_leaks")
def test_a_live_stall_is_found_by_the_default_timeout(tmp_path):
    run = workbench.start(world_size=3, steps=100_000, eval_interval=100_000, strategy="shrink", out=tmp_path)
    try:
        deadline = time.monotonic() + 60
        while len(run.metrics) < 30:
            assert time.monotonic() < deadline, "the run did not train"
            time.sleep(0.02)
        run.stall(1)
        while not any(e["kind"] == "recovered" for e in list(run.events)):
            assert time.monotonic() < deadline + 30, "the stall was not found"
            time.sleep(0.05)
    finally:
        run.stop()
        result = run.wait(timeout=60)
    (failure,) = result.failures
    limit = float(re.search(r"for ([\d.]+) s", failure["cause"]).group(1))
    assert failure["rank"] == 1 and limit >= FLOOR_S and failure["detection_s"] >= limit
    assert_no_step_between_the_stall_and_its_failure(result, 1)
    assert result.summary["world_size_final"] == 2
