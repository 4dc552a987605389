"""Process lifetime helpers shared by the supervisor, the rank template and the ranks: nothing outlives its run."""

from __future__ import annotations

import ctypes
import os
import signal


def die_with_parent() -> None:
    """Linux: SIGKILL this process when the thread that started it ends (``PR_SET_PDEATHSIG``)."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)
    except OSError:
        pass  # not Linux: the end of the control channel (ranks) or of stdin (the template) still stops it


def kill_session(pid: int) -> None:
    """SIGKILL the session ``pid`` leads (a rank and anything it started), or ``pid`` alone."""
    for kill in (lambda: os.killpg(pid, signal.SIGKILL), lambda: os.kill(pid, signal.SIGKILL)):
        try:
            kill()
        except (ProcessLookupError, PermissionError):
            pass
