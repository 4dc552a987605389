"""Process helpers shared by the supervisor, the rank template and the ranks: nothing outlives its run, and every
process that runs rank code gets the same environment and import path, forked or fresh."""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from collections.abc import Mapping

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
