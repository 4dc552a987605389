"""Where a result came from: versions, source commit, machine, load, time, command line and seed.

:func:`collect` is called when a run (or a sweep point) starts and :func:`finish` when it ends; the dict they build
(keys: :data:`FIELDS`) is stored with every result, sweep row and checkpoint and read back as ``prov.*`` columns.
Everything here is cheap (no torch, one cached ``git describe``) and nothing raises: a value that cannot be read
is ``None`` (``"unknown"`` for the commit). What each key holds: docs/internals.md.
"""

from __future__ import annotations

import functools
import os
import platform
import shlex
import socket
import subprocess
import sys
import threading
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

from workbench.base import machine
from workbench.base.fallbacks import taken

if TYPE_CHECKING:
    import pandas as pd

PREFIX = "prov."
COMMAND_VAR = "WORKBENCH_COMMAND"
NOTEBOOK_VAR = "WORKBENCH_NOTEBOOK"
PACKAGES = ("workbench", "torch", "numpy", "h5py", "papermill")
FIELDS = ("workbench", "commit", "dirty", "python", *PACKAGES[1:], "host", "cpu", "cores", "usable_cores",
          "memory_gib", "device", "load_start", "load_end", "steal_pct", "started_utc", "ended_utc", "command",
          "notebook", "seed", "probe_us", "probe_source")
_TICKS = "_cpu_ticks"  # the host's (steal, total) CPU ticks at the start: steal_pct at the end
UNKNOWN = "unknown"
_SOURCE = Path(__file__).resolve().parents[2]  # the directory holding the workbench package
_LOCK = threading.RLock()


def utc_now() -> str:
    """Now, as ISO 8601 UTC with milliseconds (``2026-11-25T08:15:00.123+00:00``)."""
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


def collect(seed: int | None = None, device: str | None = None, speed_probe: bool = False) -> dict[str, Any]:
    """Provenance at the start of a run: every key of :data:`FIELDS`, ``load_end`` and ``ended_utc`` still None;
    ``device``: where the ranks compute (:func:`workbench.config.devices.describe`; None for a sweep point);
    ``speed_probe``: the run's ranks scale their CPU time to ``probe_us`` (:func:`probe_reference`)."""
    commit, dirty = git_state()
    return {**static(), "commit": commit, "dirty": dirty, "device": device, "usable_cores": machine.usable_cores(),
            "load_start": _load(), "load_end": None, "steal_pct": None, "started_utc": utc_now(), "ended_utc": None,
            "command": command(), "notebook": notebook(), "seed": seed, **probe_reference(speed_probe),
            _TICKS: machine.cpu_ticks()}


def probe_reference(speed_probe: bool) -> dict[str, Any]:
    """``probe_us``: the speed probe's time at this machine's reference speed, which the ranks of a ``speed_probe``
    run scale their CPU time to (:mod:`workbench.rank.speed`), and ``probe_source`` (given, measured, or why it could
    not be measured: then the ranks do not scale). Both None when the probe is off."""
    if not speed_probe:
        return {"probe_us": None, "probe_source": None}
    try:
        value, source = machine.probe_us()
    except (RuntimeError, ValueError) as exc:
        taken("speed_probe_unmeasured", f"speed_probe: {exc}: the ranks' CPU time is not scaled to a reference speed")
        return {"probe_us": None, "probe_source": str(exc)}
    return {"probe_us": value, "probe_source": source}


def finish(provenance: dict[str, Any]) -> dict[str, Any]:
    """``provenance`` with ``ended_utc``, ``load_end`` and ``steal_pct`` (the share of the host's CPU stolen by
    its hypervisor since :func:`collect`) filled in (a new dict)."""
    done = {k: v for k, v in provenance.items() if k != _TICKS}
    start = provenance.get(_TICKS)
    steal = machine.steal_pct(tuple(start), machine.cpu_ticks()) if start else provenance.get("steal_pct")
    return {**done, "ended_utc": utc_now(), "load_end": _load(), "steal_pct": steal}


def static() -> dict[str, Any]:
    """What does not change while this process lives: versions, host, CPU, cores, memory (cached)."""
    with _LOCK:  # one reading, whichever thread asks first
        return _static()


@functools.lru_cache(maxsize=1)
def _static() -> dict[str, Any]:
    versions = {name: _version(name) for name in PACKAGES}
    if versions["workbench"] is None:
        from workbench import __version__

        versions["workbench"] = __version__
    return {**versions, "python": platform.python_version(), "host": socket.gethostname(), "cpu": _cpu_model(),
            "cores": os.cpu_count(), "memory_gib": _memory_gib()}


def git_state() -> tuple[str, bool | None]:
    """(commit, dirty) of the checkout the workbench package comes from, once per process; (``"unknown"``, None)
    when it is not a git checkout or git fails (missing, too slow: 5 s)."""
    with _LOCK:
        return _git_state()


@functools.lru_cache(maxsize=1)
def source_digest() -> str:
    """SHA-256 of the ``workbench`` package's Python sources (paths and contents), once per process: what a cache
    of results keys on, so that a result computed by other code is never taken for this code's (a commit would not
    see uncommitted edits)."""
    import hashlib

    package = Path(__file__).resolve().parents[1]
    digest = hashlib.sha256()
    for path in sorted(package.rglob("*.py")):
        digest.update(str(path.relative_to(package)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


@functools.lru_cache(maxsize=1)
def _git_state() -> tuple[str, bool | None]:
    if not (_SOURCE / ".git").exists():  # a directory, or a file in a worktree; site-packages has none
        return UNKNOWN, None
    try:
        out = subprocess.run(["git", "-C", str(_SOURCE), "describe", "--always", "--dirty", "--abbrev=40",
                              "--exclude=*"], capture_output=True, text=True, timeout=5,
                             env={**os.environ, "GIT_OPTIONAL_LOCKS": "0"})
    except (OSError, subprocess.SubprocessError):
        return UNKNOWN, None
    text = out.stdout.strip()
    if out.returncode != 0 or not text:
        return UNKNOWN, None
    dirty = text.endswith("-dirty")
    return text.removesuffix("-dirty"), dirty


def command() -> str:
    """``$WORKBENCH_COMMAND`` if set (a sweep's command line, passed to its points), else this process's argv."""
    return os.environ.get(COMMAND_VAR) or shlex.join([os.path.basename(sys.argv[0]) if sys.argv else "",
                                                      *sys.argv[1:]]).strip()


def notebook() -> str | None:
    """The notebook this process runs, when known: ``$WORKBENCH_NOTEBOOK`` (a sweep's point), else JupyterLab's
    ``$JPY_SESSION_NAME``."""
    return os.environ.get(NOTEBOOK_VAR) or os.environ.get("JPY_SESSION_NAME") or None


def columns(provenance: dict[str, Any] | None) -> dict[str, Any]:
    """``prov.<key>`` -> value, for a table row (empty for a result without provenance)."""
    return {f"{PREFIX}{k}": v for k, v in (provenance or {}).items()}


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def _load() -> float | None:
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return None


def _cpu_model() -> str | None:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.lower().startswith(("model name", "hardware", "cpu model")):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or None


def _memory_gib() -> float | None:
    try:
        return round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 2)
    except (ValueError, OSError, AttributeError):
        return None


def describe(frame: pd.DataFrame) -> tuple[list[str], list[str]]:
    """What the ``prov.*`` columns of a sweep's table say, as lines of text, and warnings: the points of one sweep
    come from different commits or hosts (a point of unknown commit counts as one more). Rows without provenance
    (run before it was kept) are counted, not guessed at."""
    if f"{PREFIX}started_utc" not in frame.columns:
        return ["no provenance recorded (the points ran before workbench kept it)"], []
    known = frame[frame[f"{PREFIX}started_utc"].notna()]
    lines = [f"{len(frame) - len(known)} of {len(frame)} points have no provenance"] if len(known) < len(frame) else []

    def values(key: str) -> list[Any]:
        column = known[f"{PREFIX}{key}"] if f"{PREFIX}{key}" in known.columns else [None] * len(known)
        return [None if isinstance(v, float) and v != v else v for v in column]

    def tally(key: str, width: int | None = None) -> str:
        counts: dict[str, int] = {}
        for value in values(key):
            text = UNKNOWN if value is None else str(value)[:width]
            counts[text] = counts.get(text, 0) + 1
        return ", ".join(f"{k} ({n} points)" if len(counts) > 1 else k for k, n in counts.items())

    dirty = sum(1 for v in values("dirty") if v is True or v == 1)
    lines.append(f"commit {tally('commit', 12)}" + (f"; {dirty} point(s) ran from a checkout with uncommitted "
                                                    "changes" if dirty else ""))
    lines.append(f"host {tally('host')}; CPU {tally('cpu')}; {tally('cores')} cores; {tally('memory_gib')} GiB")
    lines.append("; ".join(f"{name} {tally(name)}" for name in ("workbench", "python", *PACKAGES[1:])))
    started, ended = [v for v in values("started_utc") if v], [v for v in values("ended_utc") if v]
    if started:
        lines.append(f"ran from {min(started)} to {max(ended) if ended else '?'}")
    loads = [v for v in values("load_start") + values("load_end") if v is not None]
    if loads:
        lines.append(f"1-minute load {min(loads):.2f} to {max(loads):.2f}")
    lines.append(f"command {tally('command')}")
    warnings = []
    for key, what in (("commit", "commits"), ("host", "hosts")):
        distinct = {UNKNOWN if v is None else v for v in values(key)}
        if len(distinct) > 1:
            warnings.append(f"the points come from {len(distinct)} different {what}: {tally(key, 12)}")
    return lines, warnings
