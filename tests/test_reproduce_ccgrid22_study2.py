"""CCGrid'22's second study (registry.yaml, ``ccgrid22_study2``): its campaign runs the accepted workload as it was
measured, each seed at one MTBF of the axis with the same failures for every strategy, within the workload's
campaign_runs; its verdict decides the study's own findings (the secondary one beside them)."""

from __future__ import annotations

import pandas as pd
import pytest

from workbench.campaigns.reproduce import ccgrid22, registry, run_study

KEY = "ccgrid22_study2"


class FakeRun:
    def __init__(self, settings):
        self.settings = settings
        faulty = bool(settings.get("faults"))
        self.completed, self.outcome = True, "completed"
        self.failures = [{"resume_s": 0.5}] if faulty else []
        self.summary = {"reason": "", "train_s": 60.0, "rank_train_s": 16.0 + faulty, "final_test_accuracy": 0.91,
                        "steps_redone_total": 0, "samples_lost_total": 0}

    def to_dataframe(self):
        return pd.DataFrame({"step": [0, 1], "step_time": [0.02, 0.02], "samples": [100, 100],
                             "sample_checksum": [1.0, 2.0]})


def test_the_registered_campaign_runs_the_accepted_workload_within_its_runs(tmp_path, monkeypatch):
    reg = registry.load()
    section = reg.papers[KEY]
    assert reg.study(KEY) == 2 and reg.paper_of(KEY) == "ccgrid22" and reg.folder(KEY) == "ccgrid22/study2"
    assert section["accepted_workload"] == "mnist1d_cnn_3000" and reg.attempt_alpha(1, KEY) == 0.0125
    runs = []
    monkeypatch.setattr(ccgrid22, "cached_run", lambda directory, **kw: runs.append(kw) or FakeRun(kw))
    seeds = list(range(reg.seed_count(KEY)))  # tuning seeds in place of the reporting ones: the same plan
    frame = ccgrid22.campaign("paper", tmp_path, entry=KEY, seeds=seeds)
    assert len(runs) == section["campaign_runs"] == reg.workloads["mnist1d_cnn_3000"]["measured"]["campaign_runs"]
    accepted = reg.workloads["mnist1d_cnn_3000"]["settings"]
    for run in runs:  # every run trains the accepted workload as it was measured
        assert {k: run[k] for k in accepted} == accepted
    axis = reg.workload(KEY)["mtbf"]
    for index, seed in enumerate(seeds):  # each seed at one MTBF, in turn; its strategies meet the same failures
        faulty = {r["faults"][0] for r in runs if r["seed"] == seed and r.get("faults")}
        assert faulty == {f"random:mtbf_steps={axis[index % len(axis)]},seed={seed},max=8"}
        assert len([r for r in runs if r["seed"] == seed]) == 1 + 3
    assert sorted(frame.strategy.unique()) == ["checkpoint_restart/500", "forward", "rollback"]


def test_the_studys_verdict_decides_its_own_findings(monkeypatch):
    from workbench.campaigns.reproduce import power

    monkeypatch.setattr(power, "powered", lambda finding, decision: decision)
    rows = []
    for seed in range(6):
        for label, over, loss in [("checkpoint_restart/100", 40 + seed, 0.1 * seed), ("rollback", 2 + 0.1 * seed,
                                  0.05 * seed - 0.1), ("forward", 1 + 0.1 * seed, 0.2 - 0.03 * seed)]:
            rows.append({"strategy": label, "world_size": 4, "seed": seed, "mtbf": [500, 1000][seed % 2],
                         "outcome": "completed", "reason": "", "failures": 3, "baseline_outcome": "completed",
                         "baseline_reason": "", "overhead_pct": over, "rank_overhead_pct": over, "lost_s": 0.1,
                         "accuracy_loss_pt": loss, "steps_redone": 30 if label.startswith("check") else 0,
                         "samples_lost": 75 if label == "forward" else 0, "samples_missing": 75 if label == "forward"
                         else 0, "baseline_accuracy": 0.91})
    v = ccgrid22.verdict(pd.DataFrame(rows), "paper", entry=KEY)
    decided = {d["key"]: d for d in v.decisions}
    assert set(decided) == {f"{KEY}.{name}" for name in ("rollback_keeps_accuracy", "forward_loses_accuracy_bounded",
                                                        "forward_trades_accuracy", "forward_faster_than_rollback",
                                                        "restart_costs_more")}
    assert decided[f"{KEY}.forward_trades_accuracy"]["secondary"] is True
    assert v.key == KEY and v.title.endswith("study 2")
    assert all(d["n"] == 6 for d in v.decisions)  # one pair per seed: each seed ran at one MTBF
    # the secondary finding does not turn the verdict
    assert v.status == registry.overall(d["status"] for d in v.decisions if not d.get("secondary"))


@pytest.mark.parametrize("key,says", [("no_such_study", "no registry entry 'no_such_study'"),
                                      ("jpdc24", "runs its own registration only")])
def test_run_study_refuses_what_it_cannot_run(key, says, capsys):
    assert run_study.main([key, "--out", "unused"]) == 2
    assert says in capsys.readouterr().err
