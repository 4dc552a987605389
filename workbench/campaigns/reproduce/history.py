"""Every registered reporting run, kept: the archive ``archive/<paper>/<NN>-<date>-<what>.json`` beside this module,
one record per run (its verdicts at its attempt's alpha, checks, drawn seeds, per-run table, the registry commit it
ran under; ``files: "gone"`` with ``published_in`` where only the docs' figures remain).

A paper-scale reporting run claims its attempt when its seeds are drawn (:func:`claim`), is decided at that
attempt's alpha (:func:`spend`) and writes its record when its verdict is saved (:func:`archive`); :func:`records`,
:func:`decided` and :func:`history_line` are what the report shows. Details: docs/reproduce-rules.md, "The archive".
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

from workbench.campaigns.reproduce import registry
from workbench.campaigns.reproduce.registry import FAILS

ARCHIVE_DIR = Path(__file__).resolve().with_name("archive")
PAPERS = ("ccgrid22", "jpdc24", "europmpi17", "gossipgrad", "apoptosis")  # the report's order
_LOADED: dict[str, Any] = {}


# -- reading ------------------------------------------------------------------------------------------------------
def records(paper: str | None = None, root: str | os.PathLike = ARCHIVE_DIR) -> list[dict[str, Any]]:
    """The archived records (of ``paper``, or all), each with its ``path``, ordered by paper and attempt. A paper's
    later study keeps its records in its own folder below the paper's (``ccgrid22/study2/``): ``records("ccgrid22")``
    is study 1's alone, ``records("ccgrid22_study2")`` study 2's."""
    root = Path(root)
    found = []
    patterns = [f"{folder(paper)}/*.json"] if paper else ["*/*.json", "*/study*/*.json"]
    for path in sorted(p for pattern in patterns for p in root.glob(pattern)):
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise registry.RegistryError(f"{path}: not an archive record ({exc})") from None
        found.append({**record, "path": str(path)})
    order = {key: i for i, key in enumerate(PAPERS)}
    return sorted(found, key=lambda r: (order.get(r["paper"], len(order)), r["paper"], int(r["attempt"])))


def decided(record: dict[str, Any]) -> list[dict[str, Any]]:
    """The record's registered findings under today's rules: decided at the alpha its attempt is given
    (``record["alpha"]``; those decided at another alpha when they ran, the runs before the attempt budget, are
    decided again from their recorded figures: :func:`workbench.campaigns.reproduce.registry.redecide`), then an
    accuracy comparison beside the ceiling of the data set it ran on (:func:`ceiling_rule`); ``status_run`` keeps
    the status as run; a row marked ``unmeasured`` (figures copied, not measured) is inconclusive."""
    reg = _rules()
    dataset = dataset_of(record, reg.ceilings)
    out = []
    for f in record.get("findings", []):
        alpha = record.get("alpha")
        f = {**f, "status_run": f["status"]}
        if not (alpha is None or f.get("test") == "exact" or f.get("alpha") == alpha):
            paper, ident = f["key"].split(".", 1)
            finding = registry.Finding(paper, ident, "", "", "", "none", "", f["test"], float(f["margin"]),
                                       float(f["alpha"]))
            again = registry.redecide(finding, f, alpha)
            f.update(status=again.status, mean=again.mean, low=again.low, high=again.high, alpha=again.alpha,
                     detail=again.detail)
        if f.get("unmeasured"):  # a row whose figures were never measured for it decides nothing
            f.update(status=registry.INCONCLUSIVE, detail=f"not measured: {f['unmeasured']}")
        out.append(ceiling_rule(reg, f, dataset))
    return out


def folder(paper: str) -> str:
    """``paper``'s folder in the archive (:meth:`workbench.campaigns.reproduce.registry.Registry.folder`): its key,
    or ``<paper>/study<N>`` for a later study registered as ``<paper>_study<N>``."""
    try:
        return _rules().folder(paper)
    except registry.RegistryError:
        return paper


def _rules() -> registry.Registry:
    """The registry as its file reads now, read again only when the file changes (the report asks for every
    record's decisions several times; reading the file takes a fraction of a second)."""
    path = registry.REGISTRY_FILE
    stat = path.stat()
    key = (registry.load, str(path), stat.st_mtime_ns, stat.st_size)
    if _LOADED.get("key") != key:
        _LOADED.update(key=key, registry=registry.load(path))
    return _LOADED["registry"]


def ceiling_rule(reg: registry.Registry, f: dict[str, Any], dataset: str | None) -> dict[str, Any]:
    """An archived decision ``f`` of an accuracy comparison set beside the ceiling of ``dataset`` (its run's) at the
    accuracy of the arm it was compared with: the one its run measured (``ceiling``, kept by the runs since
    ceilings were registered), else the one its docs published (``reference``), else the registered failure-free
    accuracy where the registration still runs on that data set. A *holds* made less than
    :data:`~workbench.campaigns.reproduce.registry.CEILING_GAP` below it reads
    :data:`~workbench.campaigns.reproduce.registry.AT_CEILING`."""
    finding = reg.findings.get(f["key"])
    if finding is None or not finding.compares_accuracy:
        return f
    kept, published = f.get("ceiling") or {}, f.get("reference") or {}
    if "failure_free" in kept:
        reference, source = kept["failure_free"], "measured"
    else:
        reference, source = published.get("accuracy"), f"{published.get('arm')}, as published"
    gap = registry.ceiling_gap(reg, finding, reference, kept.get("dataset") or dataset, source)
    detail = f.get("detail") or ""
    if gap["line"] not in detail:
        detail = f"{detail}; {gap['line']}" if detail else gap["line"]
    return {**f, "status": registry.ceiling_status(f["status"], gap), "detail": detail, "ceiling": gap}


def dataset_of(record: dict[str, Any], ceilings: dict[str, Any]) -> str | None:
    """The data set a record's run trained on: its workload's, else the one with a registered ceiling its condition
    names (the longest name first: ``synthetic_image`` is not ``synthetic``); None where neither says."""
    dataset = (record.get("workload") or {}).get("dataset")
    condition = record.get("condition", "")
    return dataset or next((name for name in sorted(ceilings, key=len, reverse=True) if name in condition), None)


def status(record: dict[str, Any]) -> str:
    """A record's verdict under today's rules (:func:`decided`): does not hold when a check failed or a finding does
    not hold, else :func:`workbench.campaigns.reproduce.registry.overall` of its findings (inconclusive, holds at
    the ceiling: not evidence, holds)."""
    findings = [f for f in decided(record) if not f.get("secondary")]  # a secondary finding is reported beside
    if not all(c["ok"] for c in record.get("checks", [])):
        return FAILS
    return registry.overall(f["status"] for f in findings)


def history_line(paper_records: list[dict[str, Any]], paper: str | None = None) -> str:
    """``inconclusive (design 1) → does not hold (design 2) → holds (design 3)``: a paper's runs in order; with
    ``paper``, a registration without a run says so (:func:`pending`)."""
    steps = [f"{status(r)} (design {r['design']}{', exploratory' if r.get('exploratory') else ''})"
             for r in sorted(paper_records, key=lambda r: int(r["attempt"]))]
    if steps:
        return " → ".join(steps)
    return pending(paper) or "no registered reporting run archived"


def pending(paper: str | None) -> str | None:
    """A registration that has no archived run yet, in words (a replication registered before its run: "registered
    2026-11-28, replicates gossipgrad's design on vgg11 ...: not run yet"); None for a paper that is not one."""
    if paper is None:
        return None
    try:
        reg = registry.load()
    except registry.RegistryError:
        return None
    section = reg.papers.get(paper)
    if section is None or not isinstance(section.get("registered"), dict):
        return None
    what = f", replicates {reg.replicates(paper)}'s design unchanged" if reg.replicates(paper) else ""
    workload = reg.workload(paper)
    on = f"{workload.get('model')} / {workload.get('dataset')}"
    if reg.study(paper) > 1:
        what = (f", study {reg.study(paper)} of {reg.paper_of(paper)} (a fresh budget: alpha "
                f"{', '.join(f'{a:g}' for a in reg.attempts_of(paper)['spending'])})")
        on = f"the accepted workload {section['accepted_workload']} ({on})"
    return f"registered {section['registered']['date']}{what} on {on}: not run yet (no record archived)"


def ours(record: dict[str, Any] | None, workload: dict[str, Any] | None = None) -> str:
    """What a run trained on, in words (model, data, ranks, steps): its record's workload, else the first clause of
    its condition (the records of runs whose files are gone), else the registered ``workload``."""
    workload = (record or {}).get("workload") or (None if record else workload)
    if isinstance(workload, dict) and workload.get("model"):
        worlds = workload.get("worlds") or [workload.get("world_size") or workload.get("world")]
        width = f" x{workload['width']:g}" if isinstance(workload.get("width"), (int, float)) else ""
        return (f"{workload['model']}{width} on {workload.get('dataset')}, {' and '.join(map(str, worlds))} ranks, "
                f"{workload.get('steps')} steps")
    return str((record or {}).get("condition", "")).split(";")[0].strip() or "not recorded"


def distance(key: str, record: dict[str, Any] | None = None) -> str:
    """A verdict's distance from the paper: what ``record`` (else ``key``'s registration) ran on beside what the
    paper ran on as the registry's ``sources`` say (model, data, ranks, steps), in words."""
    try:
        reg = _rules()
    except registry.RegistryError:
        return ""
    workload = reg.workload(key) if key in reg.papers else None
    source = reg.sources.get(reg.paper_of(key) if key in reg.papers else key)
    if source is None:
        theirs = "not registered (registry sources)"
    else:
        known = [f"{name} {source[name]}" for name in registry.SOURCE_FIELDS if source.get(name) is not None]
        unknown = [name for name in registry.SOURCE_FIELDS if source.get(name) is None]
        read = str(source["read"]).split(" (")[0]  # its first words: what was read (the registry has the rest)
        theirs = "; ".join(known + ([f"{', '.join(unknown)}: not in what was read ({read})"] if unknown else []))
    return f"ours: {ours(record, workload)}; the paper's: {theirs}"


def registered_papers() -> list[str]:
    """Every registered paper, the report's order first, each followed by its later studies, then the replications
    and any other (registry.yaml)."""
    try:
        reg = registry.load()
    except registry.RegistryError:
        return list(PAPERS)
    ordered = [key for paper in PAPERS for key in (paper, *reg.studies(paper))]
    return ordered + [name for name in reg.papers if name not in ordered]


def uncommitted(root: str | os.PathLike = ARCHIVE_DIR) -> list[str] | None:
    """The archive's records git does not hold as committed (new or changed); None outside a git checkout."""
    root = Path(root)
    if not root.is_dir():
        return []
    try:
        done = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=all", "--", "."],
                              capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if done.returncode != 0:
        return None
    return [line[3:].strip() for line in done.stdout.splitlines() if line.strip()]


# -- writing ------------------------------------------------------------------------------------------------------
def reporting_run(verdict: Any, table: Any = None) -> dict[str, Any] | None:
    """The reporting-seed record of a paper-scale verdict that ran on drawn reporting seeds, else None (the small
    scale, a tuning run at the paper scale)."""
    seeds = verdict.statistics.get("reporting_seeds")
    if verdict.scale != "paper" or not isinstance(seeds, dict) or seeds.get("paper") != verdict.key:
        return None
    if table is not None and "reporting" in getattr(table, "columns", ()) and not bool(table["reporting"].all()):
        return None
    if table is not None and getattr(table, "attrs", {}).get("reporting") is False:  # JPDC'24 says it in attrs
        return None
    return seeds


def claim(out: str | os.PathLike, seeds: dict[str, Any], root: str | os.PathLike = ARCHIVE_DIR) -> dict[str, Any]:
    """Fix a reporting run's attempt and its alpha when its seeds are drawn, before its first run: written into
    ``out/reporting_seeds.json`` beside them (a resumed campaign keeps them)."""
    if "attempt" in seeds:
        return seeds
    attempt = next_attempt(seeds["paper"], seeds, root)
    alpha = registry.load().attempt_alpha(attempt, seeds["paper"])  # a later study: its own budget
    seeds = {**seeds, "attempt": attempt, "alpha": alpha, "exploratory": alpha is None}
    path = Path(out) / registry.SEEDS_FILE
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(seeds, indent=1))
    os.replace(tmp, path)
    return seeds


def next_attempt(paper: str, seeds: dict[str, Any], root: str | os.PathLike = ARCHIVE_DIR) -> int:
    """The attempt of the run with ``seeds``: its record's when archived already, else one past the last."""
    kept = records(paper, root)
    for r in kept:
        if (r.get("seeds") or {}).get("drawn") == seeds.get("drawn") and r["seeds"].get("seeds") == seeds["seeds"]:
            return int(r["attempt"])
    return max((int(r["attempt"]) for r in kept), default=0) + 1


def spend(verdict: Any, seeds: dict[str, Any], root: str | os.PathLike = ARCHIVE_DIR) -> None:
    """Decide ``verdict`` at the alpha its attempt is given; beyond the budget at the last attempt's, exploratory
    (a later study's attempts and alphas are its own budget's)."""
    reg = registry.load()
    attempt = int(seeds.get("attempt") or next_attempt(verdict.key, seeds, root))
    alpha = reg.attempt_alpha(attempt, verdict.key)
    last = reg.attempts_of(verdict.key)["spending"][-1]
    verdict.spend(alpha if alpha is not None else last, attempt, alpha is None)


def archive(verdict: Any, seeds: dict[str, Any], table: Any = None, root: str | os.PathLike = ARCHIVE_DIR) -> Path:
    """Write ``verdict``'s record into ``root/<paper>/`` (replacing the record of the same run: a campaign saved
    again, resumed, keeps one record); returns its path."""
    root = Path(root)
    record = record_of(verdict, seeds, table, root)
    into = root / folder(verdict.key)
    into.mkdir(parents=True, exist_ok=True)
    for old in into.glob(f"{record['attempt']:02d}-*.json"):
        if json.loads(old.read_text()).get("seeds", {}).get("drawn") == seeds.get("drawn"):
            old.unlink()
    name = f"{record['attempt']:02d}-{record['date']}-design{record['design']}-{len(seeds['seeds'])}-seeds.json"
    path = into / name
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(record, indent=1, default=str))
    os.replace(tmp, path)
    return path


def record_of(verdict: Any, seeds: dict[str, Any], table: Any, root: Path) -> dict[str, Any]:
    """The archive record of a saved reporting verdict (see the module docstring)."""
    from dataclasses import asdict

    commit = seeds.get("registry_commit")
    section = registry.section_at(verdict.key, commit) if commit else None
    reg = registry.load()
    workload = ((section or {}).get("paper") or {}).get("workload") or reg.workload(verdict.key)
    if reg.study(verdict.key) > 1:  # a later study: its accepted workload's settings with its own
        workload = reg.workload(verdict.key)
    study = ({"study": reg.study(verdict.key), "of": reg.paper_of(verdict.key),
              "accepted_workload": reg.papers[verdict.key]["accepted_workload"]} if reg.study(verdict.key) > 1 else {})
    statistics = {k: v for k, v in verdict.statistics.items() if k != "reporting_seeds"}
    return {
        "paper": verdict.key, **study, "title": verdict.title, "attempt": verdict.attempt,
        "design": design_of(verdict.key, commit, verdict.attempt, root),
        "date": str(seeds.get("drawn", ""))[:10] or "undated", "scale": verdict.scale,
        "condition": condition(workload), "workload": workload, "registry_commit": commit,
        "results_commit": verdict.commit, "alpha": verdict.alpha, "exploratory": verdict.exploratory,
        "status": verdict.status, "findings": [{**d, **_test_of(d["key"])} for d in verdict.decisions],
        "checks": [asdict(c) for c in verdict.checks], "statistics": json.loads(json.dumps(statistics, default=str)),
        "seeds": seeds, "table": json.loads(table.to_json(orient="split", index=False)) if table is not None else None,
        "files": "kept", "published_in": None,
    }


def _test_of(key: str) -> dict[str, Any]:
    finding = registry.load().finding(key)
    return {"test": finding.test, "margin": finding.margin}


def design_of(paper: str, registry_commit: str | None, attempt: int | None,
              root: str | os.PathLike = ARCHIVE_DIR) -> int:
    """The design a run ran under: its predecessor's when the paper's registered section reads alike at both runs'
    registry commits, else the next."""
    before = [r for r in records(paper, root) if attempt is None or int(r["attempt"]) < attempt]
    if not before:
        return 1
    last = before[-1]
    same = last.get("registry_commit") == registry_commit
    if not same and registry_commit and last.get("registry_commit"):
        then = registry.section_at(paper, last["registry_commit"])
        same = then is not None and then == registry.section_at(paper, registry_commit)
    return int(last["design"]) + (0 if same else 1)


def condition(workload: dict[str, Any]) -> str:
    """A workload in words, the condition a record's claims are made under."""
    def words(value: Any) -> str:
        return ", ".join(map(str, value)) if isinstance(value, list) else str(value)

    return "; ".join(f"{key.replace('_', ' ')} {words(value)}" for key, value in workload.items())
