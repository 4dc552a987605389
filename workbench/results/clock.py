"""Two clocks for every time figure: ``wall`` (what the host took) and ``rank`` (what a machine with one core per
rank would take), the column names that hold each, and which one a figure shows by default.

Every rank stamps the CPU time of its own work on its ``ready``, ``joined`` and ``step`` messages; a step lasts as
long as its slowest rank, charged for its bytes and messages by :mod:`workbench.base.machine`. The supervisor does the
bookkeeping (:class:`RankTime`); a figure ``x`` on the rank clock is the column ``rank_x``. The model in full:
docs/concepts.md ("Two clocks") and docs/internals.md.
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from workbench.base.fallbacks import taken
from workbench.base.machine import disk_mibs, latency_us, net_mibs
from workbench.faults import kinds

CLOCKS = ("wall", "rank")
PREFIX = "rank_"
TIME_FIGURES = ("detection_s", "resume_s", "settle_s", "join_s", "regrow_s")  # a failure's, on both clocks
WINDOW = 10  # steps over which a step's slowest rank is found (RankTime.settle_steps)
STEAL_LIMIT_PCT = 2.0  # the host stole more than this share of the CPU during a run: wall time measures the host
NAMES = {"wall": "wall clock", "rank": "rank-time clock"}
DISK_WAIT_S = 30.0  # at a run's end, how long the disk thread is waited for before the speed is learnt again


def column(name: str, clock: str) -> str:
    """The column holding figure ``name`` on ``clock`` (``train_s`` -> ``rank_train_s`` on the rank clock)."""
    if clock not in CLOCKS:
        raise ValueError(f"clock must be one of {', '.join(CLOCKS)}, not {clock!r}")
    return name if clock == "wall" else PREFIX + name


def label(what: str, clock: str) -> str:
    """An axis title that names its clock: ``runtime overhead (%, rank-time clock)``."""
    inner = what[what.index("(") + 1:what.rindex(")")] if what.endswith(")") and "(" in what else ""
    head = what[:what.index("(")].rstrip() if inner else what
    return f"{head} ({inner + ', ' if inner else ''}{NAMES[clock]})"


def default(summary: dict[str, Any] | None = None, provenance: dict[str, Any] | None = None) -> str:
    """``rank`` where the run was oversubscribed (more ranks than cores it could use) or the host stole more than
    :data:`STEAL_LIMIT_PCT` of the CPU during it, else ``wall``."""
    summary, provenance = summary or {}, provenance or {}
    if summary.get("oversubscribed"):
        return "rank"
    steal = provenance.get("steal_pct")
    return "rank" if steal is not None and steal > STEAL_LIMIT_PCT else "wall"


def frame_default(frame: Any) -> str:
    """The clock for a table of runs: ``rank`` if any run in it calls for it (one figure, one clock)."""
    import pandas as pd

    flags = frame["oversubscribed"] if "oversubscribed" in frame else []
    over = any(v is not None and v == v and bool(v) for v in flags)
    steal = pd.to_numeric(frame["prov.steal_pct"], errors="coerce").max() if "prov.steal_pct" in frame else None
    return "rank" if over or (steal is not None and steal == steal and steal > STEAL_LIMIT_PCT) else "wall"


def resolve(clock: str | None, frame: Any) -> str:
    """``clock`` checked, or the table's default where None."""
    if clock is None:
        return frame_default(frame)
    column("x", clock)  # raises on a name that is not a clock
    return clock


def teardown_s(proc: Any, fault: dict[str, Any], say: Callable[[str, str], None] = taken) -> float | None:
    """CPU seconds a rank that killed itself spent from its ``fault`` message to its end: the kernel tearing its
    process down before its connection closes, read from the usage its template reaped. None where either is
    unknown (a rank started afresh, a death that was not announced) or the rank did not die by its own kill (a hang
    or a stall is found by a timeout: a wait by design). A forked rank not reaped in time (its wait timed out) is a
    fallback, said through ``say`` (``teardown_unmeasured``): the wall detection counts."""
    spent, before = getattr(proc, "cpu_s", None), fault.get("process_cpu")
    if before is None or not getattr(kinds.find(fault.get("kind")), "kills", False):
        return None
    if spent is None:
        if hasattr(proc, "cpu_s"):  # forked, its kill announced, not reaped yet: its teardown is unknown
            say("teardown_unmeasured", f"rank pid {getattr(proc, 'pid', '?')} was not reaped in time: its "
                "teardown CPU is unknown, so its failure's detection counts the wall detection on the rank clock")
        return None
    return max(spent - before, 0.0)


def detection(failures: list[Any]) -> tuple[float, bool]:
    """The rank-clock detection of the failures that called a generation, and whether it was a connection's end
    (one message's latency is added once known): a dead rank's teardown where it was measured, else the wall
    detection (a heartbeat or progress timeout, a configured delay: waits by design)."""
    waits = [(f.teardown, True) if f.teardown is not None else (f.detection, False) for f in failures]
    return max(waits, default=(0.0, False))


def _windows(rows: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """Consecutive rows of one generation, :data:`WINDOW` at most each."""
    windows: list[list[dict[str, Any]]] = []
    for row in rows:
        if windows and len(windows[-1]) < WINDOW and windows[-1][-1]["generation"] == row["generation"]:
            windows[-1].append(row)
        else:
            windows.append([row])
    return windows


# -- the supervisor's bookkeeping --------------------------------------------------------------------------------
@dataclass
class _Generation:
    pre: float = 0.0  # the slowest member's CPU from its last step report to entering the join (work abandoned)
    join: float = 0.0  # the slowest member's CPU in the join
    start: float = 0.0  # start-up CPU of a rank started for this generation (fork to ready)
    wait: float = 0.0  # the detection of the failure that called it: a dead rank's teardown, or a wait by design
    hop: bool = False  # that detection was a connection's end: one message's latency is added to it
    io: float = 0.0  # checkpoint bytes read at the disk's bandwidth (filled in at the end of the run)
    read: int = 0  # bytes of the checkpoint it resumed from
    received: int = 0  # the most state bytes a member received
    net: float = 0.0  # those bytes at the network's bandwidth (filled in at the end of the run)
    measured: bool = True  # every member stamped its CPU time (a peer that does not: its wall gap is used)

    @property
    def cost(self) -> float:
        return max(self.wait, self.pre) + self.start + self.join + self.net + self.io


@dataclass
class RankTime:
    """Rank-time bookkeeping of one run, fed with the ranks' CPU stamps (spawn id -> last stamp). ``bubble``: a
    GPipe step lasts (M + S - 1) / M times its busiest stage's CPU (M micro-batches through S stages: a stage idles
    while the pipeline fills and drains); 1 for data parallel and gossip. ``say``: how a fallback of this run's
    bookkeeping is said (the recorder's :meth:`~workbench.supervisor.recorder.Recorder.fallback`)."""

    bubble: float = 1.0
    last: dict[int, float] = field(default_factory=dict)
    ready: dict[int, tuple[float, float]] = field(default_factory=dict)  # spawn -> (wall time of ready, CPU)
    spent: dict[tuple[int, int], dict[int, float]] = field(default_factory=dict)  # (gen, step) -> spawn -> CPU
    sent: dict[tuple[int, int], dict[int, tuple[int, int]]] = field(default_factory=dict)  # -> (bytes, messages)
    rows: dict[tuple[int, int], dict[str, Any]] = field(default_factory=dict)
    gens: dict[int, _Generation] = field(default_factory=dict)
    trained: set[int] = field(default_factory=set)  # spawns that reported a step
    disk: tuple[float, str] | None = None  # (MiB/s, where it came from): what checkpoint reads are charged at
    net: tuple[float, str] | None = None  # (MiB/s, where it came from): what bytes sent are charged at
    latency: tuple[float, str] | None = None  # (µs, where it came from): what each message sent is charged
    say: Callable[[str, str], None] = field(default=taken, repr=False, compare=False)
    _disk_thread: threading.Thread | None = None

    def on_ready(self, spawn: int, m: dict[str, Any]) -> None:
        if "cpu" in m:
            self.ready[spawn] = (time.time(), float(m["cpu"]))
            self.last[spawn] = float(m["cpu"])

    def on_step(self, spawn: int, m: dict[str, Any]) -> None:
        if "cpu" not in m:
            return
        cpu = float(m["cpu"])
        spent = cpu - self.last.get(spawn, cpu)
        self.last[spawn] = cpu
        self.trained.add(spawn)
        key = (m["gen"], m["step"])
        self.spent.setdefault(key, {})[spawn] = spent
        if m.get("sent") or m.get("msgs"):
            self.sent.setdefault(key, {})[spawn] = (int(m.get("sent") or 0), int(m.get("msgs") or 0))
        if key in self.rows:
            self.rows[key]["rank_step_time"] = self.slowest(key)

    def slowest(self, key: tuple[int, int]) -> float:
        """The most CPU one rank has reported for step ``key`` (gen, step) so far; NaN before any report."""
        return max(self.spent.get(key, {}).values(), default=float("nan"))

    def on_row(self, gen: int, row: dict[str, Any]) -> None:
        """Rank 0's report made a metrics row: it carries the slowest rank's CPU seen so far (updated as the
        other members' reports arrive)."""
        key = (gen, row["step"])
        self.rows[key] = row
        row["rank_step_time"] = self.slowest(key)

    def on_joined(self, spawn: int, m: dict[str, Any], wait: float, since: float | None, hop: bool = False) -> None:
        """A member settled generation ``m["gen"]``. ``wait``: the detection of the failure that called it (0
        for a generation no failure called; :func:`detection`), ``hop``: seen at a connection's end; ``since``: the
        wall time of that failure (a rank ready after it was started for it: its start-up is on the recovery's
        path)."""
        gen = self.gens.setdefault(m["gen"], _Generation())
        gen.wait, gen.hop = max(gen.wait, wait), gen.hop or hop
        gen.received = max(gen.received, int(m.get("bytes_in") or 0))
        if "cpu" not in m:
            gen.measured = False
            return
        cpu = float(m["cpu"])
        join = float(m.get("sync_cpu", cpu - self.last.get(spawn, cpu)))
        gen.join = max(gen.join, join)
        if spawn in self.trained:  # a member that was training: what it abandoned (a newcomer was waiting)
            gen.pre = max(gen.pre, cpu - join - self.last[spawn])
        if since is not None and spawn in self.ready and self.ready[spawn][0] >= since:
            gen.start = max(gen.start, self.ready[spawn][1])
        self.last[spawn] = cpu

    def reads_from(self, gen: int, path: str) -> None:
        """Generation ``gen`` resumes from checkpoint ``path``: its bytes are charged at the disk's bandwidth (a
        checkpoint that cannot be sized: said, ``checkpoint_unsized``, and its read costs 0)."""
        try:
            self.gens.setdefault(gen, _Generation()).read += os.path.getsize(path)
        except OSError as exc:
            self.say("checkpoint_unsized", f"generation {gen} resumed from {path}, which cannot be sized "
                     f"({exc.strerror or exc}): its read costs 0 on the rank clock")

    def measure_disk(self, place: Path) -> None:
        """Learn the disk's bandwidth (given, cached, or measured once per machine) on a thread of its own: the
        supervisor's loop does not wait for it."""
        if self._disk_thread is None:
            def learn() -> None:
                self.disk = disk_mibs(place=place)

            self._disk_thread = threading.Thread(target=learn, name="wb-disk", daemon=True)
            self._disk_thread.start()

    def finish(self) -> None:
        """At the end of a run, what is charged at a speed: the bytes each rank sent in each step and the state
        a generation change moved at the network's bandwidth, each message at its latency, each resumed
        checkpoint at the disk's bandwidth."""
        if self.sent or any(g.received or g.hop for g in self.gens.values()):
            self.net, self.latency = net_mibs(), latency_us()
            per_s, latency = self.net[0] * 2**20, self.latency[0] * 1e-6
            for key, by_rank in self.sent.items():
                spent = self.spent.get(key, {})
                for spawn, (sent, messages) in by_rank.items():
                    spent[spawn] = spent.get(spawn, 0.0) + sent / per_s + messages * latency
                if key in self.rows:
                    self.rows[key]["rank_step_time"] = self.slowest(key)
            for g in self.gens.values():
                g.net = g.received / per_s
                g.wait += latency if g.hop else 0.0
        if any(g.read for g in self.gens.values()):
            if self._disk_thread is not None:
                self._disk_thread.join(timeout=DISK_WAIT_S)
            if self.disk is None:
                if self._disk_thread is not None:  # still measuring (a slow disk, a stuck write), or it failed
                    late = f"not learnt in {DISK_WAIT_S:g} s" if self._disk_thread.is_alive() else "not learnt"
                    self.say("disk_speed_late", f"the disk speed was {late} where the checkpoints are: it is "
                             "learnt again now, at the end of the run, in the temporary directory")
                self.disk = disk_mibs()
            for g in self.gens.values():
                g.io = g.read / (self.disk[0] * 2**20)

    def sources(self) -> dict[str, str]:
        """Where each speed charged in this run came from, by its summary field: ``$WORKBENCH_...`` (given),
        ``cached``, ``measured now``, or how it was measured instead (:func:`workbench.base.machine.latency_us`)."""
        speeds = {"disk_mibs": self.disk, "net_mibs": self.net, "latency_us": self.latency}
        return {name: speed[1] for name, speed in speeds.items() if speed is not None}

    def cost(self, gen: int) -> float | None:
        """Rank-time of generation ``gen``'s change (None where a member did not stamp its CPU time)."""
        g = self.gens.get(gen)
        return None if g is None or not g.measured else g.cost

    def settle_steps(self, rows: list[dict[str, Any]]) -> None:
        """Each row's final ``rank_step_time``: the slowest rank over a window of :data:`WINDOW` steps of one
        generation (the largest sum of one rank's CPU over the window), shared among the window's steps in
        proportion to their slowest rank. On shared cores a rank's stamp lands a little early or late, so that
        CPU of one step shows in its neighbour's; the slowest rank of each single step would count that jitter
        as time (measured: up to 1.4x the window figure at world 4 on 2 cores, 1.05x with a core per rank).
        Pipelines: times :attr:`bubble`."""
        for window in _windows(rows):
            per_rank: dict[int, float] = {}
            for row in window:
                for spawn, spent in self.spent.get((row["generation"], row["step"]), {}).items():
                    per_rank[spawn] = per_rank.get(spawn, 0.0) + spent
            peaks = [row.get("rank_step_time", float("nan")) for row in window]
            if not per_rank or any(p != p for p in peaks) or sum(peaks) <= 0:
                continue
            scale = max(per_rank.values()) * self.bubble / sum(peaks)
            for row, peak in zip(window, peaks):
                row["rank_step_time"] = peak * scale

    def timeline(self, rows: list[dict[str, Any]]) -> float:
        """Fill each row's ``rank_time`` (the rank clock at the end of that step, from the start of training) and
        return the run's rank-time of training: its steps (:meth:`settle_steps`; the wall step time where no rank
        stamped one) and the generation changes between them (their wall gap where unmeasured), said once
        (``rank_time_wall``) where any is."""
        self.settle_steps(rows)
        unstamped = sum(1 for row in rows if math.isnan(row.get("rank_step_time", math.nan)))
        unmeasured = sorted(g for g, gen in self.gens.items() if not gen.measured)
        if unstamped or unmeasured:
            self.say("rank_time_wall", f"no CPU stamp (a peer's ranks) for {unstamped} steps and the changes to "
                     f"generations {unmeasured or 'none'}: their wall time is counted on the rank clock")
        clock, previous = 0.0, None
        for row in rows:
            if previous is not None and row["generation"] != previous["generation"]:
                costs = [self.cost(g) for g in range(previous["generation"] + 1, row["generation"] + 1)
                         if g in self.gens]
                gap = row["time"] - row["step_time"] - previous["time"]
                clock += sum(costs) if None not in costs else max(gap, 0.0)
            spent = row.get("rank_step_time", float("nan"))
            clock += row["step_time"] if spent != spent else spent
            row["rank_time"] = clock
            previous = row
        return clock

    def failure(self, wall: dict[str, Any], record: Any, rows: list[dict[str, Any]]) -> dict[str, Any]:
        """A failure's time figures on the rank clock (``rank_detection_s`` ...) from its wall ones and the
        generations it called (``record``: the recorder's failure record). Detection is a wait by design (the same
        on both clocks); a recovery the workbench cannot see inside (a peer's own, a member that did not stamp its
        CPU time) keeps its wall figures."""
        out = {PREFIX + name: wall[name] for name in TIME_FIGURES}
        if record.teardown is not None and self.latency is not None:
            out[PREFIX + "detection_s"] = round(record.teardown + self.latency[0] * 1e-6, 4)
        recovery_gen, regrow_gen, replacement = record.recovery_gen, record.regrow_gen, record.replacement
        gen = self.gens.get(recovery_gen) if recovery_gen is not None else None
        if gen is None or not gen.measured or wall["settle_s"] is None:
            return out
        first = next((r for r in rows if r["generation"] >= recovery_gen), None)
        out.update(rank_settle_s=round(gen.cost, 4), rank_join_s=round(gen.join, 4))
        if wall["resume_s"] is not None and first is not None and first.get("rank_step_time") == first.get(
                "rank_step_time"):
            out["rank_resume_s"] = round(gen.cost + self.cost_between(recovery_gen, first["generation"])
                                         + first["rank_step_time"], 4)
        grown = self.gens.get(regrow_gen) if regrow_gen is not None else None
        if wall["regrow_s"] is not None and grown is not None and grown.measured and replacement in self.ready:
            ready_at, start = self.ready[replacement]
            start = start if ready_at >= record.fault_time else 0.0  # a warm spare was ready before the fault
            out["rank_regrow_s"] = round(gen.wait + start + grown.join, 4)
        return out

    def cost_between(self, after: int, upto: int) -> float:
        """Rank-time of the generation changes after ``after`` up to ``upto`` (unmeasured ones count 0)."""
        return sum(self.cost(g) or 0.0 for g in range(after + 1, upto + 1) if g in self.gens)
