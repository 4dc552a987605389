"""Slow ranks, the supervisor's side (a mixin of :class:`~workbench.supervisor.core.Supervisor`): a live or timed
slow-down is a ``throttle`` message to the rank; every member's step report feeds the straggler detector
(:mod:`.stragglers`), and its response is applied: flag the straggler, or drop it and recover as from a failed rank
(docs/permanent-faults.md, "Slow ranks and stragglers").
"""

from __future__ import annotations

import time
from typing import Any

from workbench.rank import protocol
from workbench.supervisor.stragglers import Straggler


class SlowRanks:
    """What the supervisor does with a slow-down and a straggler; its state (membership, launcher, control server,
    recorder, plan, detector) is the supervisor's."""

    membership: Any
    launcher: Any
    control: Any
    recorder: Any
    plan: Any
    stragglers: Any
    config: Any

    def _slow(self, label: int, factor: float, seconds: float | None) -> None:
        """Slow rank ``label`` down ``factor`` times from its next step (1: full speed again) for ``seconds`` (None:
        until changed); its step reports say so (``slow`` / ``slow_end`` events)."""
        w = self.worker(label)
        if w is None or (w.proc is None and w.conn is None) or label not in self.membership.members:
            self.recorder.event("fault_skipped", -1, f"slow of rank {label}: not alive", rank=label)
            return
        self.control.send(w, protocol.message("throttle", factor=factor, seconds=seconds))

    def _slow_planned(self, fault: Any) -> None:
        """A slow fault at a time (``time=T``): until its ``until``, in seconds too (None: to the end)."""
        self._slow(fault.rank, fault.factor, None if fault.until is None else fault.until - fault.time)

    # -- stragglers ----------------------------------------------------------------------------------------------
    def _straggler_step(self, w: Any, m: dict[str, Any]) -> None:
        """A member's step report: its step time to the detector (its CPU for the step, as the rank-time clock
        counts it), slow / slow_end / straggler events, the run's response."""
        if w.label is None:  # a peer's slot not yet named
            return
        spent = self.recorder.rank_time.spent.get((m["gen"], m["step"]), {}).get(w.spawn_id)
        events, flagged = self.stragglers.step(w.spawn_id, w.label, m["gen"], m["step"], spent, m.get("slow"),
                                               group=self.config.stage_of(w.label))  # a stage's replicas compared
        for kind, detail in events:
            self.recorder.event(kind, m["step"], detail, rank=w.label)
        if spent is not None and self.recorder.on_event:  # the lab's per-rank strip
            self.recorder.on_event("rank_step", {"step": m["step"], "generation": m["gen"], "rank": w.label,
                                                 "cpu_s": spent, "slow": m.get("slow") or 1.0})
        drop = self.config.straggler_response == "drop"
        for straggler in flagged:
            dropped = drop and self._drop(straggler)
            self.recorder.event("straggler", straggler.step, straggler.detail(self.stragglers.window)
                                + ("; dropped" if dropped else ""), rank=straggler.label)
            if dropped:
                self._on_death(self.launcher.workers[straggler.key],
                               f"was dropped as a straggler ({straggler.ratio:.2f}x the others' step time)")
                return  # one at a time: the others' figures change with the world

    def _drop(self, straggler: Straggler) -> bool:
        """Kill a straggler of a settled generation that has others to go on with (its slow-downs do not follow
        its rank number to a replacement); False where it may not be dropped now."""
        m, w = self.membership, self.launcher.workers.get(straggler.key)
        if w is None or not w.alive or w.done or m.restarting or m.members != m.generation_members \
                or len(m.members) < 2 or getattr(self, "boundary", None) is not None:  # not while a resize pauses
            return False
        self.plan.forget_slow(w.label)
        self.stragglers.forget(straggler.key)
        w.fault = {"kind": "straggler", "step": straggler.step, "t": time.time()}
        self.launcher.kill(w, self.control.send)
        return True
