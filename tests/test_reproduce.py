"""The reproductions' statistics and verdicts (workbench.campaigns.reproduce), on synthetic campaign tables: a finding
holds on numbers in the paper's direction, and each broken direction (rollback losing samples, shrink not continuing,
gossip messages growing) makes its verdict fail, so the notebook's last cell fails (JPDC'24:
tests/test_reproduce_jpdc24.py; apoptosis: tests/test_reproduce_apoptosis.py; EuroMPI'17:
tests/test_reproduce_europmpi17.py). The campaigns themselves run in the
notebooks (nbval) at their small scale."""

from __future__ import annotations

import html
import json
import math

import pandas as pd
import pytest

from workbench.campaigns.reproduce import apoptosis, ccgrid22, common, europmpi17, gossipgrad
from workbench.campaigns.reproduce.common import Verdict, mean_interval, one_sided, paired, wilson
from workbench.campaigns.reproduce.report import write_report
from workbench.results.run_result import RunResult


@pytest.fixture(autouse=True)
def _the_registered_rule_alone(monkeypatch):
    """These tests check each finding's registered rule on synthetic tables; an underpowered or descriptive finding's
    power note (it changes no status) is tests/test_stats_power.py's."""
    from workbench.campaigns.reproduce import power

    monkeypatch.setattr(power, "powered", lambda finding, decision: decision)



def test_intervals():
    mean, low, high = mean_interval([1.0, 2.0, 3.0])
    assert mean == 2.0 and low == pytest.approx(2 - 4.302653 / math.sqrt(3)) and high == pytest.approx(4 - low)
    assert mean_interval([5.0]) == (5.0, 5.0, 5.0) and math.isnan(mean_interval([])[0])
    one = one_sided([1.0, 2.0, 3.0])
    assert one[1] == pytest.approx(2 - 2.919986 / math.sqrt(3))  # the one-sided 95 % bound: t(0.95, 2)
    share, low, high = wilson(0, 10)
    assert share == 0 and low == 0 and high == pytest.approx(0.2775, abs=1e-4)


def test_paired_differences_match_seed_and_world():
    frame = pd.DataFrame({"strategy": ["a", "a", "b", "b", "b"], "world_size": [4, 4, 4, 4, 4],
                          "seed": [0, 1, 0, 1, 2], "outcome": ["completed"] * 5, "x": [5.0, 7.0, 1.0, 2.0, 9.0]})
    assert paired(frame, "a", "b", "x") == [4.0, 5.0]  # seed 2 has no pair


def test_verdict_require_asserts_every_check_and_excuses_none(tmp_path):
    v = Verdict("k", "T", "paper", "small")
    v.check("first", True, "1")
    v.check("second thing", False, "2")
    assert v.status == "does not hold" and v.failed() == ["second thing: 2"]
    with pytest.raises(AssertionError, match="second thing"):
        v.require()
    assert v.require_measured() == "does not hold"  # measured: reported as it is
    v.save(tmp_path)
    back = Verdict.load(tmp_path / "verdict.json")
    assert back.checks == v.checks and back.status == "does not hold"
    empty = Verdict("k", "T", "p", "small", comparable=False, reason="nothing ran")
    for call in (empty.require, empty.require_measured):
        with pytest.raises(AssertionError, match="nothing ran"):
            call()
    with pytest.raises(AssertionError, match="no check measured"):
        Verdict("k", "T", "p", "small").require_measured()


def test_cached_runs_rerun_for_other_code_and_for_unplanned_failures(tmp_path, monkeypatch):
    """A saved run is replayed only for the same settings and the same workbench source, and only when what it
    says follows from them: a rank lost to something the run did not plan (killed from outside) is run again."""
    import workbench

    calls = []
    real_run = workbench.run
    monkeypatch.setattr(workbench, "run", lambda **kw: calls.append(kw) or real_run(**kw))
    settings = {"world_size": 2, "steps": 6, "seed": 3}
    first = common.cached_run(tmp_path, **settings)
    again = common.cached_run(tmp_path, **settings)
    assert len(calls) == 1 and again.summary["final_test_accuracy"] == first.summary["final_test_accuracy"]

    monkeypatch.setattr("workbench.results.provenance.source_digest", lambda: "other code")
    common.cached_run(tmp_path, **settings)
    assert len(calls) == 2  # the source changed: run again
    common.cached_run(tmp_path, **settings)
    assert len(calls) == 2

    saved = RunResult.load(tmp_path / "result.h5")
    saved.events.append({"time": 1.0, "step": 3, "rank": 1, "kind": "failure", "detail": "rank 1 died (SIGKILL)",
                         "cause": "died (SIGKILL)", "world_after": 1})
    saved.summary.update(outcome="failed", reason="rank 1 died (SIGKILL) at step 3; strategy 'none' does not recover")
    saved.save(tmp_path)
    assert not common.reusable(saved)
    assert common.cached_run(tmp_path, **settings).completed and len(calls) == 3  # run again, not replayed

    planned = common.cached_run(tmp_path / "planned", **settings, faults=["kill:rank=1,step=3"])
    assert planned.outcome == "failed" and common.reusable(planned)  # a failure the settings make happen
    common.cached_run(tmp_path / "planned", **settings, faults=["kill:rank=1,step=3"])
    assert len(calls) == 4


# -- CCGrid'22 ------------------------------------------------------------------------------------------------------
def ccgrid_frame(rollback_lost=0):
    rows = []
    for seed in range(4):
        for label, over, time_lost, loss, lost, redone in [
                ("checkpoint_restart/30", 40 + 5 * seed, 0.6 + 0.1 * seed, 0.0, 0, 20),
                ("rollback", 6 + seed, 0.1, 0.0, rollback_lost, 0), ("forward", 4 + seed, 0.08, 0.2, 32, 0)]:
            rows.append({"strategy": label, "world_size": 4, "seed": seed, "outcome": "completed", "reason": "",
                         "failures": 2, "baseline_outcome": "completed", "baseline_reason": "",
                         "overhead_pct": over, "rank_overhead_pct": over, "lost_s": time_lost,
                         "accuracy_loss_pt": loss, "steps_redone": redone, "samples_lost": lost})
    return pd.DataFrame(rows)


def test_ccgrid_holds_in_the_papers_direction_and_fails_when_rollback_loses_a_share():
    assert ccgrid22.verdict(ccgrid_frame(), "small").status == "holds"
    broken = ccgrid22.verdict(ccgrid_frame(rollback_lost=16), "small")
    assert broken.status == "does not hold"
    assert [c.name for c in broken.checks if not c.ok] == ["rollback loses no samples (world 4)"]


def test_ccgrid_without_failures_is_not_comparable():
    frame = ccgrid_frame().assign(failures=0)
    assert ccgrid22.verdict(frame, "small").status == "not comparable"


def test_ccgrid_a_failed_run_or_reference_fails_the_verdict_instead_of_leaving_the_pairs():
    frame = ccgrid_frame()
    frame.loc[(frame.strategy == "rollback") & (frame.seed < 2), ["outcome", "reason"]] = ["failed", "no rank survived"]
    broken = ccgrid22.verdict(frame, "small")
    assert broken.status == "does not hold" and broken.failed() == [
        "every run completes: rollback w4 seed 0: no rank survived; rollback w4 seed 1: no rank survived"]
    frame = ccgrid_frame()
    frame.loc[frame.seed == 3, ["baseline_outcome", "baseline_reason"]] = ["failed", "start-up timed out"]
    assert ccgrid22.verdict(frame, "small").failed() == [
        "every run completes: failure-free reference w4 seed 3: start-up timed out"]


def test_ccgrid_seeds_without_a_failure_are_left_out_of_the_statistics():
    """A seed whose failure process injected nothing compares failure-free runs: its noise (here restart
    cheaper than rollback by 60 pt) must not decide what a recovery costs, nor pull the accuracy intervals to 0."""
    calm = [{"strategy": label, "world_size": 4, "seed": 9, "outcome": "completed", "reason": "", "failures": 0,
             "baseline_outcome": "completed", "baseline_reason": "", "overhead_pct": over,
             "rank_overhead_pct": over, "lost_s": 0.0,
             "accuracy_loss_pt": 0.0, "steps_redone": 0, "samples_lost": 0}
            for label, over in [("checkpoint_restart/30", -60.0), ("rollback", 0.0), ("forward", 0.0)]]
    frame = pd.concat([ccgrid_frame(), pd.DataFrame(calm)], ignore_index=True)
    v = ccgrid22.verdict(frame, "paper")
    assert v.status == "holds" and v.statistics["seeds_with_failures"] == [0, 1, 2, 3]
    restart = next(d for d in v.decisions if d["label"].startswith("checkpoint_restart/30 - rollback"))
    assert restart["n"] == 4 and restart["mean"] == pytest.approx(40.0) and restart["status"] == "holds"
    assert ccgrid22.statistics(frame).set_index("strategy").loc["rollback", "completed"] == 4


def test_ccgrid_compares_the_whole_runtime_on_the_rank_time_clock():
    """Runs of 4 ranks on 2 cores: one rollback run slowed by the host (+150 pt of wall overhead) does not touch
    the verdict, which compares rank-time at both scales; restart costing no more rank-time than rollback fails
    it."""
    frame = ccgrid_frame()
    frame.loc[(frame.strategy == "rollback") & (frame.seed == 1), "overhead_pct"] = 150.0
    v = ccgrid22.verdict(frame, "small")
    assert v.status == "holds"
    detail = next(c.detail for c in v.checks if c.name.startswith("checkpoint_restart/30 adds"))
    assert detail.startswith("checkpoint_restart/30 - rollback overhead (rank-time), paired by seed: 40.0 [")
    paper = ccgrid22.verdict(frame, "paper")  # the registered tests decide, on rank-time too
    assert paper.status == "holds" and not any("adds" in c.name for c in paper.checks)
    assert {d["key"] for d in paper.decisions} == {
        "ccgrid22.rollback_keeps_accuracy", "ccgrid22.forward_loses_accuracy_bounded",
        "ccgrid22.forward_faster_than_rollback", "ccgrid22.restart_costs_more"}
    frame.loc[frame.strategy == "checkpoint_restart/30", "rank_overhead_pct"] = 0.0
    failed = ccgrid22.verdict(frame, "small").failed()
    assert failed[0].startswith("checkpoint_restart/30 adds more runtime than rollback")
    assert failed[1].startswith("ccgrid22.restart_costs_more checkpoint_restart/30 - rollback, rank-time pt does not")


@pytest.mark.parametrize("change,finding", [
    ({"strategy": "rollback", "accuracy_loss_pt": 2.5}, "ccgrid22.rollback_keeps_accuracy"),  # rollback loses a share
    ({"strategy": "forward", "accuracy_loss_pt": 4.0}, "ccgrid22.forward_loses_accuracy_bounded"),
    ({"strategy": "forward", "rank_overhead_pct": 30.0}, "ccgrid22.forward_faster_than_rollback"),
])
def test_ccgrid_a_broken_strategy_turns_its_registered_finding_to_does_not_hold(change, finding):
    frame = ccgrid_frame()
    rows = frame.strategy == change.pop("strategy")
    for column, value in change.items():
        frame[column] = frame[column].astype(float)
        frame.loc[rows, column] = value + frame.loc[rows, "seed"] * 0.1  # some spread: an interval, not a point
    v = ccgrid22.verdict(frame, "paper")
    assert {d["key"] for d in v.decisions if d["status"] == "does not hold"} == {finding}
    assert v.status == "does not hold"
    with pytest.raises(AssertionError, match=finding):
        v.require()


def test_ccgrid_pairs_each_strategy_with_the_same_failures_over_the_mtbf_axis():
    frame = pd.concat([ccgrid_frame().assign(mtbf=60), ccgrid_frame().assign(mtbf=150)], ignore_index=True)
    frame.loc[(frame.mtbf == 150) & (frame.strategy == "checkpoint_restart/30"), "rank_overhead_pct"] -= 20
    v = ccgrid22.verdict(frame, "paper")
    restart = next(d for d in v.decisions if d["key"] == "ccgrid22.restart_costs_more")
    assert restart["n"] == 4 and restart["mean"] == pytest.approx(30.0)  # 4 seeds, each one's MTBF rows averaged
    stats = ccgrid22.statistics(frame)
    assert sorted(stats.mtbf.unique()) == [60, 150] and len(stats) == 6
    assert len(ccgrid22.curve(frame).data) == 6  # per strategy: overhead and accuracy against 1000 / MTBF


def test_ccgrid_time_lost_is_the_resumes_plus_the_redone_steps_at_the_runs_own_pace():
    class Result:
        failures = [{"resume_s": 0.2}, {"resume_s": 0.3}]
        summary = {"steps_redone_total": 10}

        def to_dataframe(self):
            return pd.DataFrame({"step_time": [0.01, 0.02, 0.03, 5.0, None]})  # a slow step does not set the pace

    assert ccgrid22.lost_time(Result()) == pytest.approx(0.5 + 10 * 0.025)


# -- EuroMPI'17 -----------------------------------------------------------------------------------------------------
def test_kills_are_distinct_ranks_at_evenly_spaced_steps():
    assert europmpi17.kills(8, 200, 3) == ["kill:rank=7,step=50", "kill:rank=0,step=100", "kill:rank=5,step=150"]
    assert europmpi17.kills(8, 200, 0) == []
    assert europmpi17.kills(4, 100, 2, offset=15) == ["kill:rank=3,step=48", "kill:rank=0,step=81"]


# -- GossipGraD -----------------------------------------------------------------------------------------------------
def gossip_frame(gossip_messages=(3, 3)):
    rows = []
    for seed in range(3):
        for (p, gm, am) in zip((2, 4), gossip_messages, (4, 12)):
            rows.append({"parallelism": "data", "world_size": p, "seed": seed, "outcome": "completed", "reason": "",
                         "plateau_accuracy": 0.95, "messages": am, "bytes_sent": 1e5,
                         "consensus_early": None, "consensus_late": None})
            rows.append({"parallelism": "gossip", "world_size": p, "seed": seed, "outcome": "completed",
                         "reason": "", "plateau_accuracy": 0.955, "messages": gm, "bytes_sent": 1e5,
                         "consensus_early": 0.1, "consensus_late": 0.1, "diffusion_rounds": p.bit_length() - 1,
                         "spread_before": 0.2, "spread_after": 0.0})
    return pd.DataFrame(rows)


def test_gossip_accuracy_is_the_mean_of_the_last_three_evaluations():
    steps = pd.DataFrame({"test_acc": [0.1, None, 0.5, None, 0.7, 0.4, None, 0.8]})
    assert gossipgrad.plateau_accuracy(steps) == pytest.approx((0.7 + 0.4 + 0.8) / 3)
    assert gossipgrad.plateau_accuracy(pd.DataFrame({"test_acc": [None]})) is None


def test_gossip_holds_and_fails_when_its_messages_grow_with_p():
    assert gossipgrad.verdict(gossip_frame(), "small").status == "holds"
    broken = gossipgrad.verdict(gossip_frame((3, 6)), "small")
    assert [c.name for c in broken.checks if not c.ok] == ["gossip: messages per rank per step constant in p"]


@pytest.mark.parametrize("gossip_accuracy,status", [
    ((0.949, 0.952, 0.95), "holds"),              # within the registered margin: the lower bound above -1 pt
    ((0.92, 0.925, 0.915), "does not hold"),      # 2.5-3.5 pt worse at every seed: a gossip that skips rounds
    ((0.99, 0.90, 0.96), "inconclusive"),         # too noisy to tell: no longer a pass by absence of evidence
])
def test_gossip_accuracy_is_the_registered_non_inferiority_test(gossip_accuracy, status):
    frame = gossip_frame()
    for seed, acc in enumerate(gossip_accuracy):
        frame.loc[(frame.parallelism == "gossip") & (frame.seed == seed), "plateau_accuracy"] = acc
    v = gossipgrad.verdict(frame, "paper")
    assert {d["key"] for d in v.decisions} == {"gossipgrad.accuracy_non_inferior"}
    assert {d["status"] for d in v.decisions} == {status} and v.status == status
    if status == "does not hold":
        with pytest.raises(AssertionError, match="accuracy_non_inferior p=2 does not hold"):
            v.require()
    else:
        v.require()  # inconclusive is reported, not a failure of the notebook
    v.require_mechanism()  # the small scale's assertion: the mechanism holds in every case


def test_gossip_decides_on_the_reading_its_workload_names():
    frame = gossip_frame().assign(consensus_accuracy=0.95, accuracy_reading="consensus_accuracy")
    frame.loc[frame.parallelism == "gossip", "consensus_accuracy"] = 0.92  # the consensus model is 3 pt worse
    assert gossipgrad.verdict(frame, "paper").status == "does not hold"
    assert gossipgrad.verdict(frame.assign(accuracy_reading="plateau_accuracy"), "paper").status == "holds"


class FakeGossipRun:
    """What the campaign reads of a run: its summary, outcome and per-step frame."""

    def __init__(self, settings):
        self.settings, self.outcome = settings, "completed"
        self.summary = {"reason": "", "final_test_accuracy": 0.9, "oversubscribed": False,
                        "diffusion": {"rounds": 2, "before": 0.1, "after": 0.0, "test_acc": 0.91}}

    def to_dataframe(self):
        return pd.DataFrame({"step": [0, 1], "step_time": [0.1, 0.1], "rank_step_time": [0.1, 0.1],
                             "test_acc": [None, 0.9], "consensus_distance": [0.1, 0.1], "messages": [3, 3],
                             "bytes_sent": [10, 10]})


def test_the_gossip_campaign_runs_its_workloads_schedule_batch_per_rank_and_reading(tmp_path, monkeypatch):
    runs = []
    monkeypatch.setattr(gossipgrad, "cached_run", lambda directory, **kw: runs.append(kw) or FakeGossipRun(kw))
    frame, _ = gossipgrad.campaign("small", tmp_path, per_rank_batch=16, seeds=[0])
    assert {(r["world_size"], r["batch_size"], r["lr_schedule"]) for r in runs} == {(2, 32, "cosine"),
                                                                                   (4, 64, "cosine")}
    assert set(frame.accuracy_reading) == {"consensus_accuracy"}
    assert sorted(frame.consensus_accuracy) == [0.9, 0.9, 0.91, 0.91]  # allreduce: its model; gossip: consensus
    with pytest.raises(ValueError, match="accuracy 'best' is not a reading"):
        gossipgrad.campaign("small", tmp_path, accuracy="best")


def test_gossip_without_consensus_data_fails_its_check():
    frame = gossip_frame()
    frame.loc[frame.parallelism == "gossip", "consensus_late"] = None
    v = gossipgrad.verdict(frame, "small")
    assert [c.name for c in v.checks if not c.ok] == ["gossip replicas stay close (consensus distance does not grow)"]
    assert "missing data fails" in v.failed()[0]


@pytest.mark.parametrize("spread_after,missing", [(0.05, False), (None, True)])
def test_gossip_whose_replicas_stay_apart_after_log2_p_rounds_does_not_hold(spread_after, missing):
    """A gossip that skips a round (tests/test_gossip_diffusion.py measures one) leaves its replicas apart after
    ceil(log2 p) rounds; a campaign without the measurement fails the finding too."""
    frame = gossip_frame()
    frame.loc[(frame.parallelism == "gossip") & (frame.world_size == 4), "spread_after"] = spread_after
    v = gossipgrad.verdict(frame, "small")
    failed = [c for c in v.checks if not c.ok]
    assert [c.name.split(":")[0] for c in failed] == ["gossipgrad.diffusion_in_log_p"] and v.status == "does not hold"
    assert ("measured over training's partners in 3 of 6" in failed[0].detail) == missing
    with pytest.raises(AssertionError, match="diffusion_in_log_p"):
        v.require_mechanism()


def test_gossip_diffusion_measured_over_the_schedules_partners_not_trainings_fails_its_check():
    """The rounds must replay the partners the ranks exchanged in training (a rank-side schedule that skips a round
    is seen only so, tests/test_reproduce_planted.py): a run measured over the schedule function's counts as
    unmeasured."""
    frame = gossip_frame().assign(diffusion_partners="trained")
    assert gossipgrad.verdict(frame, "small").checks[-1].ok
    frame.loc[(frame.parallelism == "gossip") & (frame.world_size == 4), "diffusion_partners"] = "schedule"
    check = gossipgrad.verdict(frame, "small").checks[-1]
    assert not check.ok and "measured over training's partners in 3 of 6" in check.detail, check


def test_the_report_shows_the_registration_and_fails_make_reproduce_when_a_finding_does_not_hold(tmp_path, capsys):
    from workbench.campaigns.reproduce import report

    for key, accuracy in (("gossipgrad", 0.92), ("apoptosis", None)):
        frame = gossip_frame()
        frame.loc[frame.parallelism == "gossip", "plateau_accuracy"] = accuracy or 0.95
        gossipgrad.verdict(frame, "paper").save(tmp_path / key)
    assert report.main([str(tmp_path)]) == 1  # gossipgrad does not hold; three findings not run
    err = capsys.readouterr().err
    assert "does not hold or not run: ccgrid22, jpdc24, europmpi17, gossipgrad" in err
    page = (tmp_path / "report.html").read_text()
    assert "pre-registered in <code>workbench/campaigns/reproduce/registry.yaml</code>, commit " in page
    assert "registered: gossipgrad.accuracy_non_inferior" in page and "results from commit" in page




# -- the report -----------------------------------------------------------------------------------------------------
def test_report_shows_each_verdict_and_lists_the_findings_not_run(tmp_path):
    import plotly.graph_objects as go

    v = ccgrid22.verdict(ccgrid_frame(), "small")
    v.save(tmp_path / "ccgrid22" / "point-1", figures=[go.Figure(go.Scatter(x=[1], y=[2]))])
    page = write_report(tmp_path).read_text()
    assert "holds" in page and "rollback loses no samples" in page and html.escape(v.paper) in page
    assert page.count("not run") >= 4  # the other four findings
    assert json.loads((tmp_path / "ccgrid22" / "point-1" / "verdict.json").read_text())["status"] == "holds"


def test_bad_campaign_input_is_one_clear_error_before_any_run(tmp_path):
    from workbench.base.errors import ConfigError

    with pytest.raises(ConfigError, match=r"^scale: 'medium' is not a scale of this campaign; choose one of small, "
                                          r"paper$"):
        gossipgrad.campaign("medium", out=tmp_path)
    with pytest.raises(ConfigError, match=r"unknown campaign setting\(s\) sedes; this campaign's are model, dataset, "
                                          r"worlds, seeds"):
        ccgrid22.campaign("small", out=tmp_path, sedes=[1])
    with pytest.raises(ConfigError, match=r"cannot shrink this model \(--model resnet20\)"):
        apoptosis.campaign("small", out=tmp_path, model="resnet20")  # before the runs without apoptosis
    assert not any(tmp_path.iterdir())


def test_ccgrid_counts_the_samples_lost_from_what_each_committed_update_summed():
    class Run:
        def __init__(self, samples):
            self.frame = pd.DataFrame({"step": [s for s, _ in samples], "samples": [n for _, n in samples]})

        def to_dataframe(self):
            return self.frame

    base = Run([(0, 64), (1, 64), (2, 64), (3, 64)])
    redone = Run([(0, 64), (1, 64), (2, 48), (2, 64), (3, 64)])  # step 2 reported short, then redone whole
    assert ccgrid22.samples_missing(redone, base) == 0
    assert ccgrid22.samples_missing(Run([(0, 64), (1, 48), (2, 64), (3, 64)]), base) == 16  # a share dropped
    assert ccgrid22.samples_missing(Run([(0, 64), (1, 64), (3, 64)]), base) == 64  # a step never committed
    frame = ccgrid_frame()
    frame = frame.assign(samples_missing=frame.samples_lost)  # the data agree with the strategies' counts
    assert ccgrid22.verdict(frame, "small").status == "holds"
    frame.loc[frame.strategy == "rollback", "samples_missing"] = 16  # the strategy's flag says 0: the data do not
    broken = ccgrid22.verdict(frame, "small")
    assert [c.name for c in broken.checks if not c.ok] == ["rollback loses no samples (world 4)"]
    assert broken.checks[0].mechanism and "entered no committed update" in broken.checks[0].detail
    # forward's check reads the data too: its flag says 32 samples lost a run, but none are missing from the updates
    frame = ccgrid_frame()
    frame = frame.assign(samples_missing=frame.samples_lost.where(frame.strategy != "forward", 0))
    broken = ccgrid22.verdict(frame, "small")
    assert [c.name for c in broken.checks if not c.ok] == ["forward drops the dead ranks' share (world 4)"]
    assert "0 samples lost (from the samples each update summed; the strategy counts 128)" in broken.checks[1].detail
