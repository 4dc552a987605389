"""The pre-registration of the reproductions (``registry.yaml`` beside this module): each finding's test, margin
and alpha, fixed before any reporting run, and the rule that turns a measured effect into a verdict.

:func:`load` reads and checks the file (a :class:`RegistryError` naming the finding and the field), accepted
workloads included; :func:`decide` gives *holds*, *does not hold* or *inconclusive* from an effect's interval,
:func:`redecide` at an attempt's alpha, :func:`ceiling_status` near the ceiling; :func:`overall` a paper's verdict.
A replication (``replicates``) is a paper's design on a second workload; a second study (``<paper>_study2``:
``study: 2``, ``of``) is a registration of its own on an accepted workload with a fresh attempt budget, its records
in ``archive/<paper>/study2/``. Details: docs/reproduce-rules.md.
"""

from __future__ import annotations

import contextvars
import math
import os
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from workbench.base.errors import WorkbenchError
from workbench.base.extras import need
from workbench.campaigns.reproduce.acceptance import CEILING_GAP  # a comparison is made this far below the ceiling
from workbench.campaigns.reproduce.stats import mean_interval
from workbench.config.files import DuplicateKeyError, load_yaml

REGISTRY_FILE = Path(__file__).resolve().with_name("registry.yaml")
HOLDS, FAILS, INCONCLUSIVE = "holds", "does not hold", "inconclusive"
# a "holds" of an accuracy comparison made less than CEILING_GAP below its data set's ceiling: every converged model
# scores alike there, so it says nothing of the claim (:func:`ceiling_status`)
AT_CEILING = "holds at the ceiling: not evidence"
# test -> what it claims of the effect (oriented so that positive favours the claim), given the margin m
TESTS = {
    "superiority": "effect > {m}",
    "non_inferiority": "effect > -{m}",
    "equivalence": "-{m} < effect < {m}",
    "difference": "|effect| > {m}",
    "exact": "counted, not sampled: the campaign's check decides",
}
FINDING_FIELDS = ("id", "paper", "ours", "metric", "clock", "effect", "test", "margin")
CLOCKS = ("wall", "rank", "none")
KINDS = ("finding", "mechanism", "secondary")
# set while workbench.campaigns.reproduce.failure_free measures what a registration's failure_free will say
MEASURING: contextvars.ContextVar[bool] = contextvars.ContextVar("measuring_failure_free", default=False)


class RegistryError(WorkbenchError):
    """The registry is malformed: one line naming where and what is allowed."""


@dataclass(frozen=True)
class Finding:
    """One registered finding: the paper's words, ours, and how it is decided."""

    paper_key: str
    id: str
    paper: str
    ours: str
    metric: str
    clock: str
    effect: str
    test: str
    margin: float
    alpha: float
    # or "mechanism": a check that holds by construction, labelled so; or "secondary": decided and
    # reported, but its paper's verdict does not turn on it
    kind: str = "finding"
    power: dict[str, Any] | None = field(default=None, compare=False)  # its power block (docs/reproduce.md)

    @property
    def key(self) -> str:
        return f"{self.paper_key}.{self.id}"

    @property
    def compares_accuracy(self) -> bool:
        """A sampled comparison of test accuracies: it is made below its data set's ceiling (:func:`ceiling_gap`)."""
        return self.test != "exact" and "accuracy" in self.metric

    @property
    def underpowered(self) -> bool:
        """Descriptive, or registered with fewer than the n its power block requires: said beside its decision,
        which it does not change (:func:`workbench.campaigns.reproduce.power.powered`)."""
        p = self.power or {}
        return bool(p.get("descriptive")) or p.get("n_registered", 0) < p.get("n_required", 0)


@dataclass(frozen=True)
class Decision:
    """A finding decided: its status and the effect's mean and interval (two-sided, 1 - 2 alpha), the alpha, and
    what it was computed from (``method`` t or wilson; ``inputs``: the paired values, or successes of trials), so
    that it can be decided again at another alpha (:func:`redecide`)."""

    status: str
    mean: float
    low: float
    high: float
    n: int
    detail: str = ""
    alpha: float = math.nan
    method: str = "t"
    inputs: dict[str, Any] = field(default_factory=dict)


@dataclass
class Registry:
    alpha: float
    findings: dict[str, Finding]
    papers: dict[str, dict[str, Any]]
    tuning_seeds: tuple[int, int]
    reporting_seeds: dict[str, Any]
    deviations: list[dict[str, Any]] = field(default_factory=list)
    attempts: dict[str, Any] = field(default_factory=lambda: {"budget": 1, "spending": [0.025]})
    ceilings: dict[str, dict[str, Any]] = field(default_factory=dict)  # dataset -> its registered ceiling
    workloads: dict[str, dict[str, Any]] = field(default_factory=dict)  # accepted workloads (acceptance.py)
    # paper -> what it ran its claims on as far as the sources read say (model, data, ranks, steps; None: not read)
    sources: dict[str, dict[str, Any]] = field(default_factory=dict)

    def ceiling(self, paper: str) -> tuple[str, dict[str, Any] | None, dict[str, Any] | None]:
        """``paper``'s workload's dataset, its registered ceiling and the failure-free accuracy registered beside
        it (measured on tuning seeds at the registered budget); None where either is not registered."""
        dataset = str(self.workload(paper).get("dataset"))
        return dataset, self.ceilings.get(dataset), self.papers[paper].get("failure_free")

    def attempts_of(self, paper: str | None = None) -> dict[str, Any]:
        """The attempt budget ``paper``'s reporting runs share: a study's own (``attempts`` in its section, a fresh
        budget), else the registry's."""
        own = self.papers.get(paper, {}).get("attempts") if paper is not None else None
        return own if isinstance(own, dict) else self.attempts

    def attempt_alpha(self, attempt: int, paper: str | None = None) -> float | None:
        """The one-sided alpha registered for a paper's ``attempt``-th reporting run (1-based: its record number in
        the archive, :mod:`workbench.campaigns.reproduce.history`); None beyond the attempt budget (an exploratory
        run). ``paper``: a second study counts its attempts in its own budget (:meth:`attempts_of`)."""
        spending = self.attempts_of(paper)["spending"]
        return float(spending[attempt - 1]) if 1 <= attempt <= len(spending) else None

    def replicates(self, paper: str) -> str | None:
        """The paper whose design ``paper`` replicates unchanged on a second workload (its ``replicates``), or
        None for a paper's own registration."""
        return self.papers.get(paper, {}).get("replicates")

    def study(self, paper: str) -> int:
        """Which study of its paper the registration ``paper`` is: 1 for a paper's own registration (and a
        replication), its ``study`` number for a later study."""
        return int(self.papers.get(paper, {}).get("study") or 1)

    def paper_of(self, paper: str) -> str:
        """The paper a registration belongs to: a study's ``of``, else the key itself."""
        return str(self.papers.get(paper, {}).get("of") or paper)

    def studies(self, paper: str) -> list[str]:
        """The later studies registered of ``paper`` (their keys), in study order."""
        found = [key for key, section in self.papers.items() if section.get("of") == paper and section.get("study")]
        return sorted(found, key=self.study)

    def folder(self, paper: str) -> str:
        """Where ``paper``'s records go in the archive, relative to it: ``<paper>`` for a paper's own registration
        and a replication, ``<of>/study<N>`` for a later study (beside, not among, study 1's records)."""
        return f"{self.paper_of(paper)}/study{self.study(paper)}" if self.study(paper) > 1 else paper

    def campaign_of(self, paper: str) -> str:
        """The campaign module that runs ``paper``'s registration: a replication's original's, a study's paper's."""
        return self.replicates(paper) or self.paper_of(paper)

    def workload(self, paper: str) -> dict[str, Any]:
        """The paper scale of ``paper``'s campaign as registered: its settings (model, dataset, worlds, steps, ...),
        a copy; RegistryError when the paper is not registered. A study's are its accepted workload's settings (its
        world size as ``worlds``) with its own campaign settings beside them."""
        if paper not in self.papers:
            raise RegistryError(f"no paper {paper!r} is registered; registered: {', '.join(self.papers)}")
        section = self.papers[paper]
        accepted = section.get("accepted_workload")
        if accepted is None:
            return dict(section["workload"])
        if accepted not in self.workloads:
            raise RegistryError(f"{paper}: accepted_workload {accepted!r} is not an accepted workload")
        return {**accepted_settings(self.workloads[accepted]), **section["workload"]}

    def seed_count(self, paper: str) -> int:
        """How many reporting seeds ``paper``'s campaign draws (its own count, else the registry's)."""
        return int(self.papers.get(paper, {}).get("reporting_seeds") or self.reporting_seeds["count"])

    def finding(self, key: str) -> Finding:
        """``paper.id``; RegistryError naming the registered keys when it is not one."""
        if key not in self.findings:
            raise RegistryError(f"no finding {key!r} is registered; registered: {', '.join(self.findings)}")
        return self.findings[key]


def load(path: str | os.PathLike = REGISTRY_FILE) -> Registry:
    """Read and check the registry (see the module docstring)."""
    import yaml

    path = Path(path)
    try:
        data = load_yaml(path.read_text())
    except DuplicateKeyError as exc:
        raise RegistryError(f"{path}: {exc}: give each key once") from None
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise RegistryError(f"{path}: cannot be read as YAML: {str(exc).splitlines()[0]}") from None
    if not isinstance(data, dict) or not isinstance(data.get("papers"), dict):
        raise RegistryError(f"{path}: needs a mapping with 'papers'")
    alpha = _alpha(data.get("alpha"), "alpha")
    findings: dict[str, Finding] = {}
    for paper_key, paper in data["papers"].items():
        rows = paper.get("findings") if isinstance(paper, dict) else None
        if not isinstance(rows, list) or not rows:
            raise RegistryError(f"{path}: paper {paper_key!r} needs a non-empty list of findings")
        for row in rows:
            finding = _finding(paper_key, row, alpha)
            if finding.key in findings:
                raise RegistryError(f"{path}: finding {finding.key!r} is registered twice")
            findings[finding.key] = finding
        _check_paper(path, paper_key, paper)
    low, high = _seed_range(data.get("tuning_seeds"))
    reporting = data.get("reporting_seeds")
    if not isinstance(reporting, dict) or not isinstance(reporting.get("count"), int) or reporting["count"] < 2:
        raise RegistryError(f"{path}: reporting_seeds needs a count of at least 2 (and how they are drawn)")
    deviations = data.get("deviations") or []
    if not isinstance(deviations, list) or not all(isinstance(d, dict) and {"date", "finding", "change", "why"}
                                                   <= set(d) for d in deviations):
        raise RegistryError(f"{path}: each deviation needs date, finding, change and why")
    reg = Registry(alpha, findings, data["papers"], (low, high), reporting, deviations,
                   _attempts(path, data.get("attempts"), alpha), _ceilings(path, data.get("ceilings")),
                   _workloads(path, data.get("workloads"), data.get("ceilings") or {}),
                   _sources(path, data.get("sources"), data["papers"]))
    for key in reg.papers:  # a later study first: its workload is its accepted workload's
        if {"study", "of", "accepted_workload"} & set(reg.papers[key]):
            _check_study(path, reg, key)
    for finding in findings.values():
        if finding.compares_accuracy:
            _check_ceiling(path, reg, finding)
    for key in reg.papers:
        if reg.replicates(key) is not None:
            _check_replication(path, reg, key)
    return reg


def accepted_settings(entry: dict[str, Any]) -> dict[str, Any]:
    """An accepted workload's settings (registry ``workloads``) as a campaign's: its ``world_size`` as ``worlds``."""
    settings = dict(entry["settings"])
    return {"worlds": [settings.pop("world_size")], **settings}


# what every sampled finding of a study states of its power (a descriptive one: descriptive and its reason)
STUDY_POWER = ("sesoi", "sd", "sd_source", "alpha", "n_required", "n_registered")


def required_n(finding: Finding) -> int | None:
    """The n its power block's numbers give for 80 % power at the block's alpha: pairs for a t decision
    (:func:`workbench.campaigns.reproduce.stats.n_paired`), trials for a Wilson share (:func:`~.stats.n_share`)."""
    from workbench.campaigns.reproduce import stats

    p = finding.power or {}
    level = float(p.get("alpha", finding.alpha))
    if p.get("share"):
        return stats.n_share(float(p["sesoi"]), finding.margin, level)
    return stats.n_paired(float(p["sd"]), float(p["sesoi"]), finding.margin, finding.test, level)


def _check_study(path: Path, reg: Registry, key: str) -> None:
    """A later study of a paper is checked as strictly as the paper's own registration (its findings, ceiling and
    failure-free accuracy went through the same checks) and besides: it is ``<of>_study<N>`` with N >= 2 of a
    paper's own registration, dated (``registered``) before any run, on an accepted workload it does not alter, with
    a fresh attempt budget of its own, a campaign within the workload's ``campaign_runs``, and a power block for
    every sampled finding whose n is the one its numbers give, at one of its own attempts' alphas."""
    section = reg.papers[key]
    number, paper = section.get("study"), section.get("of")
    where = f"{path}: study {key!r}"
    if section.get("replicates") is not None:
        raise RegistryError(f"{where}: a study is not a replication: give study and of, or replicates, not both")
    if isinstance(number, bool) or not isinstance(number, int) or number < 2:
        raise RegistryError(f"{where}: study {number!r} must be an integer >= 2 (study 1 is the paper's own section)")
    own = reg.papers.get(paper) if isinstance(paper, str) else None
    if not isinstance(own, dict) or own.get("study") or own.get("of") or own.get("replicates"):
        raise RegistryError(f"{where}: of {paper!r} is not a registered paper's own registration")
    if key != f"{paper}_study{number}":
        raise RegistryError(f"{where}: a study of {paper} numbered {number} is registered as {paper}_study{number}")
    registered = section.get("registered")
    if not (isinstance(registered, dict) and registered.get("date") and registered.get("note")):
        raise RegistryError(f"{where}: needs registered (its date and a note), written before any of its runs")
    accepted = section.get("accepted_workload")
    if accepted not in reg.workloads:
        raise RegistryError(f"{where}: accepted_workload {accepted!r} is not an accepted workload; accepted: "
                            f"{', '.join(reg.workloads) or 'none'} (registry workloads)")
    fixed = set(accepted_settings(reg.workloads[accepted])) | {"world", "world_size"}
    altered = sorted(fixed & set(section["workload"]))
    if altered:
        raise RegistryError(f"{where}: its workload sets {', '.join(altered)}, which its accepted workload "
                            f"{accepted} fixes: a study runs an accepted workload as it was measured")
    if not isinstance(section.get("attempts"), dict):
        raise RegistryError(f"{where}: needs attempts, its own budget and spending (a fresh budget: a study does "
                            "not spend its paper's)")
    try:
        section["attempts"] = _attempts(path, section["attempts"], reg.alpha)
    except RegistryError as exc:
        raise RegistryError(f"{where}: {str(exc).removeprefix(f'{path}: ')}") from None
    runs, most = section.get("campaign_runs"), reg.workloads[accepted]["measured"].get("campaign_runs")
    if isinstance(runs, bool) or not isinstance(runs, int) or runs < 1 or (isinstance(most, int) and runs > most):
        raise RegistryError(f"{where}: campaign_runs {runs!r} must be an integer from 1 to {most}, the most runs a "
                            f"study on {accepted} may have (its measured campaign_runs)")
    findings = [f for f in reg.findings.values() if f.paper_key == key]
    spending = section["attempts"]["spending"]
    for finding in findings:
        if finding.test == "exact" or finding.kind == "mechanism":
            continue
        p = finding.power or {}
        at = f"{where}: finding {finding.key}"
        if p.get("descriptive"):
            if not p.get("reason"):
                raise RegistryError(f"{at}: a descriptive finding says why (power: reason)")
            continue
        missing = [name for name in STUDY_POWER if name not in p]
        if missing:
            raise RegistryError(f"{at}: its power block needs {', '.join(missing)} (from tuning seeds on "
                                f"{accepted})")
        if not any(abs(float(p["alpha"]) - level) < 1e-12 for level in spending):
            raise RegistryError(f"{at}: power alpha {p['alpha']} is none of its study's attempts' ({spending})")
        if p["n_required"] != required_n(finding):
            raise RegistryError(f"{at}: power n_required {p['n_required']} is not what its numbers give "
                                f"({required_n(finding)})")


REPLICATED = ("id", "metric", "clock", "effect", "test", "margin", "kind")  # what a replication keeps unchanged


def _check_replication(path: Path, reg: Registry, key: str) -> None:
    """A replication registers its original's design unchanged: the same findings (their test, margin, metric and
    effect) and the workload settings it names as the design (``design``) alike, with a date (``registered``) and
    a workload other than the original's (its model or data set)."""
    paper, original = reg.papers[key], reg.replicates(key)
    where = f"{path}: replication {key!r}"
    if original not in reg.papers or reg.replicates(original) is not None:
        raise RegistryError(f"{where}: replicates {original!r}, which is not a registered paper's own registration")
    registered = paper.get("registered")
    if not (isinstance(registered, dict) and registered.get("date") and isinstance(paper.get("design"), list)
            and paper["design"]):
        raise RegistryError(f"{where}: needs registered (its date and a note) and design (the workload settings kept "
                            "unchanged)")
    mine, theirs = reg.workload(key), reg.workload(original)
    changed = [name for name in paper["design"] if mine.get(name) != theirs.get(name)]
    if changed:
        raise RegistryError(f"{where}: its design differs from {original}'s in {', '.join(changed)}")
    if all(mine.get(name) == theirs.get(name) for name in ("model", "dataset")):
        raise RegistryError(f"{where}: runs {original}'s model on its data set: not a second workload")

    def rules(paper_key: str) -> list[tuple[Any, ...]]:
        found = [f for f in reg.findings.values() if f.paper_key == paper_key]
        return sorted(tuple(getattr(f, name) for name in REPLICATED) for f in found)

    if rules(key) != rules(original):
        raise RegistryError(f"{where}: its findings differ from {original}'s (each finding's "
                            f"{', '.join(REPLICATED)} must read alike)")


SOURCE_FIELDS = ("model", "data", "ranks", "steps")  # what a paper ran on: its verdicts' distance names each


def _sources(path: Path, value: Any, papers: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """What each paper ran its claims on (``sources``): per registered paper its model, data, ranks and steps (None
    where the sources read do not say) and what was read."""
    value = value or {}
    for name, source in value.items() if isinstance(value, dict) else [("sources", None)]:
        if name not in papers or not (isinstance(source, dict) and source.get("read")
                                      and all(key in source for key in SOURCE_FIELDS)):
            raise RegistryError(f"{path}: sources: {name!r} needs to be a registered paper with "
                                f"{', '.join(SOURCE_FIELDS)} (null where not read) and read (what was read)")
    return dict(value)


def _ceilings(path: Path, value: Any) -> dict[str, dict[str, Any]]:
    """Each dataset's registered accuracy ceiling (workbench.workloads.ceiling): accuracy, method and what it is."""
    value = value or {}
    for name, ceiling in value.items() if isinstance(value, dict) else [("ceilings", None)]:
        if not (isinstance(ceiling, dict) and isinstance(ceiling.get("accuracy"), float)
                and 0 < ceiling["accuracy"] <= 1 and ceiling.get("method") and ceiling.get("source")):
            raise RegistryError(f"{path}: ceilings: {name!r} needs an accuracy (0-1), its method and its source")
    return dict(value)


def _workloads(path: Path, value: Any, ceilings: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The accepted workloads: each must be able to show an effect (acceptance.check: converged, 5 pt below its
    ceiling, a small seed spread, a campaign within the hour); while one is being measured, only its settings."""
    from workbench.campaigns.reproduce import acceptance

    if value is not None and not isinstance(value, dict):
        raise RegistryError(f"{path}: workloads must map a name to its settings and measured figures")
    for name, entry in (value or {}).items():
        try:
            if MEASURING.get():
                acceptance.check_settings(name, entry, str(path))
            else:
                acceptance.check(name, entry, ceilings, str(path))
        except acceptance.WorkloadRefused as exc:
            raise RegistryError(str(exc)) from None
    return dict(value or {})


def _check_ceiling(path: Path, reg: Registry, finding: Finding) -> None:
    """Refuse an accuracy comparison without a ceiling, without its failure-free accuracy, or whose failure-free
    model is registered within :data:`CEILING_GAP` of the ceiling: there every converged model scores alike, which
    favours "equal accuracy"."""
    dataset, ceiling, free = reg.ceiling(finding.paper_key)
    where = f"{path}: finding {finding.key} compares accuracy on {dataset}"
    if ceiling is None:
        raise RegistryError(f"{where}: register the data set's ceiling under ceilings (workbench/workloads/ceiling.py)")
    if not (isinstance(free, dict) and isinstance(free.get("accuracy"), float) and free.get("source")):
        raise RegistryError(f"{where}: its paper needs failure_free (the accuracy and its source, tuning seeds "
                            "at the registered budget)")
    if MEASURING.get():  # the measurement that will fill failure_free in: the rest is checked once it has
        return
    workload = reg.workload(finding.paper_key)
    worlds = workload.get("worlds") or [workload.get("world")]
    measured = free.get("measured")
    shown = [a for w in worlds for a in (measured or {}).get(w) or []] if isinstance(measured, dict) else []
    if not (isinstance(measured, dict) and all(measured.get(w) for w in worlds)
            and all(isinstance(a, float) and 0 <= a <= 1 for a in shown)):
        raise RegistryError(f"{where}: failure_free needs measured, each registered world size ({worlds}) to the "
                            "failure-free accuracies (0-1) of its tuning seeds at the registered budget "
                            "(python -m workbench.campaigns.reproduce.failure_free)")
    if abs(free["accuracy"] - max(shown)) > 1e-9:
        raise RegistryError(f"{where}: failure_free accuracy {free['accuracy']} is not the highest measured "
                            f"({max(shown)}): the comparison is judged at its nearest to the ceiling")
    gap = ceiling["accuracy"] - free["accuracy"]
    if gap < CEILING_GAP:
        raise RegistryError(f"{where}: the failure-free model ({100 * free['accuracy']:.1f} %) sits "
                            f"{100 * gap:.1f} pt below the ceiling ({100 * ceiling['accuracy']:.1f} %), less than "
                            f"{100 * CEILING_GAP:g}: refused (every converged model meets the ceiling there)")


def ceiling_gap(reg: Registry, finding: Finding, reference: float | None = None,
                dataset: str | None = None, source: str = "measured") -> dict[str, Any] | None:
    """An accuracy comparison beside its ceiling: the data set, the ceiling, the failure-free accuracy (the measured
    ``reference``, a fraction, else the registered one), the gap and whether it is ``near`` the ceiling (less than
    :data:`CEILING_GAP` below it); the words the report prints. None for a finding that compares no accuracy.
    ``dataset``: the data set the comparison ran on where it is not the registered workload's (an archived run of
    an earlier design); the registered failure-free accuracy does not speak for it. ``source``: where ``reference``
    comes from, in words. A comparison with no ceiling or no accuracy to set beside it is ``near``: it is not shown
    below its ceiling."""
    if not finding.compares_accuracy:
        return None
    registered, ceiling, free = reg.ceiling(finding.paper_key)
    if dataset is not None and dataset != registered:
        ceiling, free = reg.ceilings.get(dataset), None
    dataset = dataset or registered
    if ceiling is None:
        return {"dataset": dataset, "near": True, "line": f"no ceiling registered for {dataset}"}
    measured = reference is not None
    if not measured and not isinstance((free or {}).get("accuracy"), float):
        return {"dataset": dataset, "ceiling": ceiling["accuracy"], "near": True,
                "line": f"no accuracy of the compared arm recorded beside {dataset}'s ceiling "
                        f"{100 * ceiling['accuracy']:.1f} %: not shown below it"}
    accuracy = float(reference) if measured else float(free["accuracy"])
    gap = ceiling["accuracy"] - accuracy
    near = not gap >= CEILING_GAP
    line = (f"failure-free {100 * accuracy:.1f} % ({source if measured else 'registered, tuning seeds'}) "
            f"beside {dataset}'s ceiling {100 * ceiling['accuracy']:.1f} % ({ceiling['method']}): "
            f"{100 * gap:.1f} pt below" + (f"; NEAR THE CEILING (less than {100 * CEILING_GAP:g} pt)" if near else ""))
    return {"dataset": dataset, "ceiling": ceiling["accuracy"], "failure_free": accuracy, "gap": gap, "near": near,
            "line": line}


def _attempts(path: Path, value: Any, alpha: float) -> dict[str, Any]:
    """The attempt budget and the alpha each attempt is given: ``spending``, one alpha per attempt, summing to at
    most the registry's alpha (the one-sided error a paper's reporting runs share)."""
    budget = value.get("budget") if isinstance(value, dict) else None
    spending = value.get("spending") if isinstance(value, dict) else None
    if not (isinstance(budget, int) and not isinstance(budget, bool) and budget >= 1 and isinstance(spending, list)
            and len(spending) == budget):
        raise RegistryError(f"{path}: attempts needs a budget (an integer >= 1) and spending, one alpha per attempt")
    levels = [_alpha(level, "attempts: spending") for level in spending]
    if sum(levels) > alpha + 1e-12:
        raise RegistryError(f"{path}: attempts: spending {levels} sums to {sum(levels):g}, more than alpha {alpha:g}")
    return {**value, "spending": levels}


def _check_paper(path: Path, key: str, paper: dict[str, Any]) -> None:
    if not isinstance(paper.get("workload"), dict):
        raise RegistryError(f"{path}: paper {key!r} needs a workload mapping (its campaign's paper scale)")
    count = paper.get("reporting_seeds")
    if count is not None and (not isinstance(count, int) or isinstance(count, bool) or count < 2):
        raise RegistryError(f"{path}: paper {key!r}: reporting_seeds {count!r} must be an integer >= 2")


def _finding(paper_key: str, row: Any, alpha: float) -> Finding:
    where = f"finding {paper_key}.{row.get('id', '?') if isinstance(row, dict) else '?'}"
    if not isinstance(row, dict):
        raise RegistryError(f"{where}: needs a mapping with {', '.join(FINDING_FIELDS)}")
    missing = [name for name in FINDING_FIELDS if name not in row]
    if missing:
        raise RegistryError(f"{where}: missing {', '.join(missing)}")
    if row["test"] not in TESTS:
        raise RegistryError(f"{where}: test {row['test']!r} is not one of {', '.join(TESTS)}")
    if row["clock"] not in CLOCKS:
        raise RegistryError(f"{where}: clock {row['clock']!r} is not one of {', '.join(CLOCKS)}")
    margin = row["margin"]
    if isinstance(margin, bool) or not isinstance(margin, (int, float)) or not 0 <= margin < math.inf:
        raise RegistryError(f"{where}: margin {margin!r} must be a number >= 0")
    own = _alpha(row.get("alpha", alpha), f"{where}: alpha")
    kind, power = row.get("kind", "finding"), row.get("power")
    if kind not in KINDS:
        raise RegistryError(f"{where}: kind {kind!r} is not one of {', '.join(KINDS)}")
    needed = {"sesoi", "sd", "n_required", "n_registered"}
    if power is not None and not (isinstance(power, dict) and (
            power.get("descriptive") and power.get("reason") or needed <= set(power))):
        raise RegistryError(f"{where}: power needs sesoi, sd, sd_source, n_required and n_registered, or descriptive "
                            "with a reason")
    return Finding(paper_key, str(row["id"]), str(row["paper"]), str(row["ours"]), str(row["metric"]),
                   row["clock"], str(row["effect"]), row["test"], float(margin), own, kind, power)


def ceiling_status(status: str, gap: dict[str, Any] | None) -> str:
    """The ceiling rule: a *holds* made near the ceiling (:func:`ceiling_gap`) is :data:`AT_CEILING`; any other
    status stands (an interval past the margin does not hold wherever it was measured)."""
    return AT_CEILING if gap and gap["near"] and status == HOLDS else status


def below_ceiling(decided: Decision, gap: dict[str, Any] | None) -> Decision:
    """``decided`` with its ceiling said in its detail and the ceiling rule applied (:func:`ceiling_status`)."""
    if not gap:
        return decided
    return replace(decided, status=ceiling_status(decided.status, gap), detail=f"{decided.detail}; {gap['line']}")


def overall(statuses: Iterable[str]) -> str:
    """A verdict from the statuses of the findings it turns on (its checks passed): does not hold where one does
    not, inconclusive where one straddles its margin, :data:`AT_CEILING` where one holds only at the ceiling (a
    paper does not hold on such findings), holds where every one holds."""
    found = set(statuses)
    return next((s for s in (FAILS, INCONCLUSIVE, AT_CEILING) if s in found), HOLDS)


def _alpha(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < 0.5:
        raise RegistryError(f"{where} {value!r} must be a one-sided level between 0 and 0.5 (e.g. 0.025)")
    return float(value)


def _seed_range(value: Any) -> tuple[int, int]:
    if not (isinstance(value, list) and len(value) == 2 and all(isinstance(v, int) for v in value)
            and value[0] <= value[1]):
        raise RegistryError(f"tuning_seeds {value!r} must be [first, last], the range every named seed lies in")
    return value[0], value[1]


# -- deciding ------------------------------------------------------------------------------------------------------
def decide(finding: Finding, mean: float, low: float, high: float, n: int) -> Decision:
    """The verdict of ``finding`` from its effect's interval [low, high] (two-sided at 1 - 2 alpha; the effect
    oriented so that positive favours the claim): *holds* when the whole interval lies on the claim's side of the
    margin, *does not hold* when it lies wholly on the other side, *inconclusive* when it straddles a bound (or
    fewer than 2 values measured it)."""
    m = finding.margin
    if finding.test == "exact":
        raise RegistryError(f"finding {finding.key} is exact: its campaign's check decides it, not an interval")
    if n < 2 or any(math.isnan(v) for v in (mean, low, high)):
        return Decision(INCONCLUSIVE, float(mean), float(low), float(high), n, f"{n} value(s): no interval")
    if finding.test == "superiority":
        status = HOLDS if low > m else FAILS if high <= m else INCONCLUSIVE
    elif finding.test == "non_inferiority":
        status = HOLDS if low > -m else FAILS if high <= -m else INCONCLUSIVE
    elif finding.test == "equivalence":
        status = HOLDS if -m < low and high < m else FAILS if low >= m or high <= -m else INCONCLUSIVE
    else:  # difference: either side beyond the margin; shown equivalent within it
        status = HOLDS if low > m or high < -m else FAILS if -m <= low and high <= m else INCONCLUSIVE
    detail = (f"{finding.test.replace('_', '-')} ({TESTS[finding.test].format(m=f'{m:g}')}): "
              f"{mean:.3g} [{low:.3g}, {high:.3g}], n = {n}, {100 * (1 - 2 * finding.alpha):g} % interval")
    return Decision(status, float(mean), float(low), float(high), n, detail, finding.alpha)


def paired_decision(finding: Finding, effects: Iterable[float]) -> Decision:
    """:func:`decide` on the mean of paired ``effects`` (one per seed, or per model) and its Student-t interval."""
    values = [float(v) for v in effects if v is not None and not math.isnan(float(v))]
    mean, low, high = mean_interval(values, 1 - 2 * finding.alpha)
    return replace(decide(finding, mean, low, high, len(values)), inputs={"values": values})


def share_decision(finding: Finding, successes: int, trials: int, sign: int = 1) -> Decision:
    """:func:`decide` on a share, ``successes`` of ``trials``, and its Wilson interval (two-sided, 1 - 2 alpha):
    for trials pooled where a t interval over seeds would collapse (a share near 0 in every seed). ``sign=-1``
    decides on minus the share, for a claim that the share is small."""
    norm = need("scipy.stats", "studies", "the reproductions' statistics").norm

    from workbench.campaigns.reproduce.stats import wilson

    counts = {"successes": int(successes), "trials": int(trials), "sign": int(sign)}
    if trials < 1:
        return replace(decide(finding, math.nan, math.nan, math.nan, 0), method="wilson", inputs=counts)
    share, low, high = wilson(int(successes), int(trials), float(norm.ppf(1 - finding.alpha)))
    if sign < 0:
        share, low, high = -share, -high, -low
    return replace(decide(finding, share, low, high, int(trials)), method="wilson", inputs=counts)


def redecide(finding: Finding, decision: dict[str, Any], alpha: float) -> Decision:
    """``decision`` (a :class:`Decision` as a dict) decided again at ``alpha``: from its inputs where it kept them
    (the paired values; a share's counts), else (a record of published figures) its t interval widened or narrowed
    to the new level from its mean, bounds and n, which determine it."""
    t = need("scipy.stats", "studies", "the reproductions' statistics").t

    at = replace(finding, alpha=float(alpha))
    inputs = decision.get("inputs") or {}
    if decision.get("method") == "wilson":
        return share_decision(at, inputs["successes"], inputs["trials"], inputs.get("sign", 1))
    if "values" in inputs:
        return paired_decision(at, inputs["values"])
    mean, low, high, n = (float(decision[k]) for k in ("mean", "low", "high", "n"))
    was = decision.get("alpha")
    was = finding.alpha if was is None or math.isnan(float(was)) else float(was)
    if n < 2:
        return decide(at, mean, low, high, int(n))
    factor = float(t.ppf(1 - at.alpha, n - 1) / t.ppf(1 - was, n - 1))
    return decide(at, mean, mean - (mean - low) * factor, mean + (high - mean) * factor, int(n))


# -- provenance ---------------------------------------------------------------------------------------------------
def provenance(path: str | os.PathLike = REGISTRY_FILE) -> dict[str, Any]:
    """The commit that last changed the registry (and its date), whether the file differs from it now, and the
    deviations it lists: what the report shows beside the results' commit. ``commit`` is None outside a git
    checkout."""
    path = Path(path)
    registry = load(path)
    out: dict[str, Any] = {"commit": None, "date": None, "modified": None, "deviations": registry.deviations}
    try:
        log = subprocess.run(["git", "-C", str(path.parent), "log", "-1", "--format=%H %cI", "--", path.name],
                             capture_output=True, text=True, timeout=5)
        diff = subprocess.run(["git", "-C", str(path.parent), "diff", "--quiet", "HEAD", "--", path.name],
                              capture_output=True, timeout=5)
    except (OSError, subprocess.TimeoutExpired):
        return out
    if log.returncode == 0 and log.stdout.strip():
        out["commit"], out["date"] = log.stdout.split()
        out["modified"] = diff.returncode != 0
    return out


def registered_at(paper: str, commit: str | None, path: str | os.PathLike = REGISTRY_FILE) -> bool | None:
    """Whether ``paper``'s registration (its section and the shared rules: alpha, the seeds and the attempts) reads
    at ``commit`` (the results') as it reads now: the results ran under the registration in force, committed before
    them. None outside a checkout or for a commit git does not know."""
    if not commit:
        return None
    then, now = section_at(paper, commit, path, shared=True), section_at(paper, None, path, shared=True)
    return None if then is None or now is None else then == now


def section_at(paper: str, commit: str | None, path: str | os.PathLike = REGISTRY_FILE,
               shared: bool = False) -> dict[str, Any] | None:
    """``paper``'s section of the registry as it read at ``commit`` (None: the file now), with the shared rules
    when ``shared``; None outside a checkout, for a commit git does not know or a file that is not YAML."""
    import yaml

    path = Path(path)
    try:
        if commit is None:
            text = path.read_text()
        else:
            shown = subprocess.run(["git", "-C", str(path.parent), "show", f"{commit.split('+')[0]}:./{path.name}"],
                                   capture_output=True, text=True, timeout=10)
            if shown.returncode != 0:
                return None
            text = shown.stdout
        data = load_yaml(text) or {}
    except (OSError, subprocess.TimeoutExpired, yaml.YAMLError, DuplicateKeyError):
        return None
    part = {"paper": (data.get("papers") or {}).get(paper)}
    if shared:
        part.update({key: data.get(key) for key in ("alpha", "tuning_seeds", "reporting_seeds", "attempts")})
    return part


def precedes(registered: str | None, results: str | None, where: str | os.PathLike = REGISTRY_FILE) -> bool | None:
    """Whether commit ``registered`` is an ancestor of (or is) commit ``results``: the registration came first.
    None when either is unknown or git cannot tell (outside a checkout, a commit not in it)."""
    if not registered or not results:
        return None
    try:
        done = subprocess.run(["git", "-C", str(Path(where).parent), "merge-base", "--is-ancestor", registered,
                               results.split("+")[0]], capture_output=True, timeout=5)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return {0: True, 1: False}.get(done.returncode)


def reporting_seeds(registry: Registry, count: int | None = None) -> list[int]:
    """Fresh reporting seeds, as the registry says: drawn from the operating system's entropy, outside the tuning
    range and the range to avoid, distinct. The caller records them with its results (they are named nowhere
    before the run)."""
    avoid = registry.reporting_seeds.get("avoid", list(registry.tuning_seeds))
    low, high = min(avoid[0], registry.tuning_seeds[0]), max(avoid[1], registry.tuning_seeds[1])
    seeds: list[int] = []
    while len(seeds) < (count or registry.reporting_seeds["count"]):
        seed = int.from_bytes(os.urandom(4), "big") >> 1  # 31 bits: a valid seed for every generator used
        if not low <= seed <= high and seed not in seeds:
            seeds.append(seed)
    return seeds


SEEDS_FILE = "reporting_seeds.json"


def seeds_of(out: str | os.PathLike, paper: str) -> dict[str, Any]:
    """The reporting seeds of the campaign writing to ``out``: drawn once, when its first paper-scale run starts,
    and kept in ``out/reporting_seeds.json`` with the time and the registry's commit, so that an interrupted
    campaign resumes on the same seeds. A file that is not such a record is refused (RegistryError)."""
    import json
    from datetime import datetime, timezone

    path = Path(out) / SEEDS_FILE
    if path.exists():
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise RegistryError(f"{path}: not a record of reporting seeds ({exc}); remove it to draw afresh") from None
        seeds = record.get("seeds") if isinstance(record, dict) else None
        if record.get("paper") != paper or not (isinstance(seeds, list) and seeds
                                                and all(isinstance(s, int) for s in seeds)):
            raise RegistryError(f"{path}: not {paper}'s reporting seeds; remove it or choose another out")
        return record
    registry = load()
    record = {"paper": paper, "seeds": reporting_seeds(registry, registry.seed_count(paper)),
              "drawn": datetime.now(timezone.utc).isoformat(timespec="seconds"),
              "registry_commit": provenance()["commit"]}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(record, indent=1))
    os.replace(tmp, path)
    return record
