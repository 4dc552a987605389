"""ULFM as a strategy (``--strategy ulfm``): real Open MPI 5 processes started by mpirun with fault tolerance on,
the survivors revoking, shrinking and agreeing; and the pieces that need no MPI (membership, figures, refusals)."""

import subprocess
import sys
from typing import Any

import pytest

import workbench
from workbench.base.errors import ConfigError
from workbench.config.run import RunConfig
from workbench.strategies.peers import mpirun_path
from workbench.supervisor.membership import End, Lost, Membership, Note, Start
from workbench.supervisor.recorder import Recorder
from workbench.workloads.data import BatchSequence, load_dataset, sample_checksum

needs_mpi = pytest.mark.skipif(mpirun_path() is None, reason="the mpi extra is not installed (pip install -e .[mpi])")
TINY = {"steps": 120, "eval_interval": 60, "hidden": [32], "seed": 3, "strategy": "ulfm"}


@needs_mpi
def test_rank_0_killed_the_survivors_shrink_and_finish_every_step(tmp_path):
    result = workbench.run({**TINY, "world_size": 3, "faults": ["kill:rank=0,step=40"]}, out=tmp_path / "u")
    summary = result.summary
    assert summary["outcome"] == "completed", summary["reason"]
    assert summary["world_size_final"] == 2 and summary["steps_completed"] == 120
    (failure,) = summary["failures"]
    assert failure["rank"] == 0 and failure["world_size_after"] == 2
    # detection is the survivors' own MPI error, settle their revoke/shrink/agree, resume the retried step
    assert 0 < failure["detection_s"] <= failure["settle_s"] <= failure["resume_s"] < 5
    assert failure["steps_redone"] == 0 and failure["samples_lost"] == 0
    kinds = [e["kind"] for e in result.events]
    assert "ulfm_error" in kinds and any(e["kind"] == "ulfm" and "shrink" in e["detail"] for e in result.events)
    assert summary["replicas_identical"] is True
    # the shrunk world trains on the whole global batch: every step after the kill reports all its samples
    after = [row for row in result.metrics if row["step"] > 40]
    assert {row["samples"] for row in after} == {64} and {row["world_size"] for row in after} == {2}
    # and the same samples: every recorded step's checksum is its failure-free batch's, re-split over 2 or not
    batches = BatchSequence(len(load_dataset(RunConfig(seed=3)).y_train), 64, 3)
    assert all(row["sample_checksum"] == sample_checksum(batches(row["step"])) for row in result.metrics)


@needs_mpi
def test_fast_tier_rank_0_killed_the_survivor_shrinks_and_finishes(tmp_path):
    """ULFM end to end in the fast tier: 2 MPI processes, 30 steps of a 16-unit MLP, rank 0 SIGKILLed at step 10.

    Where the time goes (``tools``-free: the run's own events, 2-core VM): mpirun itself starts 2 processes and
    passes a barrier in 0.2 s; each process then imports torch (1.6-2 s idle, 2 at once on 2 cores; ~10 s at load
    6), which is the floor of any ULFM run (its ranks are mpirun's fresh interpreters, never forked from our
    template). 30 steps take ~0.1 s, the revoke/shrink/agree a few ms. 2.3 s in all idle (3 ranks: 2.8 s).
    """
    result = workbench.run({"world_size": 2, "steps": 30, "eval_interval": 30, "hidden": [16], "seed": 3,
                            "strategy": "ulfm", "faults": ["kill:rank=0,step=10"]}, out=tmp_path / "u")
    summary = result.summary
    assert summary["outcome"] == "completed", summary["reason"]
    assert summary["world_size_final"] == 1 and summary["steps_completed"] == 30
    (failure,) = summary["failures"]
    assert failure["rank"] == 0 and failure["world_size_after"] == 1
    # the failed step retried, not redone; planted: a survivor resuming one step early (``_recover`` returning
    # max(steps) - 1) redoes the step it committed before the shrink, and this reads steps_redone 1
    assert failure["steps_redone"] == 0 and failure["samples_lost"] == 0
    assert 0 < failure["detection_s"] <= failure["settle_s"] <= failure["resume_s"]
    survivor = [e for e in result.events if e["kind"] == "ulfm_error"]
    assert [e["rank"] for e in survivor] == [1]  # the survivor's own MPI error is the detection
    (shrunk,) = [e for e in result.events if e["kind"] == "ulfm" and e["rank"] == 1]
    assert "1 ranks go on" in shrunk["detail"]
    # each step reported once, in order. Rank 0 dies after step 10's allreduce: the survivor's MPI error comes at
    # step 11 (it had step 10's sum too; step 10's figures died with rank 0, its reporter) or, when rank 0's sum
    # reached it no more, at step 10, which it then retries and reports itself
    (error_step,) = [e["step"] for e in survivor]
    assert error_step in (10, 11)
    assert [row["step"] for row in result.metrics] == [s for s in range(30) if s != 10 or error_step == 10]
    after = [row for row in result.metrics if row["step"] > 10]
    assert {row["samples"] for row in after} == {64} and {row["world_size"] for row in after} == {1}


@needs_mpi
def test_two_kills_and_a_hang_leave_one_rank_that_finishes(tmp_path):
    result = workbench.run({**TINY, "world_size": 3, "heartbeat_timeout": 1.5,
                            "faults": ["kill:rank=2,step=30", "hang:rank=0,step=70"]}, out=tmp_path / "u")
    summary = result.summary
    assert summary["outcome"] == "completed", summary["reason"]
    assert summary["world_size_final"] == 1
    first, second = summary["failures"]
    assert first["world_size_after"] == 2 and second["world_size_after"] == 1
    # a stopped process is no failure to MPI: the supervisor's heartbeat timeout kills it, then ULFM sees it
    assert "froze" in second["cause"] and second["detection_s"] >= 1.5


@needs_mpi
def test_the_cli_acceptance_run_completes_with_3_ranks(tmp_path):
    done = subprocess.run([sys.executable, "-m", "workbench", "run", "--world-size", "4", "--steps", "150",
                           "--strategy", "ulfm", "--fault", "kill:rank=2,step=100", "--json", "--out",
                           str(tmp_path / "cli")], capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr
    assert '"world_size_final": 3' in done.stdout and '"detection_s"' in done.stdout


def test_without_the_extra_ulfm_exits_2_with_the_install_hint():
    hide = ("import importlib.util as u; f = u.find_spec; "
            "u.find_spec = lambda n, *a: None if n == 'mpi4py' else f(n, *a); "
            "from workbench.launch.cli import main; raise SystemExit(main(['run', '--strategy', 'ulfm']))")
    done = subprocess.run([sys.executable, "-c", hide], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "workbench: error: strategy: 'ulfm' needs Open MPI 5 with ULFM and mpi4py 4 (mpi4py is not installed): "
        "pip install -e .[mpi]"]


@pytest.mark.parametrize("settings, message", [
    ({"regrow": True}, "recovers by its own means"),
    ({"parallelism": "pipeline"}, "does not apply to parallelism 'pipeline'"),
    ({"detect": ["guard"]}, "detect is ours and does not apply"),
])
def test_ulfm_refuses_what_is_ours(settings, message):
    with pytest.raises(ConfigError, match=message):
        RunConfig(strategy="ulfm", **settings)


def test_membership_survivors_go_on_without_replacement_and_the_last_death_fails():
    m = Membership("ulfm", 3)
    starts = m.start()
    assert all(isinstance(s, Start) and s.slot for s in starts)  # mpirun's processes join slots
    for s in starts:
        m.ready(s.id)
    out = m.died(starts[1].id, "died")
    assert [type(d) for d in out] == [Lost, Note] and out[0].world_size_after == 2
    assert m.members == [0, 2] and m.gen == 0  # no new generation: the MPI layer is the membership
    m.died(starts[0].id, "died")
    assert isinstance(m.died(starts[2].id, "died")[-1], End)


def test_the_survivors_detection_may_arrive_before_the_supervisor_sees_the_death():
    recorder = Recorder(RunConfig(strategy="ulfm", world_size=3))
    recorder.peer_mark("detect", 100.2)  # a survivor's MPI error, reported first
    lost = Lost(label=1, id=1, cause="died", position=1, size=3, world_size_after=2, replacement=None)
    failure = recorder.lost(lost, step=5, fault_time=100.0, peer=True)
    assert failure.detect_time == 100.2 and failure.peer_seen
    recorder.peer_mark("settle", 100.3)
    recorder.step({"step": 5, "gen": 0, "t": 100.25, "loss": 1.0, "train_acc": 0.5, "samples": 64, "step_time": 0.01})
    assert failure.resume_time is None  # committed before the shrink: not the resumed training
    recorder.step({"step": 6, "gen": 0, "t": 100.4, "loss": 1.0, "train_acc": 0.5, "samples": 64, "step_time": 0.01})
    figures = failure.figures("ulfm")
    assert (figures["detection_s"], figures["settle_s"], figures["resume_s"]) == (0.2, 0.3, 0.4)


def _ulfm_failure(recorder: Recorder) -> Any:
    """Rank 0 (the reporter) of 2 killed at step 10 (t 100.0); the survivor's MPI error at 100.2, shrunk at 100.3."""
    lost = Lost(label=0, id=0, cause="died", position=0, size=2, world_size_after=1, replacement=None)
    failure = recorder.lost(lost, step=10, fault_time=100.0, peer=True)
    recorder.peer_mark("detect", 100.2)
    return failure


def _steps(recorder: Recorder, steps: list[tuple[int, float]], figures: bool) -> None:
    for step, t in steps:  # each member step message goes to the adapter (peer_step), figures to the recorder
        m = {"step": step, "gen": 0, "t": t}
        recorder.peer_step(m)
        if figures:
            recorder.step({**m, "loss": 1.0, "train_acc": 0.5, "samples": 64, "step_time": 0.01})


@pytest.mark.parametrize("resumed, redone", [(11, 0), (10, 1), (8, 3)])
def test_a_step_the_survivor_committed_and_reports_again_after_the_shrink_is_redone(resumed, redone):
    """The survivor (no figures before: rank 0 reported) committed step 10 after rank 0's death, its error came
    at step 11: resuming at 11 redoes nothing, at 10 (one step early: a planted redo) or 8, the steps between."""
    recorder = Recorder(RunConfig(strategy="ulfm", world_size=2))
    _steps(recorder, [(s, 99.0 + s / 100) for s in range(10)], figures=True)  # rank 0's reports to step 9
    failure = _ulfm_failure(recorder)
    _steps(recorder, [(s, 99.0 + s / 100) for s in range(11)], figures=False)  # the survivor's own, to step 10
    recorder.peer_mark("settle", 100.3)
    _steps(recorder, [(s, 100.4 + s / 100) for s in range(resumed, 15)], figures=True)  # now it reports
    assert (failure.resume_step, failure.committed, failure.steps_redone) == (resumed, 11, redone)
    assert failure.figures("ulfm")["resume_s"] == pytest.approx(0.4 + resumed / 100)
    result = recorder.result("completed", "", 1, True, False, members={}, provenance={})
    assert result.summary["steps_redone_total"] == redone


def test_a_failed_step_the_survivor_retries_is_not_redone():
    """The survivor's error came at step 10 itself (rank 0's sum never reached it): it never committed 10, and
    retrying it after the shrink redoes nothing, whichever order the settle and its first step arrive in."""
    recorder = Recorder(RunConfig(strategy="ulfm", world_size=2))
    _steps(recorder, [(s, 99.0 + s / 100) for s in range(10)], figures=True)
    failure = _ulfm_failure(recorder)
    _steps(recorder, [(10, 100.4)], figures=True)  # its retried step 10 reported before the shrink is read
    recorder.peer_mark("settle", 100.3)
    assert (failure.resume_step, failure.committed, failure.steps_redone) == (10, 10, 0)
