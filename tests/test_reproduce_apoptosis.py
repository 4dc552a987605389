"""The apoptosis reproduction's verdict (workbench.campaigns.reproduce.apoptosis) on synthetic campaign frames: the
registered findings (registry.yaml, ``apoptosis``) hold on numbers in the paper's direction, and each broken one
(an accuracy cost, a run that did not shrink, too few seeds) gives its status; the paper scale is the registry's
workload with reporting seeds drawn at run time. The campaign itself runs in its notebook (nbval, small scale)."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from workbench.campaigns.reproduce import apoptosis, registry
from workbench.campaigns.reproduce.common import campaign_settings

CHANGES = [0.3, -0.2, 0.1, 0.0, 0.4, -0.1, 0.2, 0.1]  # accuracy change with apoptosis per seed, points
RATIOS = [0.62, 0.70, 0.66, 0.75, 0.68, 0.64, 0.71, 0.69]  # training time with / without, rank-time clock

@pytest.fixture(autouse=True)
def _the_registered_rule_alone(monkeypatch):
    """These tests check each finding's registered rule on synthetic tables; an underpowered or descriptive finding's
    power note (it changes no status) is tests/test_stats_power.py's."""
    from workbench.campaigns.reproduce import power

    monkeypatch.setattr(power, "powered", lambda finding, decision: decision)



def frame(seeds: int = 8, cost: float = 0.0, reduction: list[float] | None = None, faster: float = 1.0) -> pd.DataFrame:
    """A campaign's rows at world 4: off, on (reduction, accuracy change - cost, ratio / faster) and threshold
    only."""
    rows = []
    for k in range(seeds):
        shrink = (reduction or [4.0] * seeds)[k]
        for arm, red, change, ratio in [("off", 1.0, 0.0, 1.0), ("on", shrink, CHANGES[k] - cost, RATIOS[k] / faster),
                                        ("threshold only (lasso=0)", 1.1, 0.0, 0.98)]:
            rows.append({"arm": arm, "world_size": 4, "seed": 1000 + k, "outcome": "completed", "reason": "",
                         "reduction": red, "accuracy_change_pt": change, "time_ratio": ratio,
                         "log_speedup": -math.log(ratio)})
    return pd.DataFrame(rows)


def statuses(verdict) -> dict[str, str]:
    return {d["key"]: d["status"] for d in verdict.decisions}


def test_a_correct_campaign_holds():
    verdict = apoptosis.verdict(frame(), "paper")  # 1.45x faster: the secondary paper_magnitude does not hold
    assert statuses(verdict) == {"apoptosis.accuracy_kept": "holds", "apoptosis.training_faster": "holds",
                                 "apoptosis.paper_magnitude": "does not hold"}
    assert all(c.ok for c in verdict.checks) and verdict.status == "holds"  # a secondary finding does not turn it
    assert any(c.name.startswith("fewer_parameters") for c in verdict.checks)
    verdict.require()


def test_an_apoptosis_costing_three_points_does_not_keep_accuracy():
    verdict = apoptosis.verdict(frame(cost=3.0), "paper")
    assert statuses(verdict)["apoptosis.accuracy_kept"] == "does not hold"
    assert statuses(verdict)["apoptosis.training_faster"] == "holds"
    assert verdict.status == "does not hold"
    with pytest.raises(AssertionError, match="accuracy_kept"):
        verdict.require()
    verdict.require_mechanism()  # the mechanism worked: the finding is what failed


def test_too_few_seeds_are_inconclusive():
    verdict = apoptosis.verdict(frame(seeds=1), "paper")
    assert set(statuses(verdict).values()) == {"inconclusive"}
    assert verdict.status == "inconclusive"
    two = apoptosis.verdict(frame(seeds=2), "paper")  # +0.3 and -0.2 pt: an interval far wider than the margin
    assert statuses(two)["apoptosis.accuracy_kept"] == "inconclusive"


def test_the_threshold_only_arm_is_required_at_both_scales_since_it_was_restored(tmp_path):
    without = frame()[lambda f: f.arm != "threshold only (lasso=0)"]
    for scale in ("small", "paper"):  # the registry's ablation: true since the 2026-11-28 arms deviation
        failed = [c.name for c in apoptosis.verdict(without, scale).checks if not c.ok]
        assert failed == ["the threshold-only ablation (lasso=0) is reported"], scale
    assert apoptosis.SCALES["small"]["ablation"] is True
    assert campaign_settings(apoptosis.KEY, apoptosis.SCALES, "paper", tmp_path, {})["ablation"] is True
    assert apoptosis.verdict(frame(), "paper").status == "holds"


@pytest.mark.parametrize("faster,status", [(2.5, "holds"), (1.6, "does not hold")])
def test_the_papers_magnitude_is_a_secondary_finding_decided_from_the_same_runs(faster, status):
    """paper_magnitude: the log speed-up against log 2 (the paper's >= 2x), one-sided, from the on arm's runs; it
    is reported whatever it shows and the verdict does not turn on it."""
    ratios = [1 / (faster * (1 + 0.02 * (k % 3 - 1))) for k in range(8)]  # about `faster`, +-2 %
    table = frame()
    table.loc[table.arm == "on", "log_speedup"] = [-math.log(r) for r in ratios]
    verdict = apoptosis.verdict(table, "paper")
    decision = next(d for d in verdict.decisions if d["key"] == "apoptosis.paper_magnitude")
    assert decision["status"] == status and decision.get("secondary") is True
    assert abs(decision["mean"] - math.log(faster)) < 0.01 and (decision["low"] > math.log(2)) == (status == "holds")
    assert statuses(verdict)["apoptosis.training_faster"] == "holds" and verdict.status == "holds"
    finding = registry.load().finding("apoptosis.paper_magnitude")
    assert (finding.kind, finding.test, round(finding.margin, 6)) == ("secondary", "superiority", round(math.log(2), 6))
    assert "secondary: apoptosis.paper_magnitude" in verdict.summary()


def test_every_arm_of_the_campaign_flushes_subnormals_alike(monkeypatch, tmp_path):
    """The flush was the apoptosis arm's alone (issue #46): every arm now runs with the same flush_denormal."""
    from types import SimpleNamespace

    from workbench.config.run import RunConfig

    seen = []

    def fake_run(directory, **settings):
        seen.append(settings)
        summary = {"reason": "", "final_test_accuracy": 0.8, "parameters": {"start": 100, "end": 25},
                   "train_s": 1.0, "rank_train_s": 1.0}
        return SimpleNamespace(summary=summary, completed=True, outcome="completed")

    monkeypatch.setattr(apoptosis, "cached_run", fake_run)
    monkeypatch.setattr(apoptosis, "preflight", lambda *runs: None)
    table = apoptosis.campaign("small", tmp_path)
    assert set(table.arm) == set(apoptosis.ARMS) and len(seen) == 6
    assert all(s["flush_denormal"] is True for s in seen)
    assert RunConfig(apoptosis=None).flushes_denormals is False  # a run's default: the flush goes with apoptosis
    assert RunConfig(apoptosis="on").flushes_denormals is True
    assert RunConfig(apoptosis=None, flush_denormal=True).flushes_denormals is True
    for key in ("apoptosis", "apoptosis_replication"):
        workload = registry.load().workload(key)
        assert workload["flush_denormal"] is True and workload["ablation"] is True, key


def test_a_run_that_did_not_shrink_three_times_fails_fewer_parameters():
    verdict = apoptosis.verdict(frame(reduction=[4.0, 4.2, 2.5, 3.9, 4.1, 3.6, 3.3, 5.0]), "paper")
    failed = [c.name for c in verdict.checks if not c.ok]
    assert failed == ["fewer_parameters: the parameters shrink >= 3x in every run"]
    assert "/ 2.50 at least (world 4, seed 1002)" in next(c.detail for c in verdict.checks if not c.ok)
    assert verdict.status == "does not hold"
    with pytest.raises(AssertionError, match="fewer_parameters"):
        verdict.require_mechanism()


def test_a_failed_run_fails_the_mechanism():
    broken = frame()
    broken.loc[(broken.arm == "on") & (broken.seed == 1003), ["outcome", "reason"]] = ["failed", "rank 2 died"]
    verdict = apoptosis.verdict(broken, "small")
    assert not verdict.checks[0].ok and "seed 1003: rank 2 died" in verdict.checks[0].detail
    with pytest.raises(AssertionError, match="every run completes"):
        verdict.require_mechanism()


def test_the_paper_scale_is_the_registered_workload_on_drawn_seeds(tmp_path):
    workload = registry.load().workload("apoptosis")
    settings = campaign_settings(apoptosis.KEY, apoptosis.SCALES, "paper", tmp_path, {})
    assert settings["reporting"] and {k: settings[k] for k in workload} == workload
    assert (workload["model"], workload["dataset"], workload["width"]) == ("vgg11", "synthetic_faint", 0.25)
    replication = registry.load().workload("apoptosis_replication")  # the same keys: the same campaign runs it
    assert set(replication) == set(workload) and replication["model"] == "alexnet"
    assert "relative=1" in workload["apoptosis"]  # conv channels are pressed as hard as fully connected units
    assert set(apoptosis.SCALES["small"]) | {"seeds"} == set(workload) | {"seeds"}  # the same keys at both scales
    seeds = settings["seeds"]
    assert len(seeds) == registry.load().seed_count("apoptosis") >= 6 and not any(0 <= s <= 1000 for s in seeds)
    assert campaign_settings(apoptosis.KEY, apoptosis.SCALES, "paper", tmp_path, {})["seeds"] == seeds  # kept
    tuning = campaign_settings(apoptosis.KEY, apoptosis.SCALES, "paper", tmp_path, {"seeds": [12]})
    assert not tuning["reporting"] and tuning["seeds"] == [12]


def test_every_arm_trains_on_the_same_samples(tmp_path):
    """The run without apoptosis, the threshold-only control and the setting differ in the treatment alone: each
    holds out the rule's validation split and folds it back at the same step, so every step's global batch has the
    same sample ids (its checksum) in all three; a run with apoptosis unset, as the off arm once was, trains on all
    the training data and draws other batches until the split is folded back."""
    import pandas as pd

    import workbench
    from workbench.config.run import RunConfig

    settings = campaign_settings(apoptosis.KEY, apoptosis.SCALES, "small", tmp_path, {"steps": 40, "worlds": [1]})
    rule = RunConfig(apoptosis=settings["apoptosis"]).apoptosis_rule
    fold = next(s for s in range(40) if rule.folded(s, 40, 2))
    assert 0 < fold < 39  # the run trains on the held-out split's remainder, then on everything

    def run(name: str, setting: str | None) -> pd.DataFrame:
        result = workbench.run(**apoptosis.arm_run(settings, 1, setting), seed=10, out=tmp_path / name)
        assert result.completed, result.summary["reason"]
        return pd.DataFrame(result.metrics).set_index("step")

    arms = {arm: run(arm.split(" ")[0], apoptosis.arm_setting(arm, settings["apoptosis"])) for arm in apoptosis.ARMS}
    off = arms["off"]
    assert len(off) == 40 and off.sample_checksum.notna().all()
    for arm, metrics in arms.items():
        assert metrics.sample_checksum.tolist() == off.sample_checksum.tolist(), arm
    unset = run("unset", None)
    assert (unset.sample_checksum != off.sample_checksum).tolist() == [step < fold for step in range(40)]


def test_the_run_without_apoptosis_removes_and_presses_nothing_at_either_scale(tmp_path):
    import torch

    from workbench.config.run import RunConfig
    from workbench.workloads.apoptosis.rule import Apoptosis

    for scale in ("small", "paper"):
        frozen = campaign_settings(apoptosis.KEY, apoptosis.SCALES, scale, tmp_path / scale, {})["apoptosis"]
        rules = {arm: RunConfig(apoptosis=apoptosis.arm_setting(arm, frozen)).apoptosis_rule for arm in apoptosis.ARMS}
        for arm, rule in rules.items():  # what decides the data: the split and the step it is folded back at
            assert [getattr(rule, k) for k in ("val", "fold", "until", "window")] == [
                getattr(rules["on"], k) for k in ("val", "fold", "until", "window")], (scale, arm)
        off = rules["off"]
        assert off.lasso == 0 and not any(off.pressure_due(s, 600) for s in range(600))
        state = Apoptosis(off, {"fc": 64})
        for _ in range(20):  # every unit far below any tolerance, evaluation after evaluation: none is removed
            removed = state.observe({"fc": (torch.zeros(64), torch.zeros(64))}, 0.9)
            assert not len(removed["fc"])
        assert rules["on"].lasso > 0 and rules["threshold only (lasso=0)"].min < 64
