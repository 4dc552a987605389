"""A paper's second study (registry.yaml, ``<paper>_study2``): registered with a fresh attempt budget on an accepted
workload, checked as strictly as the paper's own section (every refusal below names what is wrong), and archived
beside study 1's records without touching how those are decided and shown."""

from __future__ import annotations

import pytest

from workbench.campaigns.reproduce import history, registry
from workbench.campaigns.reproduce.registry import RegistryError

# a planted study 2 of CCGrid'22, appended to the committed registry's papers (the file's last mapping)
STUDY = """
  ccgrid22_study9:
    study: 9
    of: ccgrid22
    title: "planted study"
    registered: {date: "2026-12-07", note: "planted by a test"}
    accepted_workload: mnist1d_cnn_3000
    attempts: {budget: 2, spending: [0.0125, 0.0125]}
    campaign_runs: 40
    workload: {mtbf: [500, 1000], max_failures: 6, intervals: [100], elastic: [rollback, forward],
               timing: rank_overhead_pct}
    failure_free: {accuracy: 0.926, measured: {4: [0.913, 0.926]}, source: "planted"}
    reporting_seeds: 10
    findings:
      - id: rollback_keeps_accuracy
        paper: "rollback recovers without loss of progress"
        ours: "rollback's accuracy is equivalent to the failure-free run's within 1 point"
        metric: final_test_accuracy (percentage points)
        clock: none
        effect: "rollback - failure-free, paired by seed"
        test: equivalence
        margin: 1.0
        power: {sesoi: 0.0, sd: 0.8, sd_source: "planted", alpha: 0.0125, n_required: 11, n_registered: 10}
      - id: restart_costs_more
        paper: "checkpoint-restart costs more runtime"
        ours: "checkpoint_restart's rank-time overhead exceeds rollback's"
        metric: rank_train_s (% of the failure-free run of the same seed)
        clock: rank
        effect: "checkpoint_restart - rollback, paired by seed"
        test: superiority
        margin: 0.0
        power: {sesoi: 20.0, sd: 10.0, sd_source: "planted", alpha: 0.0125, n_required: 6, n_registered: 10}
"""
KEY = "ccgrid22_study9"


def planted(tmp_path, old: str = "", new: str = "", study: str = STUDY):
    if old:  # a change to the planted study alone
        assert study.count(old) == 1, old
        study = study.replace(old, new)
    path = tmp_path / "registry.yaml"
    path.write_text(registry.REGISTRY_FILE.read_text().rstrip("\n") + "\n" + study)
    return path


def test_a_study_has_its_own_budget_workload_and_folder(tmp_path):
    reg = registry.load(planted(tmp_path))
    assert reg.study(KEY) == 9 and reg.study("ccgrid22") == 1 and reg.paper_of(KEY) == "ccgrid22"
    assert reg.studies("ccgrid22") == ["ccgrid22_study2", KEY] and reg.campaign_of(KEY) == "ccgrid22"
    assert reg.folder(KEY) == "ccgrid22/study9" and reg.folder("ccgrid22") == "ccgrid22"
    # a fresh budget: its own spending, not the paper's (which study 1 has begun to spend)
    assert [reg.attempt_alpha(k, KEY) for k in (1, 2, 3)] == [0.0125, 0.0125, None]
    assert [reg.attempt_alpha(k, "ccgrid22") for k in (1, 2, 3, 4)] == [0.0125, 0.00625, 0.00625, None]
    # the accepted workload's settings as measured, the study's own campaign settings beside them
    workload = reg.workload(KEY)
    accepted = reg.workloads["mnist1d_cnn_3000"]["settings"]
    assert workload["worlds"] == [accepted["world_size"]] and "world_size" not in workload
    assert {k: workload[k] for k in ("model", "dataset", "steps", "optimizer", "lr", "lr_schedule", "batch_size")} \
        == {k: accepted[k] for k in ("model", "dataset", "steps", "optimizer", "lr", "lr_schedule", "batch_size")}
    assert workload["mtbf"] == [500, 1000]
    assert reg.ceiling(KEY)[0] == "mnist1d"
    # study 1 reads as it did: the same section, the same workload
    assert reg.workload("ccgrid22") == registry.load().workload("ccgrid22")


@pytest.mark.parametrize("old,new,message", [
    ("accepted_workload: mnist1d_cnn_3000", "accepted_workload: synthetic_image",
     "accepted_workload 'synthetic_image' is not an accepted workload; accepted: mnist1d_cnn_3000"),
    ("    accepted_workload: mnist1d_cnn_3000\n", "", "is not an accepted workload"),
    ("workload: {mtbf: [500, 1000],", "workload: {model: lenet5, mtbf: [500, 1000],",
     "its workload sets model, which its accepted workload mnist1d_cnn_3000 fixes"),
    ("workload: {mtbf: [500, 1000],", "workload: {steps: 300, worlds: [8], mtbf: [500, 1000],",
     "its workload sets steps, worlds, which"),
    ("        margin: 1.0\n        power: {sesoi: 0.0, sd: 0.8,", "        power: {sesoi: 0.0, sd: 0.8,",
     "finding ccgrid22_study9.rollback_keeps_accuracy: missing margin"),
    ("        test: equivalence\n", "", "finding ccgrid22_study9.rollback_keeps_accuracy: missing test"),
    ("test: equivalence", "test: about_the_same", "test 'about_the_same' is not one of"),
    ("    attempts: {budget: 2, spending: [0.0125, 0.0125]}\n", "", "needs attempts, its own budget"),
    ("spending: [0.0125, 0.0125]}", "spending: [0.025, 0.0125]}", "sums to 0.0375, more than alpha 0.025"),
    ("campaign_runs: 40", "campaign_runs: 41", "campaign_runs 41 must be an integer from 1 to 40"),
    ("    campaign_runs: 40\n", "", "campaign_runs None must be an integer"),
    ("sd: 0.8, sd_source: \"planted\", ", "sd: 0.8, ", "its power block needs sd_source"),
    ("sd: 0.8, sd_source: \"planted\", alpha: 0.0125, n_required: 11", "sd: 0.8, sd_source: \"planted\", "
     "alpha: 0.0125, n_required: 4", "power n_required 4 is not what its numbers give \\(11\\)"),
    ("sd: 10.0, sd_source: \"planted\", alpha: 0.0125,", "sd: 10.0, sd_source: \"planted\", alpha: 0.00625,",
     "power alpha 0.00625 is none of its study's attempts'"),
    ("        power: {sesoi: 20.0, sd: 10.0, sd_source: \"planted\", alpha: 0.0125, n_required: 6, n_registered: 10}\n",
     "", "restart_costs_more: its power block needs sesoi"),
    ("    of: ccgrid22\n", "    of: nopaper\n", "of 'nopaper' is not a registered paper's own registration"),
    ("    of: ccgrid22\n", "    of: gossipgrad_replication\n", "of 'gossipgrad_replication' is not a registered"),
    ("    study: 9\n", "    study: 1\n", "study 1 must be an integer >= 2"),
    ("    study: 9\n", "    study: 8\n", "numbered 8 is registered as ccgrid22_study8"),
    ("    study: 9\n", "    study: 9\n    replicates: ccgrid22\n", "a study is not a replication"),
    ("    registered: {date: \"2026-12-07\", note: \"planted by a test\"}\n", "", "needs registered"),
    ("    failure_free: {accuracy: 0.926, measured: {4: [0.913, 0.926]}, source: \"planted\"}\n", "",
     "compares accuracy on mnist1d: its paper needs failure_free"),
    ("failure_free: {accuracy: 0.926, measured: {4: [0.913, 0.926]}",
     "failure_free: {accuracy: 0.95, measured: {4: [0.913, 0.95]}", "sits 3.8 pt below the ceiling"),
])
def test_a_study_is_checked_as_strictly_as_the_papers_own_section(tmp_path, old, new, message):
    with pytest.raises(RegistryError, match=message):
        registry.load(planted(tmp_path, old, new))


def test_a_descriptive_finding_of_a_study_says_why(tmp_path):
    block = "power: {sesoi: 20.0, sd: 10.0, sd_source: \"planted\", alpha: 0.0125, n_required: 6, n_registered: 10}"
    assert registry.load(planted(tmp_path, block, "power: {descriptive: true, reason: \"planted\"}"))
    with pytest.raises(RegistryError, match="power needs sesoi"):  # descriptive without a reason: the paper rule
        registry.load(planted(tmp_path, block, "power: {descriptive: true}"))


def test_a_studys_run_is_archived_beside_study_1_at_its_own_first_attempt(tmp_path, monkeypatch):
    """A study's reporting run claims attempt 1 of its own budget although its paper has archived runs, writes its
    record below the paper's folder (archive/ccgrid22/study9/), and study 1's records, their decisions and their
    history line read as before; the report shows the study right after its paper."""
    import pandas as pd

    from workbench.campaigns.reproduce.common import Verdict
    from workbench.campaigns.reproduce.report import write_report

    reg = registry.load(planted(tmp_path))
    monkeypatch.setattr(registry, "load", lambda *args, **kwargs: reg)
    archive, out = tmp_path / "archive", tmp_path / "out"
    (archive / "ccgrid22").mkdir(parents=True)
    [study1] = history.records("ccgrid22")  # the committed record of study 1, copied into a scratch archive
    (archive / "ccgrid22" / "01-study1.json").write_text(open(study1["path"]).read())
    before = (history.history_line(history.records("ccgrid22", archive), "ccgrid22"),
              [history.decided(r) for r in history.records("ccgrid22", archive)])
    assert history.history_line([], KEY).endswith("not run yet (no record archived)")
    assert "study 9 of ccgrid22" in history.pending(KEY)

    seeds = history.claim(out, registry.seeds_of(out, KEY), archive)
    assert (seeds["paper"], seeds["attempt"], seeds["alpha"]) == (KEY, 1, 0.0125)
    verdict = Verdict(KEY, "planted study", "", "paper")
    verdict.check("a mechanism", True, "", mechanism=True)
    verdict.decide(f"{KEY}.rollback_keeps_accuracy", [0.1, -0.2, 0.05, 0.0, 0.15, -0.1], "rollback - failure-free",
                   reference=0.91)
    verdict.decide(f"{KEY}.restart_costs_more", [30.0, 25.0, 41.0, 28.0, 35.0, 33.0], "restart - rollback")
    table = pd.DataFrame({"seed": seeds["seeds"][:6], "reporting": True})
    verdict.save(out, table=table, archive=archive)

    [kept] = history.records(KEY, archive)
    assert kept["path"].startswith(str(archive / "ccgrid22" / "study9" / "01-"))
    assert (kept["attempt"], kept["alpha"], kept["study"], kept["of"]) == (1, 0.0125, 9, "ccgrid22")
    assert kept["workload"]["model"] == "mnist1d_cnn" and kept["accepted_workload"] == "mnist1d_cnn_3000"
    assert history.status(kept) == "holds" and history.history_line([kept], KEY) == "holds (design 1)"
    after = (history.history_line(history.records("ccgrid22", archive), "ccgrid22"),
             [history.decided(r) for r in history.records("ccgrid22", archive)])
    assert after == before and len(history.records(root=archive)) == 2
    assert history.registered_papers()[:3] == ["ccgrid22", "ccgrid22_study2", KEY]
    page = write_report(tmp_path / "runs", archive=archive).read_text()
    assert page.index(f"ccgrid22, study 9 ({KEY}): holds (design 1)") > page.index("ccgrid22: inconclusive (design 1)")
    # every verdict line names its distance from the paper: ours (model, data, ranks, steps) and the paper's
    theirs = "the paper&#x27;s: model, data, ranks, steps: not in what was read (the abstract only)"
    assert (f"<i>Distance from the paper:</i> ours: mnist1d_cnn on mnist1d, 4 ranks, 3000 steps; {theirs}"
            in page)
    assert (f"<i>Distance from the paper:</i> ours: lenet5 (batch norm) on synthetic_image (8192 images), world 4, "
            f"300 steps; {theirs}" in page)
    assert history.distance("jpdc24").endswith("the paper's: not registered (registry sources)")
