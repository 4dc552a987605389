"""A run's output directory (``out``): what a run writes there, and the rule that one directory holds one run.

A run writes ``out/result.h5``, ``out/checkpoints/`` and ``out/logs/``. :func:`claim` refuses an ``out`` that
already holds any of them with a :class:`~workbench.errors.ConfigError` before any process starts; with
``overwrite`` it removes only those files. It also makes the directory and checks that it can be written. A run
without ``out`` keeps its checkpoints in a :func:`scratch` directory. Details: docs/internals.md.
"""

from __future__ import annotations

import os
import shutil
import socket
import stat
import tempfile
from pathlib import Path

from workbench.errors import ConfigError
from workbench.h5files import reason
from workbench.results import RESULT_FILE

RUN_FILES = (RESULT_FILE, f".{RESULT_FILE}.*.tmp", "checkpoints/step_*.h5", "checkpoints/final.h5",
             "checkpoints/.*.tmp", "logs/*.log")
RUN_DIRECTORIES = ("checkpoints", "logs")
SCRATCH_PREFIX = "workbench-ckpt-"


def run_files(out: str | os.PathLike) -> list[Path]:
    """The files of a run in ``out`` (:data:`RUN_FILES`), sorted; none when ``out`` is no directory."""
    out = Path(out)
    if not out.is_dir():
        return []
    return sorted({p for pattern in RUN_FILES for p in out.glob(pattern) if p.is_file() or p.is_symlink()})


def describe(files: list[Path], out: Path) -> str:
    """``result.h5, 3 checkpoints, 2 logs``: what :func:`run_files` found."""
    names = [p.relative_to(out).as_posix() for p in files]
    parts = [RESULT_FILE] if RESULT_FILE in names else []
    for folder, what in (("checkpoints/", "checkpoint"), ("logs/", "log")):
        n = sum(name.startswith(folder) for name in names)
        if n:
            parts.append(f"{n} {what}{'s' if n > 1 else ''}")
    return ", ".join(parts) or "temporary files"


def claim(out: str | os.PathLike, overwrite: bool = False) -> Path:
    """Make ``out`` ready for a new run: refuse it (ConfigError) when it holds a run's files and not
    ``overwrite``, else remove those; make it, and check it can be written (ConfigError naming it if not)."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise ConfigError("out", f"{out} is a file, not a directory")
    found = run_files(out)
    if found and not overwrite:
        raise ConfigError("out", f"{out} already holds a run ({describe(found, out)}): give another directory, or "
                          "overwrite it (--overwrite, overwrite=True) to replace that run")
    try:
        out.mkdir(parents=True, exist_ok=True)
        handle, probe = tempfile.mkstemp(prefix=".workbench-", suffix=".tmp", dir=out)
        os.close(handle)
        os.unlink(probe)
        clear(out, found)
    except OSError as exc:
        raise ConfigError("out", f"{out} cannot be written: {reason(exc)}") from None
    return out


def clear(out: str | os.PathLike, files: list[Path] | None = None) -> None:
    """Remove a run's files from ``out`` (those :func:`run_files` finds, or ``files``), and its ``checkpoints``
    and ``logs`` folders where that leaves them empty."""
    out = Path(out)
    for path in run_files(out) if files is None else files:
        path.unlink(missing_ok=True)
    for folder in RUN_DIRECTORIES:
        try:
            (out / folder).rmdir()
        except OSError:
            pass  # absent, or holding files that are not the run's


def fresh(base: str | os.PathLike) -> Path:
    """``base``, or ``base-2``, ``base-3``, ... : the first that does not exist (the default ``runs/run-<time>`` of
    two runs started in the same second)."""
    base = Path(base)
    candidate, n = base, 1
    while candidate.exists():
        n += 1
        candidate = base.with_name(f"{base.name}-{n}")
    return candidate


def scratch() -> tempfile.TemporaryDirectory:
    """A temporary directory for the checkpoints of a run without ``out``, named for this process and host
    (``workbench-ckpt-<pid>-<host>-...``). Those a killed process of this user on this host left (a SIGKILLed kernel
    cannot clean up) are removed first; a directory whose process still lives is never touched."""
    base, host, uid = Path(tempfile.gettempdir()), socket.gethostname(), os.getuid()
    for stale in base.glob(f"{SCRATCH_PREFIX}*-{host}-*"):
        pid, _, rest = stale.name[len(SCRATCH_PREFIX):].partition("-")
        try:
            info = stale.lstat()
        except OSError:
            continue
        if (pid.isdigit() and rest.startswith(f"{host}-") and info.st_uid == uid and stat.S_ISDIR(info.st_mode)
                and not _alive(int(pid))):  # lstat: a link to a directory is not one
            shutil.rmtree(stale, ignore_errors=True)
    return tempfile.TemporaryDirectory(prefix=f"{SCRATCH_PREFIX}{os.getpid()}-{host}-")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's
    return True
