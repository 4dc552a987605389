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


def test_the_archived_run_keeps_its_seeds_table_and_verdicts_and_came_after_its_registration():
    """The study's first reporting run (archive/ccgrid22/study2/): attempt 1 of its own budget, its seeds drawn at run
    time outside the tuning range, the registration it ran under committed before it and unchanged since, every run
    in its table, and its verdicts as decided: deciding the table again gives the recorded intervals."""
    import subprocess
    from pathlib import Path

    from workbench.campaigns.reproduce import history

    reg = registry.load()
    [record] = history.records(KEY)
    assert Path(record["path"]).parent == history.ARCHIVE_DIR / "ccgrid22" / "study2"
    assert (record["attempt"], record["alpha"], record["study"], record["of"]) == (1, 0.0125, 2, "ccgrid22")
    seeds = record["seeds"]["seeds"]
    assert len(set(seeds)) == reg.seed_count(KEY) == 10 and not any(s <= 1000 for s in seeds)
    assert registry.registered_at(KEY, record["registry_commit"]) is True
    added = subprocess.run(["git", "log", "--diff-filter=A", "--format=%H", "--", record["path"]],
                           capture_output=True, text=True, check=True).stdout.split()
    assert added and registry.precedes(record["registry_commit"], added[-1]) is True
    assert record["registry_commit"] != added[-1]  # registered in an earlier commit than its record
    table = pd.DataFrame(record["table"]["data"], columns=record["table"]["columns"])
    assert len(table) == 30 and table.reporting.all() and sorted(table.seed.unique()) == sorted(seeds)
    assert len(table) + table.seed.nunique() == reg.papers[KEY]["campaign_runs"]  # each row beside its seed's reference
    again = ccgrid22.verdict(table, "paper", entry=KEY)
    again.spend(record["alpha"], 1)
    for mine, kept in zip(again.decisions, record["findings"], strict=True):
        assert (mine["key"], mine["status"], mine["n"]) == (kept["key"], kept["status"], kept["n"])
        assert (mine["mean"], mine["low"], mine["high"]) == pytest.approx((kept["mean"], kept["low"], kept["high"]))
    assert history.status(record) == record["status"] == again.status == "inconclusive"
    page = (Path(__file__).resolve().parents[1] / "docs" / "reproduce.md").read_text()
    assert f"| CCGrid'22, study 2 | {history.history_line([record], KEY)} |" in page
    assert len(page.splitlines()) <= 250
