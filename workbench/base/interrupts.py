"""How an entry point takes Ctrl-C, SIGTERM and SIGHUP: the first raises (``KeyboardInterrupt``, :class:`HangUp`
for a closed terminal) so the caller stops its run and its ranks; further ones are ignored while it cleans up."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator


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
