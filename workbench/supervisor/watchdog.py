"""Progress watchdog: a member that is alive (its heartbeat goes on) but holds the run up — stuck in a loop, a
deadlock, a collective that never ends — is found by the steps nobody commits, and named by what its heartbeat
says it is doing. Pure: the supervisor feeds it and kills whom it names (docs/permanent-faults.md).
"""

from __future__ import annotations

from dataclasses import dataclass

TIMEOUT_STEPS = 20  # the default timeout: this many times the slowest gap between two commits seen so far
FLOOR_S = 5.0  # ... and never under this (nor the heartbeat timeout): a loaded machine's hiccup is no stall
FIRST_STEP_S = 30.0  # a generation's first step (warm-up, stage planning) is given at least this long
STALE_S = 1.0  # a heartbeat older than this: the member may be frozen, which the heartbeat timeout judges


@dataclass
class Progress:
    """What the supervisor knows of one member: when it last committed a step (or joined its generation), and
    from its latest heartbeat whether it waits in a collective and how many it has waited for."""

    last_commit: float
    gen: int = -1  # the generation it joined
    heard: float = 0.0  # its latest heartbeat (or commit)
    waiting: bool | None = None  # None: its heartbeat does not say (a peer's rank)
    ops: int = 0
    commits: int = 0  # steps committed in this generation


def timeout(given: float | None, floor: float, slowest_gap: float) -> float:
    """The progress timeout: the one given, else ``TIMEOUT_STEPS`` slowest gaps, never under ``floor`` (the
    heartbeat timeout: a stall is told from a freeze no faster) nor ``FLOOR_S``."""
    return given if given is not None else max(floor, FLOOR_S, TIMEOUT_STEPS * slowest_gap)


def stalled(members: dict[int, Progress], now: float, limit: float) -> list[int]:
    """The members holding the run up, or [] while any member committed a step within ``limit`` seconds (its
    first in the generation: ``FIRST_STEP_S`` at least). Those
    busy in their own code while the others wait for them; if every one waits, those with the fewest
    collectives waited for (the others went on to the next one); if all wait in the same one, all of them."""
    if not members or any(now - p.last_commit <= (limit if p.commits else max(limit, FIRST_STEP_S))
                          for p in members.values()):
        return []
    if any(p.waiting is None for p in members.values()):
        return []
    busy = [key for key, p in members.items() if not p.waiting]
    if busy:
        return busy
    fewest = min(p.ops for p in members.values())
    return [key for key, p in members.items() if p.ops == fewest]


class Watchdog:
    """The supervisor's bookkeeping: fed joins, commits and heartbeats by spawn id; :meth:`check` names the
    members to kill as stalled, with the limit it used."""

    def __init__(self, given: float | None, floor: float) -> None:
        self.given, self.floor = given, floor
        self.progress: dict[int, Progress] = {}
        self.slowest_gap = 0.0  # between two commits of one member in one generation, its first left out

    def joined(self, key: int, gen: int, now: float) -> None:
        self.progress[key] = Progress(now, gen, heard=now)

    def committed(self, key: int, gen: int, now: float) -> None:
        p = self.progress.get(key)
        if p is None or p.gen != gen:
            return
        if p.commits:
            self.slowest_gap = max(self.slowest_gap, now - p.last_commit)
        p.last_commit, p.commits, p.heard = now, p.commits + 1, now

    def heartbeat(self, key: int, m: dict[str, object], now: float) -> None:
        p = self.progress.get(key)
        if p is not None:
            waiting, ops = m.get("waiting"), m.get("ops")
            p.waiting = waiting if isinstance(waiting, bool) else None
            p.ops = ops if isinstance(ops, int) else 0
            p.heard = now

    @property
    def limit(self) -> float:
        return timeout(self.given, self.floor, self.slowest_gap)

    def check(self, members: list[int], gen: int, now: float) -> list[tuple[int, float]]:
        """(key, seconds since its last commit) of the members of generation ``gen`` holding the run up; [] until
        every one of them has joined it, and while a heartbeat is stale (a frozen member: not the watchdog's)."""
        progress = {key: self.progress.get(key) for key in members}
        if not members or any(p is None or p.gen != gen or now - p.heard > STALE_S for p in progress.values()):
            return []
        return [(key, now - progress[key].last_commit) for key in stalled(progress, now, self.limit)]  # type: ignore
