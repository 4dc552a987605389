"""A run's output directory (``out``): what a run writes there, and the rule that one directory holds one run.

A run writes ``out/result.h5``, ``out/checkpoints/`` and ``out/logs/``. :func:`claim` takes the directory for one
run for its whole life (an exclusive ``flock`` on ``out/.workbench.lock``, which names the holder) and refuses,
with a :class:`~workbench.base.errors.ConfigError` before any process starts, an ``out`` another live run holds or one
that already holds a run's files; with ``overwrite`` the run removes only those files, once nothing can refuse its
start, and never the checkpoint it resumes from. A run without ``out`` keeps its checkpoints in a :func:`scratch`
directory. Details: docs/internals.md.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import socket
import stat
import sys
import tempfile
import time
from pathlib import Path

from workbench.base.errors import ConfigError
from workbench.base.h5files import reason
from workbench.results.run_result import RESULT_FILE

RUN_FILES = (RESULT_FILE, f".{RESULT_FILE}.*.tmp", "checkpoints/step_*.h5", "checkpoints/final.h5",
             "checkpoints/.*.tmp", "logs/*.log")
RUN_DIRECTORIES = ("checkpoints", "logs")
SCRATCH_PREFIX = "workbench-ckpt-"
LOCK_FILE = ".workbench.lock"  # held (flock) by the run that owns the directory; removed when it ends


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


class Claim:
    """``out`` held for one run: its lock file open and locked until :meth:`release` (or the process's death: the
    kernel drops the lock, and the next run takes the directory over)."""

    def __init__(self, path: Path, fd: int) -> None:
        self.path, self._fd = path, fd
        self.earlier: list[Path] = []  # an earlier run's files that ``overwrite`` replaces: removed by clear()

    @property
    def held(self) -> bool:
        return self._fd is not None

    def clear(self) -> None:
        """Remove the earlier run's files (:attr:`earlier`): when the new run starts, so that a start refused or
        failed before it leaves them all. ConfigError naming ``out`` if they cannot be removed."""
        try:
            clear(self.path, self.earlier)
        except OSError as exc:
            raise ConfigError("out", f"{self.path} cannot be written: {reason(exc)}") from None
        self.earlier = []

    def release(self) -> None:
        """Remove the lock file (while still holding it: a run that opened it meanwhile sees it gone and takes the
        new one) and let go; a second call does nothing."""
        fd, self._fd = self._fd, None
        if fd is None:
            return
        try:
            if _same_file(fd, self.path / LOCK_FILE):
                os.unlink(self.path / LOCK_FILE)
        except OSError:
            pass
        finally:
            os.close(fd)

    def __repr__(self) -> str:
        return f"Claim({str(self.path)!r}, held={self.held})"


def claim(out: str | os.PathLike, overwrite: bool = False, keep: str | os.PathLike | None = None) -> Claim:
    """Take ``out`` for a new run, for as long as the returned :class:`Claim` is held: refuse it (ConfigError) when
    another live run holds it, when it holds a run's files and not ``overwrite`` (else the claim's :meth:`~Claim.clear`
    removes them, all but ``keep``: the checkpoint the new run resumes from), when it is empty, a file or a dangling
    link; make it, and check it can be written (ConfigError naming it if not)."""
    if not str(out).strip():
        raise ConfigError("out", "an empty path is not allowed: give a directory ('.' for the current one)")
    out = Path(out)
    if out.is_symlink() and not out.exists():
        raise ConfigError("out", f"{out} is a dangling symbolic link (to {os.readlink(out)}): give a directory, "
                          "or a link to one")
    if out.exists() and not out.is_dir():
        raise ConfigError("out", f"{out} is a file, not a directory")
    try:
        out.mkdir(parents=True, exist_ok=True)
        held = Claim(out, _lock(out))
    except OSError as exc:
        raise ConfigError("out", f"{out} cannot be written: {reason(exc)}") from None
    try:
        found = run_files(out)
        if found and not overwrite:
            raise ConfigError("out", f"{out} already holds a run ({describe(found, out)}): give another directory, "
                              "or overwrite it (--overwrite, overwrite=True) to replace that run")
        kept = _resolved(keep) if keep is not None else None
        held.earlier = [p for p in found if kept is None or _resolved(p) != kept]
    except BaseException:
        held.release()
        raise
    return held


def _resolved(path: str | os.PathLike) -> Path:
    """``path`` absolute, through every link (a link to the file names the file); as it is when that fails."""
    try:
        return Path(path).resolve()
    except (OSError, RuntimeError):
        return Path(os.path.abspath(path))


def _lock(out: Path) -> int:
    """Open and lock ``out/LOCK_FILE`` (its descriptor), or raise ConfigError naming the live run that holds it.
    A lock file removed by its holder between this open and this lock is left for the new one (bounded)."""
    path = out / LOCK_FILE
    for _ in range(20):
        fd = _open_lock(path)
        locked = False
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise ConfigError("out", f"{out} is in use by another run ({holder(out)}): wait for it to end, or "
                                  "give another directory") from None
            locked = True
            if _same_file(fd, path):
                _write_holder(fd)
                return fd
        except BaseException:
            if locked and _same_file(fd, path):
                with contextlib.suppress(OSError):
                    os.unlink(path)  # ours: made or taken over here, and not to be left half-written
            os.close(fd)
            raise
        os.close(fd)
    raise ConfigError("out", f"{out}: its lock file {LOCK_FILE} keeps being replaced")


def _open_lock(path: Path) -> int:
    """Open (or make) the lock file; ConfigError naming it when something else is there or it cannot be opened
    (a directory, a symbolic link, an immutable file), where ``out`` itself may be fine."""
    try:
        return os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        if path.is_symlink():
            what = f"a symbolic link (to {os.readlink(path)}), not a lock file"
        elif path.is_dir():
            what = "a directory, not a lock file"
        elif path.exists():
            what = f"a lock file that cannot be opened for writing ({reason(exc)})"
        else:
            raise  # out itself cannot be written: claim() says so
        raise ConfigError("out", f"{path} is {what}: remove it if no run uses {path.parent}") from None


def _same_file(fd: int, path: Path) -> bool:
    try:
        mine, there = os.fstat(fd), os.stat(path, follow_symlinks=False)
    except FileNotFoundError:
        return False
    return (mine.st_dev, mine.st_ino) == (there.st_dev, there.st_ino)


def _write_holder(fd: int) -> None:
    record = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.strftime("%Y-%m-%d %H:%M:%S"),
              "command": " ".join(sys.argv)[:300]}
    os.ftruncate(fd, 0)
    os.pwrite(fd, json.dumps(record).encode() + b"\n", 0)


def holder(out: str | os.PathLike, wait: float = 1.0) -> str:
    """Who holds ``out`` (``pid 123 on host h since 2026-01-02 10:00:00: workbench run ...``), from its lock file;
    a holder that has locked it but not yet written itself there is waited for up to ``wait`` seconds."""
    deadline = time.monotonic() + wait
    while True:
        try:
            record = json.loads((Path(out) / LOCK_FILE).read_text(encoding="utf-8", errors="replace")[:4096])
            return (f"pid {record['pid']} on {record['host']} since {record['started']}: "
                    + " ".join(str(record["command"]).split()))
        except (OSError, ValueError, KeyError, TypeError):
            if time.monotonic() >= deadline:
                return "its holder did not say who it is"
            time.sleep(0.02)


def remove_temporaries(out: str | os.PathLike) -> list[Path]:
    """Remove the hidden temporary files of writes that never finished (``checkpoints/.step_*.h5.<pid>.tmp`` of a
    rank killed mid-write) from ``out``, whose run has ended; the paths removed."""
    removed = []
    for path in Path(out).glob("checkpoints/.*.tmp"):
        try:
            path.unlink()
            removed.append(path)
        except OSError:
            pass
    return removed


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


def fresh(base: str | os.PathLike, make: bool = False) -> Path:
    """``base``, or ``base-2``, ``base-3``, ... : the first that does not exist (the default ``runs/run-<time>`` of
    two runs started in the same second); ``make``: made here, atomically, so that two processes never get the
    same one."""
    base = Path(base)
    candidate, n = base, 1
    while True:
        if not candidate.exists() and not candidate.is_symlink():
            if not make:
                return candidate
            try:
                candidate.mkdir(parents=True)
                return candidate
            except FileExistsError:
                pass
        n += 1
        candidate = base.with_name(f"{base.name}-{n}")


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
