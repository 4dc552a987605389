"""Straggler detector: a member whose step time — its own CPU per step, what it computes while the others wait for
it — is ``factor`` times the others' median, each taken as a median over the last ``window`` steps of the
generation. Pure bookkeeping: the supervisor feeds it every member's step reports and applies the run's response
(docs/permanent-faults.md, "Slow ranks and stragglers"). Wall time cannot tell: a synchronous step lasts as long
as its slowest member on every rank.
"""

from __future__ import annotations

import statistics
from array import array
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

COLUMNS = ("step", "generation", "rank", "cpu_s", "slow")  # of the per-rank step times (rows)
MIN_EXCESS_S = 0.001  # and at least this much slower per step: a fraction of a millisecond is the machine's noise


@dataclass(frozen=True)
class Straggler:
    """A flagged member: its median step time over the window against the others' median, at ``step``."""

    key: int
    label: int
    step: int
    own: float
    others: float

    @property
    def ratio(self) -> float:
        return self.own / self.others if self.others > 0 else float("inf")

    def detail(self, window: int) -> str:
        return (f"rank {self.label} is a straggler at step {self.step}: {self.own * 1e3:.2f} ms per step against the "
                f"others' median {self.others * 1e3:.2f} ms ({self.ratio:.2f}x, median over {window} steps)")


def find(times: dict[int, Sequence[float]], factor: float, window: int) -> list[tuple[int, float, float]]:
    """(key, own median, others' median) of each member whose median step time over its last ``window`` steps is at
    least ``factor`` times (and :data:`MIN_EXCESS_S` more than) the median of the other members' medians, slowest
    first; none until there are two members with ``window`` steps each."""
    full = {key: statistics.median(list(t)[-window:]) for key, t in times.items() if len(t) >= window}
    if len(full) < 2 or len(full) < len(times):
        return []
    found = [(key, own, statistics.median(v for k, v in full.items() if k != key)) for key, own in full.items()]
    return sorted([f for f in found if straggles(f[1], f[2], factor)], key=lambda f: f[1] / max(f[2], 1e-12),
                  reverse=True)


def straggles(own: float, others: float, factor: float) -> bool:
    """A median step time of ``own`` against the others' median ``others`` makes a straggler."""
    return own >= factor * others and own - others >= MIN_EXCESS_S


@dataclass
class Stragglers:
    """The supervisor's bookkeeping, by spawn id: fed each member's step time, it says who became a straggler (once
    per episode: a member that catches up may be flagged again) and keeps every member's step times for the
    per-rank figures (``rows``: one compact column per name of :data:`COLUMNS`)."""

    factor: float
    window: int
    enabled: bool = True
    gen: int = -1
    times: dict[int, deque[float]] = field(default_factory=dict)
    flagged: set[int] = field(default_factory=set)
    slowed: dict[int, float] = field(default_factory=dict)  # spawn -> the factor its latest step ran at
    labels: dict[int, int] = field(default_factory=dict)  # spawn -> its rank number
    medians: dict[int, float] = field(default_factory=dict)  # spawn -> its median over a full window
    groups: dict[int, int] = field(default_factory=dict)  # spawn -> who it is compared with (its pipeline stage)
    rows: dict[str, array] = field(default_factory=lambda: {c: array("d") for c in COLUMNS})

    def step(self, key: int, label: int, gen: int, step: int, spent: float | None, slow: float | None,
             group: int = 0) -> tuple[list[tuple[str, str, dict[str, Any]]], list[Straggler]]:
        """One member's step report: (events as (kind, detail, fields), the members newly flagged). Members are
        compared within their ``group`` only: a pipeline's stages differ by design, a stage's replicas do not."""
        events, self.labels[key], self.groups[key] = [], label, group
        if (slow or 1.0) != self.slowed.get(key, 1.0):
            events.append(("slow", f"rank {label} runs {slow:g}x slower", {"factor": slow}) if slow else
                          ("slow_end", f"rank {label} runs at full speed again", {"factor": self.slowed[key]}))
            self.slowed[key] = slow or 1.0
        if spent is None or spent != spent:
            return events, []
        for column, value in zip(COLUMNS, (step, gen, label, spent, slow or 1.0)):
            self.rows[column].append(value)
        if gen != self.gen:  # a new generation: new members, a new split of the batch
            if gen < self.gen:
                return events, []
            self.gen, self.times, self.medians, self.flagged = gen, {}, {}, set()
        times = self.times.setdefault(key, deque(maxlen=self.window))
        times.append(spent)
        if len(times) == self.window:
            self.medians[key] = statistics.median(times)
        peers = [k for k in self.times if self.groups.get(k) == group and k != key]
        if not self.enabled or key not in self.medians or not peers or any(k not in self.medians for k in peers):
            return events, []
        # the member reporting is judged (each judged at its own reports: the cost stays linear in the world)
        own, others = self.medians[key], statistics.median(self.medians[k] for k in peers)
        if not straggles(own, others, self.factor):
            self.flagged.discard(key)  # caught up: it may be flagged again
            return events, []
        if key in self.flagged:
            return events, []
        self.flagged.add(key)
        return events, [Straggler(key, label, step, own, others)]

    def forget(self, key: int) -> None:
        """A member left (dropped, failed): its times leave the comparison."""
        self.times.pop(key, None)
        self.medians.pop(key, None)
        self.flagged.discard(key)

    def table(self) -> dict[str, list[Any]]:
        """The per-rank step times as columns (the result's ``rank_steps``)."""
        return {c: [v if c in ("cpu_s", "slow") else int(v) for v in self.rows[c]] for c in COLUMNS}
