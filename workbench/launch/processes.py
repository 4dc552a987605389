"""Process helpers shared by the supervisor, the rank template and the ranks: nothing outlives its run, and every
process that runs rank code gets the same environment and import path, forked or fresh."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import threading
from collections.abc import Iterator, Mapping

# one thread per rank: torch's and the BLAS libraries' pools are sized at import, in the template
THREAD_ENV = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
# big tensors on 2 MiB pages (torch reads this at a process's first allocation): a killed rank's sockets close only
# once the kernel has freed its memory, 16x sooner in huge pages at 500 MiB (benchmarks/bench_death.py); =0: off
RANK_ENV_DEFAULTS = {"THP_MEM_ALLOC_ENABLE": "1"}


def child_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """For a process that runs rank code: this environment over the ranks' defaults, ``extra`` over both, and
    PYTHONPATH carrying this process's import path (a notebook's directory, the user's package)."""
    path = os.pathsep.join([*import_path(), os.environ.get("PYTHONPATH", "")])
    return {**RANK_ENV_DEFAULTS, **os.environ, **(extra or {}), "PYTHONPATH": path}


def import_path() -> list[str]:
    """This process's ``sys.path`` made absolute: ``''`` (the working directory, where a notebook's own modules
    are) and relative entries resolve here and now, whatever directory a rank later starts in."""
    return [os.path.abspath(p) for p in sys.path]


try:  # loaded once, here: die_with_parent also runs between fork and exec, where no library may be loaded
    _LIBC: ctypes.CDLL | None = ctypes.CDLL("libc.so.6", use_errno=True)
except OSError:
    _LIBC = None  # not Linux: the end of the control channel (ranks) or of stdin (the template) still stops it


def die_with_parent() -> None:
    """Linux: SIGKILL this process when the thread that started it ends (``PR_SET_PDEATHSIG``). Also the
    ``preexec_fn`` of the run's other processes (torchft's lighthouse, torchrun's agent): the signal survives
    their ``exec``, so they go with the supervisor even when it is killed and cannot clean up."""
    if _LIBC is not None:
        _LIBC.prctl(1, int(signal.SIGKILL))


def kill_session(pid: int) -> None:
    """SIGKILL the session ``pid`` leads (a rank and anything it started), or ``pid`` alone."""
    for kill in (lambda: os.killpg(pid, signal.SIGKILL), lambda: os.kill(pid, signal.SIGKILL)):
        try:
            kill()
        except (ProcessLookupError, PermissionError):
            pass


class HangUp(KeyboardInterrupt):
    """A SIGHUP (the terminal closed, an ssh session dropped): an interrupt that exits 129, not 130."""


class Interrupts:
    """What :func:`interrupted_once` saw: ``signalled`` once a SIGINT, SIGTERM or SIGHUP came; ``signum`` the
    first one."""

    signalled: bool = False
    signum: int | None = None

    @property
    def code(self) -> int:
        """The exit code the first signal makes: 129 for SIGHUP, 130 otherwise (SIGINT, SIGTERM)."""
        return 129 if self.signum == signal.SIGHUP else 130


INTERRUPTS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


@contextlib.contextmanager
def interrupted_once(process: bool = False) -> Iterator[Interrupts]:
    """In the main thread: the first SIGINT, SIGTERM or SIGHUP raises KeyboardInterrupt (:class:`HangUp` for
    SIGHUP; the caller stops its run and kills every rank on the way out); further ones are ignored from then on,
    since a second signal raised inside that clean-up left the result file open and h5py's exit handler crashed the
    interpreter (SIGSEGV, exit 139). A SIGHUP ignored on entry (``nohup``) stays ignored. The yielded
    :class:`Interrupts` says whether one came, however the block ended. On exit the previous handlers come back,
    unless one came or ``process`` (the block is the whole process's work, as in ``workbench``): then the signals
    stay ignored, so that a press while the process ends cannot change how it ended."""
    seen = Interrupts()
    caught = [sig for sig in INTERRUPTS if sig != signal.SIGHUP or signal.getsignal(sig) != signal.SIG_IGN]

    def interrupted(signum: int, frame: object) -> None:
        for sig in caught:
            signal.signal(sig, signal.SIG_IGN)
        if not seen.signalled:
            seen.signalled, seen.signum = True, signum
            raise HangUp if signum == signal.SIGHUP else KeyboardInterrupt

    handlers = {}
    if threading.current_thread() is threading.main_thread():
        handlers = {sig: signal.signal(sig, interrupted) for sig in caught}
    try:
        yield seen
    finally:
        for sig, handler in handlers.items():
            if process:
                signal.signal(sig, signal.SIG_IGN)
            elif signal.getsignal(sig) is interrupted:
                signal.signal(sig, handler)
