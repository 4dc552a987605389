"""The frame of the package's ``python -m`` entry points: bad arguments and refused settings are answered in one
line, exit 2; the first Ctrl-C (or SIGTERM) stops what runs and exits 130 in one line; never a traceback."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable

from workbench.base.errors import WorkbenchError
from workbench.base.interrupts import interrupted_once


class OneLineParser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose refusals are one line, ``PROG: error: ...``, exit 2 (no usage block)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message}\n")


def positive_int(text: str) -> int:
    """An argument that is an integer >= 1 (argparse answers anything else in one line, exit 2)."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not allowed: an integer >= 1")
    return value


def open_fd(text: str) -> int:
    """An argument that is a file descriptor open in this process (one a parent passed down)."""
    try:
        fd = int(text)
        os.fstat(fd)
    except (ValueError, OSError):
        raise argparse.ArgumentTypeError(f"{text!r} is not allowed: a file descriptor open in this process (the "
                                         "parent process passes it)") from None
    return fd


def answer(name: str, work: Callable[[], int], process: bool = True) -> int:
    """``work()``'s exit code; a :class:`WorkbenchError` (a refused setting) answered ``NAME: error: ...``, exit 2;
    the first SIGINT or SIGTERM (later ones ignored) stops any run still going and answers ``NAME: interrupted``,
    exit 130. ``process``: the call is the whole process's work (both signals stay ignored as it ends)."""
    with interrupted_once(process=process) as interrupts:
        pressed = False
        try:
            code = work()
        except WorkbenchError as exc:
            print(f"{name}: error: {exc}", file=sys.stderr)
            code = 2
        except KeyboardInterrupt:
            pressed = True
        if pressed or interrupts.signalled:
            if "workbench.launch.session" in sys.modules:  # a run started before the interrupt reached its wait()
                sys.modules["workbench.launch.session"].stop_all("interrupted", wait=30.0)
            print(f"{name}: interrupted", file=sys.stderr)
            code = getattr(interrupts, "code", 130) if interrupts.signalled else 130  # a caught SIGHUP: 129
    return code
