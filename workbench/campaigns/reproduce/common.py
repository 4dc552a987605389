"""What every reproduction shares: cached runs (a campaign interrupted resumes where it stopped), statistics
(t intervals over seeds, Wilson intervals over trials) and the verdict a campaign ends with.

A verdict is a list of checks, each one direction the paper reports (``rollback loses no samples``,
``restart costs more than rollback``), measured with its statistics. The finding *holds* when every check
passes, *does not hold* when one fails (the failing checks say which part), and is *not comparable* when the
campaign cannot speak to it at this scale (too few runs completed). Nothing is tuned to make a check pass:
the thresholds are the paper's direction, not our numbers.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from workbench.campaigns.reproduce.registry import overall
from workbench.campaigns.reproduce.stats import mean_interval, one_sided, wilson
from workbench.faults import events as ev
from workbench.faults import kinds

__all__ = ["Check", "Progress", "Verdict", "cached_run", "campaign_settings", "fewer_runs", "fmt", "mean_interval",
           "on_reporting_seeds", "one_sided", "paired", "preflight", "progress", "scale_settings", "wilson"]

VERDICT_FILE = "verdict.json"
FIGURES_DIR = "figures"
HOLDS, FAILS, NOT_COMPARABLE, INCONCLUSIVE = "holds", "does not hold", "not comparable", "inconclusive"


@dataclass
class Check:
    """One direction of the finding, measured: ``ok`` and the numbers that decided it."""

    name: str
    ok: bool
    detail: str
    # a mechanism check: what the code does by construction, shown as such, not as one of the paper's findings
    mechanism: bool = False


@dataclass
class Verdict:
    """A finding's verdict at one scale: what the paper says, what we measured, and whether it holds."""

    key: str
    title: str
    paper: str  # the finding in our words, with the paper's numbers or direction
    scale: str
    checks: list[Check] = field(default_factory=list)
    comparable: bool = True
    reason: str = ""  # why not comparable, when it is not
    statistics: dict[str, Any] = field(default_factory=dict)
    # registered findings decided from their intervals (workbench.campaigns.reproduce.registry): key, label, status,
    # figures
    decisions: list[dict[str, Any]] = field(default_factory=list)
    commit: str | None = None  # the source commit the campaign ran from (set by save)
    # a reporting run's place among its paper's registered runs (workbench/campaigns/reproduce/archive) and the
    # one-sided alpha
    # that attempt is given (registry.yaml, attempts); exploratory: beyond the attempt budget (set by save)
    attempt: int | None = None
    alpha: float | None = None
    exploratory: bool = False

    @property
    def primary(self) -> list[dict[str, Any]]:
        """The decisions the verdict turns on: every registered finding's but a secondary one's (reported beside)."""
        return [d for d in self.decisions if not d.get("secondary")]

    @property
    def status(self) -> str:
        """Not comparable; does not hold (a check failed, or a registered finding does not hold); inconclusive (a
        registered finding's interval straddles its margin); holds at the ceiling: not evidence (one holds only
        near its data set's ceiling); holds. A secondary finding does not turn it."""
        if not self.comparable:
            return NOT_COMPARABLE
        if not (self.checks or self.decisions) or not all(c.ok for c in self.checks):
            return FAILS
        return overall(d["status"] for d in self.primary)

    def decide(self, key: str, effects: Iterable[float], label: str = "", reference: float | None = None) -> str:
        """Decide registered finding ``key`` (``paper.id`` of registry.yaml) from paired ``effects`` (oriented so
        that positive favours the claim), as registered; recorded here, its status returned. ``reference``: an
        accuracy comparison's measured failure-free accuracy (0-1), said beside its data set's ceiling."""
        from workbench.campaigns.reproduce import registry

        return self._record(key, label, lambda finding: registry.paired_decision(finding, effects), reference)

    def decide_share(self, key: str, successes: int, trials: int, label: str = "", sign: int = 1) -> str:
        """As :meth:`decide`, from a share (``successes`` of ``trials``) and its Wilson interval; ``sign=-1`` when
        a small share favours the claim (:func:`workbench.campaigns.reproduce.registry.share_decision`)."""
        from workbench.campaigns.reproduce import registry

        return self._record(key, label, lambda finding: registry.share_decision(finding, successes, trials, sign))

    def _record(self, key: str, label: str, deciding: Any, reference: float | None = None) -> str:
        from workbench.campaigns.reproduce import power, registry

        reg = registry.load()
        finding = reg.finding(key)
        decided = deciding(finding)
        decided = power.powered(finding, decided) if self.scale == "paper" else decided
        gap = registry.ceiling_gap(reg, finding, reference)
        decided = registry.below_ceiling(decided, gap) if self.scale == "paper" else decided
        self.decisions.append({"key": key, "label": label, "claim": finding.ours, **asdict(decided),
                               **({"ceiling": gap} if gap else {}),
                               **({"secondary": True} if finding.kind == "secondary" else {})})
        return decided.status

    def spend(self, alpha: float, attempt: int | None = None, exploratory: bool = False) -> None:
        """Decide every registered finding again at ``alpha``, the one its ``attempt`` is given (registry.yaml,
        ``attempts``), from the values each decision kept (:func:`workbench.campaigns.reproduce.registry.redecide`)."""
        from workbench.campaigns.reproduce import power, registry

        reg = registry.load()
        for i, d in enumerate(self.decisions):
            decided = registry.redecide(reg.finding(d["key"]), d, alpha)
            if self.scale == "paper":
                decided = registry.below_ceiling(power.powered(reg.finding(d["key"]), decided), d.get("ceiling"))
            self.decisions[i] = {**d, **asdict(decided)}
        self.alpha, self.attempt, self.exploratory = float(alpha), attempt, bool(exploratory)

    def check(self, name: str, ok: bool, detail: str, mechanism: bool = False) -> bool:
        self.checks.append(Check(name, bool(ok), detail, bool(mechanism)))
        return bool(ok)

    def failed(self) -> list[str]:
        return [f"{c.name}: {c.detail}" for c in self.checks if not c.ok] + [
            f"{d['key']}{' ' + d['label'] if d['label'] else ''} does not hold: {d['detail']}"
            for d in self.primary if d["status"] == FAILS]

    def summary(self) -> str:
        lines = [f"{self.title} [{self.scale}]: {self.status.upper()}"]
        if not self.comparable:
            lines.append(f"  not comparable: {self.reason}")
        lines += [f"  {'ok ' if c.ok else 'NO '} {'mechanism check: ' if c.mechanism else ''}{c.name}: {c.detail}"
                  for c in self.checks]
        lines += [f"  {d['status']}: {'secondary: ' if d.get('secondary') else ''}{d['key']}"
                  f"{' (' + d['label'] + ')' if d['label'] else ''}: {d['detail']}" for d in self.decisions]
        return "\n".join(lines)

    def require(self) -> None:
        """Raise AssertionError unless the finding holds: every check passes. Nothing is excused; a campaign that
        is not comparable, or measured nothing, fails too: a notebook that measured nothing must not pass."""
        self.require_measured()
        if self.failed():
            raise AssertionError(f"{self.title} [{self.scale}] does not hold: " + "; ".join(self.failed()))

    def require_mechanism(self) -> None:
        """At a scale too small to decide the registered findings (their intervals are reported, inconclusive or
        not): raise AssertionError unless the campaign measured and every mechanism check passes."""
        self.require_measured()
        broken = [f"{c.name}: {c.detail}" for c in self.checks if not c.ok]
        if broken:
            raise AssertionError(f"{self.title} [{self.scale}]: the mechanism fails: " + "; ".join(broken))

    def require_measured(self) -> str:
        """Raise AssertionError unless the campaign measured the finding (comparable, with checks); return its
        status, *holds* or *does not hold*, for the notebook to print and the report to show. For a finding that
        does not hold on this workload: reported as such, with every check that missed, none excused."""
        if not self.comparable:
            raise AssertionError(f"{self.title}: not comparable: {self.reason}")
        if not (self.checks or self.decisions):
            raise AssertionError(f"{self.title} [{self.scale}]: no check measured")
        return self.status

    def save(self, out: str | os.PathLike, figures: Sequence[Any] = (), table: Any = None,
             archive: str | os.PathLike | None = None) -> Path:
        """``out/verdict.json`` (atomically), the figures as plotly JSON under ``out/figures/`` and the campaign's
        table as ``out/table.csv``: what :func:`workbench.campaigns.reproduce.report.write_report` assembles. A
        paper-scale
        reporting run (its reporting seeds drawn in ``out``) is decided at its attempt's alpha and writes its
        record into ``archive`` (default: the repository's,
        :data:`workbench.campaigns.reproduce.history.ARCHIVE_DIR`)."""
        from workbench.campaigns.reproduce import history

        out = Path(out)
        (out / FIGURES_DIR).mkdir(parents=True, exist_ok=True)
        for i, fig in enumerate(figures):
            _write(out / FIGURES_DIR / f"{i:02d}.json", fig.to_json())
        if table is not None:
            _write(out / "table.csv", table.to_csv(index=False))
        from workbench.campaigns.reproduce.registry import SEEDS_FILE
        from workbench.results.provenance import git_state

        self.commit = self.commit or git_state()[0]
        if (out / SEEDS_FILE).is_file():  # a paper-scale campaign's reporting seeds: when drawn, under which registry
            self.statistics["reporting_seeds"] = json.loads((out / SEEDS_FILE).read_text())
        root = Path(archive) if archive is not None else history.ARCHIVE_DIR
        seeds = history.reporting_run(self, table)
        if seeds is not None:
            history.spend(self, seeds, root)
        data = {**asdict(self), "status": self.status}
        _write(out / VERDICT_FILE, json.dumps(data, indent=1, default=_plain))
        if seeds is not None:
            history.archive(self, seeds, table, root)
        return out / VERDICT_FILE

    @classmethod
    def load(cls, path: str | os.PathLike) -> Verdict:
        data = json.loads(Path(path).read_text())
        data.pop("status", None)
        data["checks"] = [Check(**c) for c in data.get("checks", [])]
        return cls(**data)


def _write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _plain(value: Any) -> Any:
    if hasattr(value, "item"):
        return value.item()
    if hasattr(value, "tolist"):
        return value.tolist()
    return str(value)


# -- runs ---------------------------------------------------------------------------------------------------------
def scale_settings(scales: dict[str, dict[str, Any]], scale: str, overrides: dict[str, Any]) -> dict[str, Any]:
    """A campaign's settings at ``scale`` with ``overrides``; a ConfigError naming what is allowed for an unknown
    scale or setting (before any run starts)."""
    from workbench.base.errors import ConfigError

    if scale not in scales:
        raise ConfigError("scale", f"{scale!r} is not a scale of this campaign; choose one of {', '.join(scales)}")
    unknown = sorted(set(overrides) - set(scales[scale]))
    if unknown:
        raise ConfigError("settings", f"unknown campaign setting(s) {', '.join(unknown)}; this campaign's are "
                          f"{', '.join(scales[scale])}")
    return {**scales[scale], **overrides}


def campaign_settings(key: str, scales: dict[str, dict[str, Any]], scale: str, out: str | os.PathLike,
                      overrides: dict[str, Any]) -> dict[str, Any]:
    """A campaign's settings: at the small scale the module's (tuning seeds: the mechanism only); at the paper
    scale the registry's workload (registry.yaml) with the reporting seeds of ``out``, drawn once when the campaign
    first runs (:func:`workbench.campaigns.reproduce.registry.seeds_of`). Seeds given as an override make it a tuning
    run: ``settings["reporting"]`` says which it is."""
    from workbench.campaigns.reproduce import registry
    from workbench.config.run import RunConfig

    if scale == "paper":
        scales = {**scales, "paper": {**scales.get("paper", {}), **registry.load().workload(key)}}
    settings = scale_settings(scales, scale, overrides)
    settings.setdefault("synthetic_size", RunConfig.synthetic_size)  # a synthetic dataset's size: the run's default
    settings["reporting"] = scale == "paper" and "seeds" not in overrides
    if settings["reporting"]:  # the run's attempt and its alpha fixed with its seeds, before its first run
        from workbench.campaigns.reproduce import history

        settings["seeds"] = history.claim(out, registry.seeds_of(out, key))["seeds"]
    return settings


# the run settings a registered workload may set
RUN_KEYS = ("optimizer", "lr", "lr_schedule", "batch_size", "width", "flush_denormal")


def run_extras(settings: dict[str, Any]) -> dict[str, Any]:
    """The run settings (:data:`RUN_KEYS`) a campaign's settings carry beside its own keys: what a registered
    workload sets for every run (its learning-rate schedule, its model's width); absent keys take the defaults."""
    return {key: settings[key] for key in RUN_KEYS if key in settings}


def on_reporting_seeds(frame: Any) -> bool:
    """Whether every run of a campaign's table ran on reporting seeds (its ``reporting`` column)."""
    return bool(len(frame)) and "reporting" in frame and bool(frame["reporting"].all())


def preflight(*runs: dict[str, Any]) -> None:
    """Check every run's settings as ``workbench.run`` would (:func:`workbench.launch.session.prepare`), before the
    campaign runs the first: a model apoptosis cannot shrink is refused at once, not after the runs before it."""
    from workbench.launch.session import prepare

    for settings in runs:
        prepare(**settings)


class Progress:
    """A campaign's runs done of its ``total``, one line per finished run (printed: the notebook's output; and into
    a sweep point's ``progress.txt``, which ``workbench sweep`` prints on its terminal): runs done / total,
    how many reused (cached, :func:`cached_run`), elapsed, and the finish estimated from the mean time of the runs
    run so far in this invocation (reused ones take no time and do not count)."""

    def __init__(self, name: str, total: int, stream: Any = None, into: str | Path | None = None) -> None:
        self.name, self.total, self.stream = name, int(total), stream
        self.into = Path(into) if into is not None else None
        self.done = self.reused = 0
        self.run_s = 0.0
        self.started = time.monotonic()

    def finished(self, label: str, seconds: float, reused: bool) -> str:
        """Count one finished run (``reused``: loaded, not run); print and return its progress line."""
        self.done += 1
        self.reused += bool(reused)
        self.run_s += 0.0 if reused else seconds
        ran, left = self.done - self.reused, max(self.total - self.done, 0)
        elapsed = time.monotonic() - self.started
        if not left:
            estimate = "finished"
        elif ran:
            per_run = self.run_s / ran
            at = time.strftime("%H:%M:%S", time.localtime(time.time() + left * per_run))
            estimate = f"~{per_run:.1f} s per run, estimated finish {at} (in {_clock(left * per_run)})"
        else:
            estimate = "estimated finish: after the first run not reused"
        took = "reused" if reused else f"{seconds:.1f} s"
        line = (f"{self.name}: {self.done}/{self.total} runs done ({label}, {took}; {self.reused} reused) · "
                f"elapsed {_clock(elapsed)} · {estimate}")
        print(line, file=self.stream or sys.stdout, flush=True)
        _tell_sweep(line, self.into)
        return line


def _clock(seconds: float) -> str:
    minutes, secs = divmod(int(round(seconds)), 60)
    return f"{minutes // 60}:{minutes % 60:02d}:{secs:02d}"


def _tell_sweep(line: str, into: Path | None) -> None:
    """Write ``line`` into ``into/progress.txt``, the campaign's ``out`` folder: under ``workbench sweep`` that is
    the point's directory, whose worker relays the line to the sweep's terminal."""
    from workbench.launch.sweeps.requeue import PROGRESS_FILE

    if into is not None and into.is_dir():
        _write(into / PROGRESS_FILE, line + "\n")


_PROGRESS: list[Progress] = []  # the campaign in progress in this process: cached_run counts its runs into it


def progress(name: str, total: int, stream: Any = None, into: str | Path | None = None) -> Progress:
    """Start counting a campaign's ``total`` runs: every :func:`cached_run` from now on prints a progress line,
    until ``total`` are done or the next campaign starts."""
    _PROGRESS[:] = [Progress(name, total, stream, into)]
    return _PROGRESS[0]


def fewer_runs(count: int) -> None:
    """The campaign in progress runs ``count`` runs fewer than its total counted on (e.g. a group with nothing to
    alter): its estimate counts on the rest."""
    if _PROGRESS:
        _PROGRESS[0].total -= int(count)


def _count(directory: Path, seconds: float, reused: bool) -> None:
    if _PROGRESS:
        tracker = _PROGRESS[0]
        tracker.finished(directory.name, seconds, reused)
        if tracker.done >= tracker.total:
            _PROGRESS.clear()


def cached_run(directory: str | os.PathLike, **settings: Any) -> Any:
    """``workbench.run(**settings)`` saved to ``directory/result.h5``; when that file exists, was made by the same
    settings *and the same workbench source* (:func:`workbench.results.provenance.source_digest`) and can be trusted
    (:func:`reusable`), it is loaded instead: an interrupted ``make reproduce`` resumes with the runs it has, and a
    campaign whose code changed runs again (a notebook must never pass on results of code that is gone)."""
    import workbench
    from workbench.results.provenance import source_digest
    from workbench.results.run_result import RESULT_FILE, RunResult

    directory = Path(directory)
    stamp = directory / "settings.json"
    wanted = json.dumps({"settings": settings, "source": source_digest()}, sort_keys=True, default=str)
    if (directory / RESULT_FILE).is_file() and stamp.is_file() and stamp.read_text() == wanted:
        cached = RunResult.load(directory / RESULT_FILE)
        if reusable(cached):
            _count(directory, 0.0, reused=True)
            return cached
    directory.mkdir(parents=True, exist_ok=True)
    stamp.unlink(missing_ok=True)  # a run cut off below leaves no stamp: the next invocation runs it again
    started = time.monotonic()
    result = workbench.run(**settings, overwrite=True)  # an ``out`` in the settings: the run this one replaces
    result.save(directory)
    _write(stamp, wanted)
    _count(directory, time.monotonic() - started, reused=False)
    return result


def reusable(result: Any) -> bool:
    """Whether a saved run says what its settings alone would make it say again: it completed or failed by a fault
    it planned, and no rank was lost to anything else (a rank killed from outside, a machine too loaded to start
    it). Anything else is run again rather than replayed: a transient failure must not stick to a campaign; so is a
    run saved before its events carried their fields (what it planned cannot be read from it)."""
    if not result.events_have_fields:
        return False
    planned = planned_losses(result)
    if ev.count(result.events, ev.FAILURE) > planned:
        return False
    return result.outcome == "completed" or planned > 0


def planned_losses(result: Any) -> int:
    """How many faults of ``result``'s plan fired that lose a rank (a kill, hang or stall; a preemption's notice),
    read from its events' fields (:meth:`~workbench.results.run_result.RunResult.fielded_events` refuses a result
    saved before they carried them)."""
    fired = ev.fired(result.fielded_events("counting the planned faults that fired"), ev.PLANNED)
    return sum(1 for e in fired if kinds.get(e["kind"]).ends_rank or kinds.get(e["kind"]).notice)


# -- statistics: workbench.campaigns.reproduce.stats (mean_interval, one_sided), re-exported
# ---------------------------------
def paired(frame: Any, a: str, b: str, column: str, by: Sequence[str] = ("world_size", "seed"),
           label: str = "strategy") -> list[float]:
    """``column`` of rows ``label == a`` minus that of ``label == b``, paired on ``by`` (the same seed and world
    size: the same failures), both completed."""
    done = frame[frame.outcome == "completed"]
    left = done[done[label] == a].set_index(list(by))[column]
    right = done[done[label] == b].set_index(list(by))[column]
    both = left.index.intersection(right.index)
    return (left[both] - right[both]).astype(float).tolist()


def fmt(interval: tuple[float, float, float], unit: str = "", digits: int = 2) -> str:
    """``1.23 [0.98, 1.48]%``: a mean or share with its interval."""
    mean, low, high = interval
    return f"{mean:.{digits}f} [{low:.{digits}f}, {high:.{digits}f}]{unit}"
