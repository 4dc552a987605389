"""A slow rank (``slow:rank=R,factor=F``, ``run.slow``): the rank throttles itself in proportion to its own compute,
so it composes with any model and shows on both clocks. Sleeping would add no CPU time (the rank-time clock would
not see it), so the throttle burns CPU: (F - 1) times the rank's own CPU per step, measured without the throttle
(the median of its last steps), at the mode's mid-step point, before its last gradient exchange, where the others
wait for it as for a real straggler (docs/permanent-faults.md, "Slow ranks and stragglers"). A step slowed before
any was measured burns against its own compute so far (less than a step): said, ``throttle_no_baseline``.
"""

from __future__ import annotations

import statistics
import time
from collections import deque

from workbench.base.fallbacks import taken
from workbench.faults import kinds
from workbench.faults.spec import FaultSpec
from workbench.rank.channel import cpu_time

BASELINE_STEPS = 5  # the compute a step is throttled against: the median of this many unthrottled measurements


class Throttle:
    """The slow-downs of one rank: planned (by step, from the fault plan) and live (``throttle`` messages, by
    time). Each step: :meth:`begin`, :meth:`burn` at the mid-step point, :meth:`end` before the step report."""

    def __init__(self) -> None:
        self.planned: list[FaultSpec] = []
        self.live: tuple[float, float | None] = (1.0, None)  # (factor, monotonic deadline or None: until changed)
        self.computes: deque[float] = deque(maxlen=BASELINE_STEPS)  # CPU per step without the throttle
        self.factor = 1.0  # this step's
        self._started: float | None = None  # cpu_time() at the step's start (None: nothing to measure)
        self._burned = 0.0
        self._done = False

    def plan(self, faults: list[FaultSpec]) -> None:
        """The planned slow faults of this rank (every generation message repeats them)."""
        self.planned = [f for f in faults if kinds.of(f).fires is kinds.Fires.THROTTLE]

    def set_live(self, factor: float, seconds: float | None) -> None:
        """A live slow-down from now (factor 1: none), for ``seconds`` (None: until the next one)."""
        self.live = (factor, None if seconds is None else time.monotonic() + seconds)

    def factor_at(self, step: int) -> float:
        factor = max((f.factor for f in self.planned if f.step <= step and (f.until is None or step < f.until)),
                     default=1.0)
        live, deadline = self.live
        if deadline is not None and time.monotonic() >= deadline:
            self.live = live, deadline = (1.0, None)
        return max(factor, live)

    @property
    def active(self) -> bool:
        return bool(self.planned) or self.live[0] > 1.0

    def begin(self, step: int) -> None:
        self.factor = self.factor_at(step)
        self._started = cpu_time() if self.active else None
        self._burned, self._done = 0.0, False

    def burn(self) -> None:
        """Burn (F - 1) times the rank's compute per step, once per step (the first call)."""
        if self.factor <= 1.0 or self._done or self._started is None:
            return
        self._done = True
        if self.computes:
            base = statistics.median(self.computes)
        else:  # no step measured yet (slowed from its first step, or live before any was timed): this one so far
            base = cpu_time() - self._started
            taken("throttle_no_baseline", f"slowed x{self.factor:g} before any step was measured: this step burns "
                  f"{self.factor - 1:g} times its compute up to its mid-step point ({base * 1e3:.1f} ms), so it is "
                  "slowed less than reported")
        target = (self.factor - 1.0) * base
        began = time.thread_time()  # the burn runs on this thread alone: its own clock measures it exactly
        while time.thread_time() - began < target:
            sum(i * i for i in range(200))  # busy: CPU time, not a sleep
        self._burned = time.thread_time() - began

    def end(self) -> float | None:
        """At the step's report: the factor it ran at (None: not slowed), its compute measured for the next."""
        if self._started is None:
            return None
        self.burn()  # a step that passed no mid-step point (a retried step) is throttled here
        self.computes.append(max(cpu_time() - self._started - self._burned, 0.0))
        self._started = None
        return self.factor if self.factor > 1.0 else None
