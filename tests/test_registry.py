"""The pre-registration (workbench/campaigns/reproduce/registry.yaml): the file checks, every test decides as registered
(holds, does not hold, inconclusive) and can fail, the seeds for reporting are fresh, the commit is found."""

import math
import subprocess
from dataclasses import asdict

import pytest

from workbench.campaigns.reproduce import registry
from workbench.campaigns.reproduce.registry import FAILS, HOLDS, INCONCLUSIVE, Finding, RegistryError


def finding(test, margin):
    return Finding("paper", "claim", "", "", "", "none", "", test, margin, 0.025)


def test_the_committed_registry_loads_and_names_every_paper_and_seed_rule():
    reg = registry.load()
    assert set(reg.papers) == {"ccgrid22", "gossipgrad", "jpdc24", "europmpi17", "apoptosis", "gossipgrad_replication",
                               "apoptosis_replication", "ccgrid22_study2"}
    assert all(f.alpha == 0.025 and f.test in registry.TESTS for f in reg.findings.values())
    assert reg.finding("gossipgrad.accuracy_non_inferior").test == "non_inferiority"
    with pytest.raises(RegistryError, match="no finding 'gossipgrad.nope' is registered"):
        reg.finding("gossipgrad.nope")
    low, high = reg.tuning_seeds
    seeds = registry.reporting_seeds(reg)
    assert len(set(seeds)) == reg.reporting_seeds["count"] and not any(low <= s <= 1000 for s in seeds)
    assert seeds != registry.reporting_seeds(reg)  # drawn afresh: named nowhere before the run


@pytest.mark.parametrize("test,margin,interval,status", [
    ("non_inferiority", 1.0, (-0.2, -0.9, 0.5), HOLDS),           # the lower bound carries the claim
    ("non_inferiority", 1.0, (-0.5, -1.6, 0.6), INCONCLUSIVE),    # absence of evidence is not enough
    ("non_inferiority", 1.0, (-2.0, -2.5, -1.5), FAILS),
    ("superiority", 0.0, (0.4, 0.1, 0.7), HOLDS),
    ("superiority", 0.0, (0.1, -0.3, 0.5), INCONCLUSIVE),         # noise around 0 passes no more
    ("superiority", 0.0, (-0.4, -0.7, -0.1), FAILS),
    ("equivalence", 1.0, (0.1, -0.6, 0.8), HOLDS),
    ("equivalence", 1.0, (0.5, -0.2, 1.2), INCONCLUSIVE),
    ("equivalence", 1.0, (1.6, 1.1, 2.1), FAILS),
    ("difference", 0.02, (0.05, 0.03, 0.07), HOLDS),
    ("difference", 0.02, (-0.05, -0.07, -0.03), HOLDS),
    ("difference", 0.02, (0.0, -0.01, 0.01), FAILS),              # shown equal within the margin
    ("difference", 0.02, (0.02, -0.01, 0.05), INCONCLUSIVE),
])
def test_each_test_decides_from_the_interval_and_can_fail(test, margin, interval, status):
    assert registry.decide(finding(test, margin), *interval, n=5).status == status


def test_too_few_values_are_inconclusive_and_exact_findings_are_the_campaigns():
    assert registry.paired_decision(finding("superiority", 0.0), [3.0]).status == INCONCLUSIVE
    assert registry.paired_decision(finding("superiority", 0.0), [math.nan, 2.0]).status == INCONCLUSIVE
    decided = registry.paired_decision(finding("superiority", 0.0), [1.0, 1.2, 0.9, 1.1])
    assert decided.status == HOLDS and decided.low > 0 and "95 % interval" in decided.detail
    with pytest.raises(RegistryError, match="is exact"):
        registry.decide(finding("exact", 0.0), 1, 0, 2, n=5)


@pytest.mark.parametrize("text,message", [
    ("papers: [1]", "needs a mapping with 'papers'"),
    ("alpha: 0.7\npapers: {a: {findings: []}}", "alpha 0.7 must be a one-sided level"),
    ("alpha: 0.025\npapers: {a: {findings: [{id: x}]}}", "finding a.x: missing paper, ours"),
    ("alpha: 0.025\npapers: {a: {findings: [{id: x, paper: p, ours: o, metric: m, clock: rank, effect: e, "
     "test: bigger, margin: 0}]}}", "test 'bigger' is not one of superiority"),
    ("alpha: 0.025\npapers: {a: {findings: [{id: x, paper: p, ours: o, metric: m, clock: rank, effect: e, "
     "test: superiority, margin: -1}]}}", "margin -1 must be a number >= 0"),
    ("alpha: 0.025\ntuning_seeds: [0, 9]\nreporting_seeds: {count: 5}\ndeviations: [{date: d}]\n"
     "papers: {a: {workload: {}, findings: [{id: x, paper: p, ours: o, metric: m, clock: rank, effect: e, "
     "test: superiority, margin: 0}]}}", "each deviation needs date, finding, change and why"),
    ("alpha: 0.025\npapers: {a: {findings: [{id: x, paper: p, ours: o, metric: m, clock: rank, effect: e, "
     "test: superiority, margin: 0}]}}", "paper 'a' needs a workload mapping"),
    ("alpha: 0.025\npapers: {a: {workload: {}, reporting_seeds: 1, findings: [{id: x, paper: p, ours: o, "
     "metric: m, clock: rank, effect: e, test: superiority, margin: 0}]}}", "reporting_seeds 1 must be an integer"),
    ("papers: {a: [", "cannot be read as YAML"),
])
def test_a_malformed_registry_is_one_line_naming_what_is_wrong(tmp_path, text, message):
    path = tmp_path / "registry.yaml"
    path.write_text(text)
    with pytest.raises(RegistryError, match=message):
        registry.load(path)


def test_provenance_names_the_commit_that_registered_the_file(tmp_path):
    path = tmp_path / "registry.yaml"
    path.write_text(registry.REGISTRY_FILE.read_text())
    assert registry.provenance(path)["commit"] is None  # not a git checkout
    git = ["git", "-C", str(tmp_path), "-c", "user.email=a@b", "-c", "user.name=a"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "registry.yaml"], check=True)
    subprocess.run([*git, "commit", "-qm", "register"], check=True)
    head = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    found = registry.provenance(path)
    assert found["commit"] == head and found["modified"] is False
    assert found["deviations"] == registry.load(path).deviations
    path.write_text(path.read_text() + "\n# edited\n")
    assert registry.provenance(path)["modified"] is True  # an edit after registering shows


def test_reporting_seeds_are_drawn_once_per_campaign_directory_and_kept(tmp_path):
    first = registry.seeds_of(tmp_path, "gossipgrad")
    reg = registry.load()
    assert len(first["seeds"]) == reg.seed_count("gossipgrad") and first["paper"] == "gossipgrad"
    assert not any(reg.tuning_seeds[0] <= s <= 1000 for s in first["seeds"])
    assert registry.seeds_of(tmp_path, "gossipgrad") == first  # a resumed campaign: the same seeds
    with pytest.raises(RegistryError, match="not ccgrid22's reporting seeds"):
        registry.seeds_of(tmp_path, "ccgrid22")
    (tmp_path / registry.SEEDS_FILE).write_text("{")
    with pytest.raises(RegistryError, match="not a record of reporting seeds"):
        registry.seeds_of(tmp_path, "gossipgrad")
    assert registry.seeds_of(tmp_path / "other", "gossipgrad")["seeds"] != first["seeds"]


def test_the_report_can_tell_whether_the_registration_precedes_the_results():
    import subprocess

    registered = registry.provenance()["commit"]
    head = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    first = subprocess.run(["git", "rev-list", "--max-parents=0", "HEAD"], capture_output=True, text=True,
                           check=True).stdout.split()[0]
    assert registry.precedes(registered, head) is True
    assert registry.precedes(registered, first) is False  # results from before the registration
    assert registry.precedes(None, head) is None and registry.precedes(registered, "0" * 40) is None


def test_results_are_checked_against_the_registration_they_ran_under(tmp_path):
    import subprocess

    def git(*args):
        return subprocess.run(["git", "-C", str(tmp_path), *args], capture_output=True, text=True, check=True).stdout

    git("init", "-q")
    git("config", "user.email", "t@t"), git("config", "user.name", "t")
    path = tmp_path / "registry.yaml"
    text = registry.REGISTRY_FILE.read_text()
    path.write_text(text)
    git("add", "."), git("commit", "-qm", "register")
    first = git("rev-parse", "HEAD").strip()
    path.write_text(text.replace("title: \"GossipGraD", "title: \"GossipGraD (edited)"))
    git("commit", "-qam", "edit gossipgrad")
    assert registry.registered_at("ccgrid22", first, path) is True  # another paper's edit: still in force
    assert registry.registered_at("gossipgrad", first, path) is False  # changed after results of that commit
    path.write_text(text.replace("alpha: 0.025", "alpha: 0.05"))  # a shared rule changed: no paper is
    assert registry.registered_at("ccgrid22", first, path) is False
    assert registry.registered_at("ccgrid22", "0" * 40, path) is None and registry.registered_at("x", None) is None


@pytest.mark.parametrize("successes,trials,sign,status", [
    (0, 230, -1, HOLDS),          # none of 230 not masked: the Wilson upper bound 1.6 % lies below 5 %
    (0, 46, -1, INCONCLUSIVE),    # none of 46: the upper bound 7.7 % straddles 5 %
    (40, 200, -1, FAILS),         # 20 %: wholly above 5 %
    (0, 0, -1, INCONCLUSIVE),     # no trial: no interval
])
def test_a_share_decides_from_its_wilson_interval(successes, trials, sign, status):
    small = finding("non_inferiority", 0.05)  # claim: -share > -0.05, i.e. the share is below 5 %
    decided = registry.share_decision(small, successes, trials, sign)
    assert decided.status == status
    if trials:
        assert decided.mean == pytest.approx(-successes / trials) and decided.low <= decided.mean <= decided.high
        assert decided.n == trials and decided.low < decided.high
    assert registry.share_decision(finding("superiority", 0.5), 90, 100).status == HOLDS  # sign +1: the share


def test_the_registry_names_its_attempt_budget_and_the_alpha_each_attempt_is_given(tmp_path):
    reg = registry.load()
    budget, spending = reg.attempts["budget"], reg.attempts["spending"]
    assert budget == len(spending) == 3 and sum(spending) <= reg.alpha  # a paper's attempts share alpha
    assert [reg.attempt_alpha(k) for k in range(1, budget + 1)] == spending == [0.0125, 0.00625, 0.00625]
    assert reg.attempt_alpha(budget + 1) is None and reg.attempt_alpha(0) is None  # beyond it: exploratory
    text = registry.REGISTRY_FILE.read_text()
    for old, new, message in (("spending: [0.0125, 0.00625, 0.00625]", "spending: [0.025, 0.025, 0.025]",
                               "sums to 0.075, more than alpha 0.025"),
                              ("attempts: {budget: 3,", "attempts: {budget: 2,", "one alpha per attempt"),
                              ("attempts: {", "attempts_not: {", "attempts needs a budget")):
        assert old in text
        path = tmp_path / "registry.yaml"
        path.write_text(text.replace(old, new))
        with pytest.raises(RegistryError, match=message):
            registry.load(path)


def test_a_decision_is_decided_again_at_another_alpha_with_or_without_its_values():
    values = [0.4, -0.6, 0.1, -0.3, 0.2, -0.9, 0.0]
    first = registry.paired_decision(finding("non_inferiority", 1.0), values)
    at = registry.paired_decision(Finding("paper", "claim", "", "", "", "none", "", "non_inferiority", 1.0, 0.00625),
                                  values)
    kept = registry.redecide(finding("non_inferiority", 1.0), asdict(first), 0.00625)
    published = {**asdict(first), "inputs": {}}  # a record of published figures: mean, bounds and n only
    rescaled = registry.redecide(finding("non_inferiority", 1.0), published, 0.00625)
    assert (first.alpha, kept.alpha, rescaled.alpha) == (0.025, 0.00625, 0.00625)
    assert kept.low == pytest.approx(at.low) and rescaled.low == pytest.approx(at.low) and at.low < first.low
    assert rescaled.high == pytest.approx(at.high) and "98.75 % interval" in rescaled.detail
    share = registry.share_decision(finding("non_inferiority", 0.05), 1, 230, -1)
    again = registry.redecide(finding("non_inferiority", 0.05), asdict(share), 0.00625)
    assert again.method == "wilson" and again.low < share.low and again.inputs == share.inputs


def test_each_redesign_is_registered_unchanged_on_a_second_workload_before_its_run(tmp_path):
    """Issue #46: GossipGraD's design 3 and apoptosis's relative pressure, each replicated on a workload it was not
    designed on: the same findings and design settings (a change is refused), another model, its own alpha from the
    attempt budget (its first attempt), a power block per sampled finding, a record only after its registration."""
    from workbench.campaigns.reproduce import history

    reg = registry.load()
    for key, original, model in [("gossipgrad_replication", "gossipgrad", "vgg11"),
                                 ("apoptosis_replication", "apoptosis", "alexnet")]:
        assert reg.replicates(key) == original and reg.campaign_of(key) == original and reg.replicates(original) is None
        assert reg.workload(key)["model"] == model != reg.workload(original)["model"]
        assert reg.papers[key]["registered"]["date"] == "2026-11-28"
        mine = {f.id: f for f in reg.findings.values() if f.paper_key == key}
        theirs = {f.id: f for f in reg.findings.values() if f.paper_key == original}
        assert mine.keys() == theirs.keys()
        for ident, f in mine.items():
            assert (f.test, f.margin, f.metric, f.effect, f.kind) == (theirs[ident].test, theirs[ident].margin,
                                                                     theirs[ident].metric, theirs[ident].effect,
                                                                     theirs[ident].kind), ident
            ran = len(history.records(key))  # its power is for its next attempt's alpha
            assert f.test == "exact" or f.power["alpha"] == reg.attempt_alpha(ran + 1), ident
        assert history.history_line([], key).endswith("not run yet (no record archived)")
    # both ran after their registration (99e29d8) and are kept whatever they showed: neither holds
    for key in ("gossipgrad_replication", "apoptosis_replication"):
        [ran] = history.records(key)
        assert (ran["registry_commit"][:7], ran["status"]) == ("99e29d8", "does not hold")
        assert ran["alpha"] == reg.attempt_alpha(1)
        assert history.history_line([ran], key) == "does not hold (design 1)"
    text = registry.REGISTRY_FILE.read_text()
    for old, new, message in [
        ("per_rank_batch: 16, lr_schedule: cosine, accuracy: consensus_accuracy}\n    failure_free: {accuracy: 0.835",
         "per_rank_batch: 32, lr_schedule: cosine, accuracy: consensus_accuracy}\n    failure_free: {accuracy: 0.835",
         "its design differs from gossipgrad's in per_rank_batch"),
        ("workload: {model: alexnet,", "workload: {model: vgg11,", "not a second workload"),
        ("margin: 0.693147  # log 2\n        power: {sesoi: 0.9163, sd: 0.0831, sd_source: \"its first run's",
         "margin: 0.5\n        power: {sesoi: 0.9163, sd: 0.0831, sd_source: \"its first run's",
         "its findings differ from apoptosis's")]:
        assert text.count(old) == 1, old
        path = tmp_path / "registry.yaml"
        path.write_text(text.replace(old, new))
        with pytest.raises(RegistryError, match=message):
            registry.load(path)
