"""The supervisor's commands and live faults (a mixin of :class:`~workbench.supervisor.core.Supervisor`): ``stop``,
``kill``/``hang``/``stall``/``slow``/``flip`` of a rank now or at a planned time, and the straggler detector's
response (:mod:`.stragglers`): flag the straggler, or drop it and recover as from a failed rank
(docs/permanent-faults.md).
"""

from __future__ import annotations

import queue
import time
from typing import Any

from workbench import protocol
from workbench.supervisor.stragglers import Straggler


class Commands:
    """What the supervisor does on a command from another thread, a due time fault or a straggler; its state (the
    command queue, membership, launcher, control server, recorder, plan, detector) is the supervisor's."""

    commands: queue.Queue[tuple[str, Any]]
    membership: Any
    launcher: Any
    control: Any
    recorder: Any
    plan: Any
    stragglers: Any
    config: Any
    _outcome: tuple[str, str] | None

    def _run_commands(self) -> None:
        while True:
            try:
                name, arg = self.commands.get_nowait()
            except queue.Empty:
                return
            if name == "stop":
                self._apply(self.membership.stop(str(arg or "stopped by the user")))
                self._outcome = self._outcome or ("stopped", str(arg or "stopped by the user"))
            elif name in ("kill", "hang", "stall"):
                self._inject(name, arg, source="live")
            elif name == "slow":  # (rank, factor, seconds)
                self._inject(name, arg[0], source="live", throttle=arg[1:])
            elif name == "flip":
                w = self.worker(arg.rank)
                if w is None or arg.rank not in self.membership.members:
                    self.recorder.event("fault_skipped", -1, f"flip on rank {arg.rank}: not alive", rank=arg.rank)
                else:
                    self.control.send(w, protocol.message("faults_add", faults=[str(arg)]))

    def _inject(self, kind: str, label: int, source: str, throttle: tuple[float, float | None] = (1.0, None)) -> None:
        w = self.worker(label)
        if w is None or (w.proc is None and w.conn is None) or label not in self.membership.members:
            self.recorder.event("fault_skipped", -1, f"{kind} of rank {label}: not alive", rank=label)
            return
        if kind == "stall":  # the rank blocks its own training thread at its next step and says so
            self.control.send(w, protocol.message("faults_add", faults=[f"stall:rank={label},step=-1"]))
            return
        if kind == "slow":  # the rank throttles itself from its next step; its step reports say so (a slow event)
            factor, seconds = throttle
            self.control.send(w, protocol.message("throttle", factor=factor, seconds=seconds))
            return
        w.fault = {"kind": kind, "step": w.steps_done, "t": time.time()}
        self.launcher.signal(w, "SIGKILL" if kind == "kill" else "SIGSTOP", self.control.send)
        self.recorder.event(kind, w.steps_done, f"{source} fault", rank=label)

    def _inject_planned(self, fault: Any) -> None:
        """A time fault whose moment has come (a slow one lasts until its ``until``, in seconds)."""
        seconds = None if fault.kind != "slow" or fault.until is None else fault.until - fault.time
        self._inject(fault.kind, fault.rank, source=f"planned ({fault})", throttle=(fault.factor or 1.0, seconds))

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
                or len(m.members) < 2:
            return False
        self.plan.forget_slow(w.label)
        self.stragglers.forget(straggler.key)
        w.fault = {"kind": "straggler", "step": straggler.step, "t": time.time()}
        self.launcher.kill(w, self.control.send)
        return True
