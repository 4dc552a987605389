"""EuroMPI'17's verdict on synthetic campaign tables: a table in the paper's direction holds; a shrink that loses
5 points, a pipeline that survives the loss of its stage without a checkpoint, a restart from step 0 turn their
finding to *does not hold*; two seeds cannot decide; a ulfm arm that could not run is reported, never passed."""

from __future__ import annotations

import pandas as pd
import pytest

from workbench.base.errors import ConfigError
from workbench.campaigns.reproduce import europmpi17 as e

SEEDS = (11, 12, 13, 14, 15, 16)
NOISE = (0.02, -0.03, 0.01, 0.0, -0.01, 0.02)  # accuracy (points) each seed's arm differs by

@pytest.fixture(autouse=True)
def _the_registered_rule_alone(monkeypatch):
    """These tests check each finding's registered rule on synthetic tables; an underpowered or descriptive finding's
    power note (it changes no status) is tests/test_stats_power.py's."""
    from workbench.campaigns.reproduce import power

    monkeypatch.setattr(power, "powered", lambda finding, decision: decision)



def row(arm, k, seed, accuracy=90.0, **extra):
    pipeline = arm.startswith("pipeline")
    world = 2 if pipeline else 4
    out = {"arm": arm, "strategy": {"pipeline_no_checkpoint": "none", "pipeline_checkpoint": "checkpoint_restart",
                                    "hybrid_replica": "shrink"}.get(arm, arm),
           "parallelism": "pipeline" if pipeline else "hybrid" if arm == "hybrid_replica" else "data",
           "failures": k, "seed": seed, "world_size": world, "steps": 100, "kill_step": 75 if k else None,
           "reporting": True,
           "outcome": "completed", "reason": "all steps done", "final_test_accuracy": accuracy / 100,
           "train_s": 1.0, "wall_train_s": 1.0, "world_size_final": world, "steps_completed": 100,
           "steps_redone": 0, "checkpoints": 0, "planned": k}
    if arm in ("shrink", "hybrid_replica") and k:
        out["world_size_final"] = world - k
    if arm in ("reinit", "checkpoint_restart", "pipeline_checkpoint") and k:
        out.update(steps_redone=25, checkpoints=2)
    if arm == "pipeline_no_checkpoint":
        out.update(outcome="failed", reason="rank 1 died (SIGKILL) at step 75; strategy 'none' does not recover",
                   world_size_final=1, steps_completed=75)
    return {**out, **extra}


def frame(seeds=SEEDS, shrink_loss=0.0, ulfm=True, pipeline_no_checkpoint=None, pipeline_redone=25, hybrid=None):
    rows = []
    for seed, noise in zip(seeds, NOISE):
        rows += [row("shrink", 0, seed), row("shrink", 2, seed, 90.0 + noise - shrink_loss),
                 row("reinit", 2, seed), row("checkpoint_restart", 2, seed),
                 row("pipeline_checkpoint", 0, seed, 80.0),
                 row("pipeline_no_checkpoint", 1, seed, 70.0, **(pipeline_no_checkpoint or {})),
                 row("pipeline_checkpoint", 1, seed, 80.0, steps_redone=pipeline_redone),
                 row("hybrid_replica", 1, seed, 80.0, **(hybrid or {}))]
        rows.append(row("ulfm", 2, seed, 90.0 - noise, world_size_final=2) if ulfm else
                    {**row("ulfm", 2, seed), "outcome": "not run", "final_test_accuracy": None,
                     "reason": "strategy: 'ulfm' needs Open MPI 5 (Open MPI's mpirun is not installed)"})
    return pd.DataFrame(rows)


def decisions(v):
    return {d["key"].split(".")[1]: d for d in v.decisions}


def test_a_table_in_the_papers_direction_holds():
    v = e.verdict(frame(), "paper")
    assert v.status == "holds", v.summary()
    assert {k: d["status"] for k, d in decisions(v).items()} == {"shrink_keeps_accuracy": "holds",
                                                                 "ulfm_matches_shrink": "holds"}
    assert any(c.name.startswith("europmpi17.model_parallel_needs_checkpoints") and c.ok for c in v.checks)
    v.require()


def test_a_shrink_that_loses_5_points_does_not_hold():
    v = e.verdict(frame(shrink_loss=5.0), "paper")
    assert decisions(v)["shrink_keeps_accuracy"]["status"] == "does not hold" and v.status == "does not hold"
    assert decisions(v)["ulfm_matches_shrink"]["status"] == "does not hold"  # ulfm kept what shrink lost
    with pytest.raises(AssertionError, match="shrink_keeps_accuracy k=2"):
        v.require()
    v.require_mechanism()  # the mechanism is intact: what failed is the registered finding


@pytest.mark.parametrize("broken,why", [
    ({"outcome": "completed", "reason": "all steps done", "world_size_final": 2, "steps_completed": 100},
     "without a checkpoint completed"),                      # a pipeline that survives losing its only stage copy
    ({"planned": 0, "reason": "rank 1 froze"}, "without a checkpoint failed"),  # failed, but not by the planned kill
])
def test_a_pipeline_that_does_not_need_its_checkpoint_does_not_hold(broken, why):
    v = e.verdict(frame(pipeline_no_checkpoint=broken), "paper")
    (failed,) = [c for c in v.checks if not c.ok]
    assert failed.name.startswith("europmpi17.model_parallel_needs_checkpoints") and why in failed.detail
    with pytest.raises(AssertionError, match="model_parallel_needs_checkpoints"):
        v.require_mechanism()


def test_a_pipeline_restarted_from_step_0_or_missing_an_arm_does_not_hold():
    assert "75 steps redone" in e.verdict(frame(pipeline_redone=75), "paper").failed()[0]  # no checkpoint was read
    table = frame()
    table = table[~((table.arm == "pipeline_checkpoint") & (table.failures == 1) & (table.seed == SEEDS[0]))]
    assert "a pipeline or hybrid arm is missing" in e.verdict(table, "paper").failed()[0]


@pytest.mark.parametrize("broken,why", [
    ({"outcome": "failed", "reason": "rank 3 died (SIGKILL) at step 75", "world_size_final": 3},
     "the hybrid failed at world 3 of 4"),                    # a replica lane that did not carry the run on
    ({"world_size_final": 4, "planned": 0}, "the hybrid completed at world 4 of 4"),  # the kill never fired
    ({"checkpoints": 2}, "2 checkpoints"),                   # it survived on a checkpoint, not on its lane
])
def test_a_hybrid_that_does_not_survive_on_its_replica_lane_does_not_hold(broken, why):
    v = e.verdict(frame(hybrid=broken), "paper")
    (failed,) = [c for c in v.checks if not c.ok and c.name.startswith("europmpi17.model_parallel_needs_")]
    assert why in failed.detail, failed  # (a failed hybrid also fails "every run completes as planned")
    with pytest.raises(AssertionError, match="model_parallel_needs_checkpoints"):
        v.require_mechanism()


def test_too_few_seeds_are_inconclusive_and_pass_only_the_mechanism():
    v = e.verdict(frame(seeds=SEEDS[:2], shrink_loss=0.9), "paper")
    assert decisions(v)["shrink_keeps_accuracy"]["status"] == "inconclusive" and v.status == "inconclusive"
    v.require()  # inconclusive is reported, not a failure
    v.require_mechanism()


def test_the_ulfm_arm_missing_is_reported_not_run_never_passed():
    v = e.verdict(frame(ulfm=False), "paper")
    ulfm = decisions(v)["ulfm_matches_shrink"]
    assert ulfm["status"] == "inconclusive" and ulfm["n"] == 0 and ulfm["run"] is False
    assert ulfm["detail"].startswith("not run: strategy: 'ulfm' needs Open MPI 5")
    assert v.status == "inconclusive" and v.statistics["not_run"] == ["ulfm"]
    assert "inconclusive: europmpi17.ulfm_matches_shrink" in v.summary()


def test_a_restart_that_misses_the_failure_free_run_breaks_the_mechanism():
    table = frame()
    table.loc[(table.arm == "reinit") & (table.seed == SEEDS[0]), "final_test_accuracy"] = 0.88
    v = e.verdict(table, "small")
    assert [c.name for c in v.checks if not c.ok] == ["reinit returns to the failure-free run (k=2)"]
    with pytest.raises(AssertionError, match="reinit returns"):
        v.require_mechanism()


def test_runs_plan_every_arm_and_refuse_unknown_ones():
    settings = {**e.SCALES["small"], "failures": [1, 2]}
    plan = [(arm, k, run["strategy"], run.get("parallelism", "data")) for arm, k, run in e.runs(settings)]
    assert plan[0] == ("shrink", 0, "shrink", "data") and ("ulfm", 2, "ulfm", "data") in plan
    assert plan[-4:] == [("pipeline_checkpoint", 0, "checkpoint_restart", "pipeline"),
                         ("pipeline_no_checkpoint", 1, "none", "pipeline"),
                         ("pipeline_checkpoint", 1, "checkpoint_restart", "pipeline"),
                         ("hybrid_replica", 1, "shrink", "hybrid")]
    assert len(plan) == 1 + 4 * 2 + 4
    runs = {arm: run for arm, k, run in e.runs(settings) if k == 1 and arm != "shrink"}
    # the same stages, the same kill step, a rank of the same (last) stage; the hybrid on 2 lanes
    lost, lane = runs["pipeline_no_checkpoint"], runs["hybrid_replica"]
    assert (lane["world_size"], lane["pipeline_stages"]) == (4, 2) and lane["faults"] == ["kill:rank=3,step=42"]
    assert lost["faults"] == ["kill:rank=1,step=42"] and "checkpoint_every" not in lane
    with pytest.raises(ConfigError, match="arms: mpi: not arms of this campaign"):
        e.runs({**settings, "arms": ["shrink", "mpi"]})
    with pytest.raises(ConfigError, match="unknown campaign setting"):
        e.campaign("small", "/nonexistent", world_size=8)


def test_ulfm_availability_is_the_strategys_own(monkeypatch):
    from workbench.strategies import registry as strategies

    monkeypatch.setattr(strategies, "mpirun_path", lambda: None)
    assert "Open MPI's mpirun is not installed" in e.ulfm_missing()



def test_an_accuracy_decision_reads_the_measured_failure_free_accuracy_beside_the_ceiling():
    """The failure-free runs measured 90 % (the table's), not the registry's tuning figure: the line says so, and
    a failure-free run measured within 5 pt of the ceiling makes its "holds" no evidence at the paper scale."""
    d = decisions(e.verdict(frame(), "paper"))["shrink_keeps_accuracy"]
    assert d["ceiling"]["failure_free"] == pytest.approx(0.90) and "(measured)" in d["ceiling"]["line"]
    near = frame()
    near.loc[near.final_test_accuracy.notna(), "final_test_accuracy"] = 0.99
    d = decisions(e.verdict(near, "paper"))["shrink_keeps_accuracy"]
    assert d["ceiling"]["near"] and d["status"] == "holds at the ceiling: not evidence"
