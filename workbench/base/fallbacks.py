"""No silent fallback: a path that trades speed or accuracy for going on (a cache that cannot be written, a
measurement that had to be replaced, a template that had to be started afresh) says so when it is taken, through
:func:`taken`. Every run in progress in this process hears it: its recorder writes a ``fallback`` event (``what``:
a short stable name; ``detail``: what was taken and what it costs) and its summary's ``fallbacks`` lists the names.
Taken where no run is in progress, it is a :class:`FallbackWarning`; taken while a run's configuration is prepared
(:func:`preparing`), the run started next in that thread records it too (:func:`claim`). The list of them:
docs/concepts.md ("No silent fallback").
"""

from __future__ import annotations

import contextlib
import threading
import warnings
import weakref
from collections.abc import Iterator
from typing import Protocol


class FallbackWarning(UserWarning):
    """A fallback taken while no run was in progress in this process (``what``: its stable name)."""

    def __init__(self, what: str, detail: str) -> None:
        super().__init__(detail)
        self.what = what


class Listener(Protocol):
    def fallback(self, what: str, detail: str) -> None: ...


_listeners: weakref.WeakSet[Listener] = weakref.WeakSet()  # a run's recorder, from its start to its result
_lock = threading.Lock()
_unclaimed = threading.local()  # said in this thread while no run listened: the next run started here claims them


def listen(listener: Listener) -> None:
    """``listener.fallback(what, detail)`` hears every fallback taken from now on, in whichever thread."""
    with _lock:
        _listeners.add(listener)


def forget(listener: Listener) -> None:
    with _lock:
        _listeners.discard(listener)


def taken(what: str, detail: str) -> None:
    """Say that fallback ``what`` was taken (``detail``: one line, what was taken and what it costs): to every run in
    progress, or as a :class:`FallbackWarning` where there is none."""
    with _lock:
        listeners = list(_listeners)
    for listener in listeners:
        listener.fallback(what, detail)
    if not listeners:
        warnings.warn(FallbackWarning(what, detail), stacklevel=2)
        said = getattr(_unclaimed, "said", None)
        if said is not None:  # preparing a run
            said[what] = detail  # the latest of each kind


@contextlib.contextmanager
def preparing() -> Iterator[None]:
    """While a run's configuration is prepared (:func:`workbench.launch.session.prepare`): what this thread falls back
    on is kept for the run it starts next (:func:`claim`), in place of what an earlier preparation kept."""
    _unclaimed.said = {}
    kept = _unclaimed.said
    try:
        yield
    finally:
        _unclaimed.said = None
        _unclaimed.kept = kept


def claim() -> list[tuple[str, str]]:
    """The fallbacks taken while this thread last prepared a run (``device`` auto on a machine without a GPU), as
    (what, detail), each once; they are this thread's no more."""
    kept = getattr(_unclaimed, "kept", None) or {}
    _unclaimed.kept = None
    return list(kept.items())
