"""Membership changes at a step boundary: resizing on request and preemption with notice (docs/permanent-faults.md,
"Preemption with notice" and "Resizing on request")."""

import os
import signal
import time

import pytest

import workbench
from workbench.base import checkpoint
from workbench.supervisor.membership import Generation, Lost, Membership, Retire

pytestmark = pytest.mark.usefixtures("no_leaks")


def final_weights(result):
    return checkpoint.load(result.summary["final_checkpoint"]).model


def max_diff(a, b):
    assert a.keys() == b.keys()
    return max((a[k] - b[k]).abs().max().item() for k in a)


def completed(tmp_path, name, **settings):
    result = workbench.run(**{"steps": 30, "eval_interval": 30, **settings}, out=tmp_path / name)
    assert result.completed, result.summary["reason"]
    return result


def joins(result, gen):
    """{rank: bytes received} of the members that joined generation ``gen``."""
    return {e["rank"]: e["bytes_in"] for e in result.events if e["kind"] == "joined" and e["gen"] == gen}


def until(run, condition, deadline, why="the run did not get there in time"):
    """Wait (bounded by ``deadline``, a monotonic time) until ``condition()`` holds while ``run`` goes on."""
    while not condition():
        assert time.monotonic() < deadline and not run.done, (why, run.events[-3:])
        time.sleep(0.05)


# -- resizing ----------------------------------------------------------------------------------------------------

def test_resize_4_6_3_moves_state_to_newcomers_only_and_equals_restarts_at_each_size(tmp_path):
    resized = completed(tmp_path, "resized", world_size=4, faults=["resize:world=6,step=10", "resize:world=3,step=20"])
    # each change happened at its step; the members kept their state, only the newcomers received any
    grown, shrunk = joins(resized, 1), joins(resized, 2)
    assert sorted(grown) == [0, 1, 2, 3, 4, 5] and sorted(shrunk) == [0, 1, 2]
    assert {r for r, moved in grown.items() if moved} == {4, 5} and not any(shrunk.values())
    assert {e["step"] for e in resized.events if e["kind"] == "joined" and e["gen"] > 0} == {10, 20}
    assert resized.summary["replicas_identical"] and resized.summary["world_size_final"] == 3
    assert resized.failures == []  # a resize is no failure
    # the same as a run stopped at each resize step and restarted from its checkpoint at the new size
    first = completed(tmp_path, "a", world_size=4, steps=10)
    second = completed(tmp_path, "b", world_size=6, steps=20, resume=first.summary["final_checkpoint"])
    third = completed(tmp_path, "c", world_size=3, steps=30, resume=second.summary["final_checkpoint"])
    assert max_diff(final_weights(resized), final_weights(third)) <= 1e-5


def test_gossip_resizes_by_powers_of_two_newcomers_take_a_replica(tmp_path):
    result = completed(tmp_path, "gossip", world_size=4, parallelism="gossip",
                       faults=["resize:world=8,step=10", "resize:world=2,step=20"])
    grown = joins(result, 1)
    assert {r for r, moved in grown.items() if moved} == {4, 5, 6, 7}
    assert sorted(joins(result, 2)) == [0, 1] and result.summary["world_size_final"] == 2


def test_hybrid_resizes_by_whole_lanes_and_equals_restarts_at_each_size(tmp_path):
    hybrid = {"parallelism": "hybrid", "pipeline_stages": 2, "micro_batches": 2}
    resized = completed(tmp_path, "hybrid", world_size=4, **hybrid,
                        faults=["resize:world=6,step=10", "resize:world=2,step=20"])
    grown = joins(resized, 1)
    assert sorted(grown) == [0, 1, 2, 3, 4, 5] and {r for r, moved in grown.items() if moved} == {4, 5}
    assert sorted(joins(resized, 2)) == [0, 2]  # the oldest replica of each stage stays
    first = completed(tmp_path, "h4", world_size=4, steps=10, **hybrid)
    second = completed(tmp_path, "h6", world_size=6, steps=20, resume=first.summary["final_checkpoint"], **hybrid)
    third = completed(tmp_path, "h2", world_size=2, steps=30, resume=second.summary["final_checkpoint"],
                      parallelism="pipeline", micro_batches=2)  # one lane left: a pipeline of 2 stages
    assert max_diff(final_weights(resized), final_weights(third)) <= 1e-5


def restarted_from(result, fresh: int) -> int:
    """The step a checkpoint restart resumed from, checked against the rule: the newest checkpoint recorded before
    the restarted world's generation was announced (a write still under way when the rank died is not waited
    for); ``fresh`` ranks were started for it."""
    events = result.events
    [restart] = [i for i, e in enumerate(events) if e["kind"] == "restart"]
    announced = next(i for i, e in enumerate(events) if i > restart and e["kind"] == "generation")
    written = [e for e in events[:announced] if e["kind"] == "checkpoint"]
    assert f"world stopped; {fresh} fresh ranks resume from checkpoint " in events[restart]["detail"]
    assert events[restart]["detail"].endswith(written[-1]["detail"].split(" (stall")[0]), (events[restart], written)
    [recovered] = [e for e in events if e["kind"] == "recovered" and "checkpoint_restart" in e["detail"]]
    assert recovered["step"] == written[-1]["step"] and recovered["detail"].endswith(f"resumed at step "
                                                                                      f"{written[-1]['step']}")
    return written[-1]["step"]


def test_a_restart_after_a_resize_restarts_the_resized_world(tmp_path):
    result = completed(tmp_path, "restart", world_size=2, strategy="checkpoint_restart", checkpoint_every=5,
                       faults=["resize:world=3,step=8", "kill:rank=1,step=15"])
    [failure] = result.failures
    resume = restarted_from(result, fresh=3)
    assert failure["world_size_after"] == 3 and result.summary["world_size_final"] == 3
    assert resume in (10, 15) and failure["steps_redone"] == 15 - resume and failure["samples_lost"] == 0
    assert result.summary["steps_completed"] == 30 and result.summary["replicas_identical"]


def test_live_resize_grows_and_shrinks_a_running_run(tmp_path):
    run = workbench.start(world_size=2, steps=400, eval_interval=400, out=tmp_path / "live")
    try:
        deadline = time.monotonic() + 60
        until(run, lambda: run.status.get("state") == "running" and run.metrics, deadline,
              "the run did not start training")
        run.resize(4)
        until(run, lambda: run.status.get("world_size") == 4, deadline)
        run.resize(1)
        until(run, lambda: run.status.get("world_size") == 1, deadline)
        assert run.status["members"] == [0]
    finally:
        run.stop()
        result = run.wait(60)
    changes = [e for e in result.events if e["kind"] == "resized"]
    assert [(e["world"], e["joined"], e["left"]) for e in changes] == [(4, [2, 3], []), (1, [], [1, 2, 3])]
    assert "ranks [2, 3] joined" in changes[0]["detail"] and "ranks [1, 2, 3] left" in changes[1]["detail"]


@pytest.mark.parametrize("settings,message", [
    ({"parallelism": "gossip", "faults": ["resize:world=6,step=5"]}, "not a power of two"),
    ({"parallelism": "pipeline", "world_size": 2, "faults": ["resize:world=3,step=5"]}, "one rank per stage"),
    ({"parallelism": "hybrid", "world_size": 4, "faults": ["resize:world=5,step=5"]}, "not a multiple of the 2"),
    ({"faults": ["resize:world=65,step=5"]}, "integer 1..64"),
    ({"faults": ["resize:world=3,step=50"]}, "the run has steps 0..29"),
    ({"faults": ["resize:rank=1,world=3,step=5"]}, "is not one of step=S, time=T, world="),
    ({"faults": ["preempt:rank=1,step=5,grace=-1"]}, "grace=-1.0 must be a number of seconds >= 0"),
    ({"notice_signals": "SIGKILL"}, "'SIGKILL' is not allowed: SIGUSR1, SIGUSR2, SIGTERM"),
    ({"preempt_grace": -2}, "preempt_grace: -2 is not allowed"),
])
def test_bad_boundaries_are_refused_before_anything_starts(settings, message):
    with pytest.raises(workbench.ConfigError, match=message.replace("(", r"\(").replace(".", r"\.")):
        workbench.RunConfig(**{"steps": 30, **settings})


def test_a_live_resize_the_run_cannot_take_is_refused_at_once(tmp_path):
    run = workbench.start(world_size=2, steps=200, parallelism="gossip", out=tmp_path / "refused")
    try:
        with pytest.raises(workbench.ConfigError, match="3 is not a power of two"):
            run.resize(3)
    finally:
        run.stop()
        run.wait(60)


# -- preemption --------------------------------------------------------------------------------------------------

def test_membership_lets_a_preempted_rank_leave_at_the_boundary():
    m = Membership("shrink", 4)
    m.start()
    for i in range(4):
        m.ready(i)
    out = m.at_boundary({2: "was preempted"}, 13)
    assert isinstance(out[0], Retire) and out[0].ids == (2,)
    lost = [d for d in out if isinstance(d, Lost)]
    assert [(d.label, d.world_size_after, d.replacement) for d in lost] == [(2, 3, None)]
    assert [d.members for d in out if isinstance(d, Generation)] == [(0, 1, 3)]


@pytest.fixture(scope="module")
def resized_at_13(tmp_path_factory):
    """A run resized from 4 to 3 ranks at step 13: what survivors that went on from there exactly end with."""
    return completed(tmp_path_factory.mktemp("resized"), "at13", world_size=4, faults=["resize:world=3,step=13"])


@pytest.mark.parametrize("strategy", ["shrink", "rollback", "forward"])
def test_preempted_rank_leaves_with_nothing_lost_or_redone(tmp_path, strategy, resized_at_13):
    result = completed(tmp_path, strategy, world_size=4, strategy=strategy,
                       faults=["preempt:rank=2,step=12,grace=2"])
    [failure] = result.failures
    assert (failure["rank"], failure["steps_redone"], failure["samples_lost"], failure["world_size_after"]) == \
        (2, 0, 0, 3)
    assert "left at step 13" in failure["cause"]
    # the survivors went on from step 13 exactly: as a run resized to 3 there (positions, not labels, shard)
    assert max_diff(final_weights(result), final_weights(resized_at_13)) <= 1e-6


def test_preemption_under_checkpoint_restart_writes_a_checkpoint_and_redoes_nothing(tmp_path):
    result = completed(tmp_path, "restart", world_size=4, strategy="checkpoint_restart", checkpoint_every=8,
                       faults=["preempt:rank=1,step=12,grace=2"])
    [failure] = result.failures
    assert failure["steps_redone"] == 0 and failure["world_size_after"] == 4
    assert any(e["kind"] == "checkpoint" and e["step"] == 13 for e in result.events)
    golden = completed(tmp_path, "golden", world_size=4, strategy="checkpoint_restart", checkpoint_every=8)
    assert max_diff(final_weights(result), final_weights(golden)) <= 1e-6


def test_a_grace_too_short_falls_back_to_the_failure_path_and_says_so(tmp_path):
    result = completed(tmp_path, "short", world_size=4, strategy="shrink", faults=["preempt:rank=3,step=10,grace=0"])
    assert [e["rank"] for e in result.events if e["kind"] == "preempt_fallback"] == [3]
    [failure] = result.failures
    assert "notice ran out before the step boundary" in failure["cause"]


def test_sigusr1_from_outside_is_a_notice(tmp_path):
    run = workbench.start(world_size=3, steps=400, eval_interval=400, strategy="shrink", preempt_grace=5,
                          out=tmp_path / "signal")
    try:
        deadline = time.monotonic() + 60
        until(run, lambda: len(run.metrics) >= 3, deadline, "the run did not start training")
        rank = run._supervisor.worker(1)
        os.kill(rank.pid or rank.proc.pid, signal.SIGUSR1)  # as Slurm's --signal does
        until(run, lambda: run.status.get("world_size") == 2, deadline)
    finally:
        run.stop()
        result = run.wait(60)
    notices = [e for e in result.events if e["kind"] == "preempt"]
    assert [(e["rank"], e["detail"].split(" notice")[0]) for e in notices] == [(1, "SIGUSR1")]
    [failure] = result.failures
    assert failure["steps_redone"] == 0 and failure["samples_lost"] == 0


def test_live_preempt_from_python(tmp_path):
    run = workbench.start(world_size=3, steps=400, eval_interval=400, strategy="shrink", out=tmp_path / "live")
    try:
        deadline = time.monotonic() + 60
        until(run, lambda: len(run.metrics) >= 3, deadline, "the run did not start training")
        run.preempt(2, grace=5)
        until(run, lambda: run.status.get("world_size") == 2, deadline)
    finally:
        run.stop()
        result = run.wait(60)
    [failure] = result.failures
    assert (failure["rank"], failure["steps_redone"], failure["samples_lost"]) == (2, 0, 0)


def test_a_whole_job_preempted_stops_at_its_checkpoint_and_resumes_from_it(tmp_path):
    notices = [f"preempt:rank={r},step=12,grace=5" for r in range(3)]
    stopped = workbench.run(world_size=3, steps=30, eval_interval=30, faults=notices, out=tmp_path / "job")
    assert stopped.outcome == "stopped" and "every rank was preempted: stopped at step 13" in stopped.summary["reason"]
    path = stopped.summary["reason"].split("resume from ")[1]
    assert checkpoint.load(path).step == 13
    # resumed with the same plan (a requeued sweep point's run): the notices before its start are the earlier run's
    resumed = completed(tmp_path, "resumed", world_size=3, resume=path, faults=notices)
    assert not [e for e in resumed.events if e["kind"] in ("preempt", "boundary_skipped")]
    golden = completed(tmp_path, "golden", world_size=3)
    assert max_diff(final_weights(resumed), final_weights(golden)) <= 1e-6


def test_a_hybrid_restart_after_a_shrink_restarts_the_ranks_that_are_left(tmp_path):
    result = completed(tmp_path, "hybrid-restart", world_size=4, parallelism="hybrid", micro_batches=2,
                       strategy="checkpoint_restart", checkpoint_every=5,
                       faults=["resize:world=2,step=8", "kill:rank=2,step=15"])
    [failure] = result.failures
    # rank 0's write of step 15's checkpoint runs while step 15 does: a kill in step 15 restarts from it if it was
    # recorded by then, else from step 10's (a non-writer's planned kill does not wait for another rank's disk)
    resume = restarted_from(result, fresh=2)
    assert resume in (10, 15) and failure["steps_redone"] == 15 - resume
    assert result.summary["world_size_final"] == 2 and result.summary["steps_completed"] == 30


def test_a_pipeline_stage_preempted_under_reinit_is_recovered_as_a_failure(tmp_path):
    result = completed(tmp_path, "pipeline-reinit", world_size=2, parallelism="pipeline", strategy="reinit",
                       checkpoint_every=5, faults=["preempt:rank=1,step=12,grace=5"])
    [failure] = result.failures
    assert "the only copy of its pipeline stage" in failure["cause"] and result.summary["world_size_final"] == 2


def test_a_boundary_past_the_last_step_is_skipped_and_kills_nothing(tmp_path):
    result = completed(tmp_path, "late", world_size=3, strategy="shrink", faults=["preempt:rank=1,step=29,grace=0"])
    assert result.failures == [] and any(e["kind"] == "boundary_skipped" for e in result.events)


def test_a_notice_to_a_warm_spare_is_no_preemption(tmp_path):
    run = workbench.start(world_size=2, steps=400, eval_interval=400, strategy="shrink", regrow=True,
                          out=tmp_path / "spare")
    try:
        deadline = time.monotonic() + 60
        spare = None
        while spare is None or len(run.metrics) < 3:
            assert time.monotonic() < deadline and not run.done, "the run did not start training"
            launcher = run._supervisor.launcher
            workers = list(launcher.workers.values()) if launcher is not None else []
            spare = next((w for w in workers if w.label is None and w.ready), None)
            time.sleep(0.05)
        os.kill(spare.pid or spare.proc.pid, signal.SIGUSR1)
        until(run, lambda: any(e["kind"] == "fault_skipped" for e in run.events), deadline)
    finally:
        run.stop()
        result = run.wait(60)
    assert result.failures == [] and result.summary["world_size_final"] == 2


def test_run_finish_ends_at_a_step_boundary_equal_to_a_run_of_that_many_steps(tmp_path):
    """``run.finish()`` on a run of a million steps, once step 20 is reported (an event, not a wait): both ranks end
    after the boundary's step and say done with their fingerprints, the run completes (replicas compared), and
    its weights and step rows equal those of a run configured with that many steps."""
    import threading

    reached = threading.Event()
    run = workbench.start({"world_size": 2, "steps": 1_000_000, "eval_interval": 1_000_000, "hidden": [16]},
                          out=tmp_path / "f", on_event=lambda kind, p: kind == "step" and p["step"] >= 20
                          and reached.set())
    try:
        assert reached.wait(120), "no step 20"
    finally:
        run.finish()
    result = run.wait(60)
    summary = result.summary
    assert summary["outcome"] == "completed" and summary["reason"].startswith("finished at a step boundary"), summary
    assert summary["replicas_identical"] is True and summary["world_size_final"] == 2
    (finish,) = [e for e in result.events if e["kind"] == "finish"]
    n = finish["steps"]
    assert 20 < n == summary["steps_completed"] and [row["step"] for row in result.metrics] == list(range(n))
    with pytest.raises(workbench.ConfigError, match="the run has ended"):
        run.finish()
    reference = completed(tmp_path, "ref", world_size=2, steps=n, eval_interval=1_000_000, hidden=[16])
    assert max_diff(final_weights(result), final_weights(reference)) == 0.0
    assert [row["loss"] for row in result.metrics] == [row["loss"] for row in reference.metrics]
