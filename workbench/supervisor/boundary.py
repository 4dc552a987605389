"""Live commands and step boundaries (a mixin of the :class:`~workbench.supervisor.core.Supervisor`).

Commands (kill, hang, stall, flip, stop, preempt, resize) come from any thread through a queue. A preemption
notice or a resize stops every member before one step (a planned one: the step its generation message names; a
live one: ``MARGIN_STEPS`` after the furthest step committed, in a ``pause`` message); once all have said
``paused`` (and a resize's newcomers are ready) the membership changes there. A preempted rank whose grace runs out
before that is killed, and recovered from as a failure. Details: docs/permanent-faults.md.
"""

from __future__ import annotations

import queue
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from workbench import strategies
from workbench.config import resize_rule
from workbench.config.resize_rule import units
from workbench.config.resizing import leaving
from workbench.faults import kinds
from workbench.faults.kinds import FaultKind, Fires
from workbench.faults.spec import DEFAULT_GRACE_S, FaultSpec
from workbench.rank import protocol
from workbench.results import checkpoint as ckpt

MARGIN_STEPS = 3  # a live boundary lies this many steps past the furthest step committed (ranks run in lockstep)
SETTLE_S = 2.0  # once a member paused, the others get this long; then the change happens with what they hold


@dataclass
class Boundary:
    """One step boundary under way: the change it makes and who has stopped there."""

    step: int
    world: int | None = None  # a resize's world size
    planned: FaultSpec | None = None  # the planned resize it carries out
    # label -> (monotonic deadline, grace, the step of the notice, the spawn id noticed)
    notices: dict[int, tuple[float, float, int, int]] = field(default_factory=dict)
    paused: dict[int, int] = field(default_factory=dict)  # spawn id -> the step it stopped before
    paused_at: dict[int, float] = field(default_factory=dict)  # spawn id -> when its pause came (monotonic)
    first_paused: float | None = None


class Commands:
    """The Supervisor's live commands and boundaries (``self`` is the Supervisor)."""

    boundary: Boundary | None = None
    keep_stopped: Any = None  # called with the checkpoint a whole job stopped at (workbench.sweeps.requeue)
    lanes: int | None = None  # a resized hybrid run's lanes per stage (None: the configuration's replicas)
    scale: resize_rule.Scale | None = None  # resize_rule linear: the resizes so far (every generation says them)

    def command(self: Any, name: str, arg: Any = None) -> None:
        """Queue a command (stop, kill, hang, stall, flip, preempt, resize) from any thread."""
        self.commands.put((name, arg))
        if self.control is not None:
            self.control.wake()

    def _run_commands(self: Any) -> None:
        while True:
            try:
                name, arg = self.commands.get_nowait()
            except queue.Empty:
                return
            if name == "stop":
                self._stop(str(arg or "stopped by the user"))
            elif name == "notice":  # the whole job has notice (a signal to the run's process, a sweep point's)
                self._job_notice(float(arg))
            else:  # a fault kind's live command: its object says where it fires (workbench/faults/kinds.py)
                self._live(kinds.get(name), arg)

    def _live(self: Any, kind: FaultKind, arg: Any) -> None:
        if kind.fires is Fires.THROTTLE:  # (rank, factor, seconds): workbench.supervisor.slow_ranks
            self._slow(*arg)
        elif kind.fires is Fires.BOUNDARY:
            self._resize(arg)
        elif kind.fires is Fires.INJECTOR:
            w = self.worker(arg.rank)
            if w is None or arg.rank not in self.membership.members:
                self.recorder.event("fault_skipped", -1, f"{kind.name} on rank {arg.rank}: not alive", rank=arg.rank)
            else:
                self.control.send(w, protocol.message("faults_add", faults=[str(arg)]))
        elif isinstance(arg, FaultSpec):  # a notice with its grace
            self._inject(kind.name, arg.rank, source="live", fault=arg)
        else:
            self._inject(kind.name, arg, source="live")

    def _fault_fired(self: Any, w: Any, m: dict[str, Any]) -> None:
        """A rank fired a planned fault of its own at its step and said so (``fault``)."""
        kind, fired = kinds.get(m["kind"]), self.plan.fired(w.label, m)
        if kind.notice:
            grace = next((f.grace for f in fired if f.grace is not None), DEFAULT_GRACE_S)
            self._notice(w, grace, m["step"], "planned", planned=True)
            return
        if kind.ends_rank:  # its death (if it dies) is this fault's; a delay goes on
            w.fault = m
        self.recorder.event(kind.name, m["step"], "planned fault fired", rank=w.label)

    def _stop(self: Any, reason: str) -> None:
        self._apply(self.membership.stop(reason))
        self._outcome = self._outcome or ("stopped", reason)

    def _job_notice(self: Any, grace: float) -> None:
        """Every member has ``grace`` seconds: the run stops at one boundary, which writes a checkpoint (a run that
        is not training yet, or a peer's, which has no notice path, stops at once)."""
        members = list(self.membership.members) if self.membership.started else []
        if not members or self.peer is not None:
            why = "before training started" if not members else f"({self.strategy.name} has no notice path)"
            self._stop(f"the job was preempted {why}")
            return
        for label in members:
            self._inject("preempt", label, source="job", fault=FaultSpec("preempt", label, time=0.0, grace=grace))

    def _inject(self: Any, name: str, label: int | None, source: str, fault: FaultSpec | None = None) -> None:
        """A fault sent by the supervisor (live, or planned at a time); its kind's object says how."""
        kind = kinds.get(name)
        if kind.fires is Fires.BOUNDARY:
            self._resize(fault.world, planned=fault)
            return
        if kind.fires is Fires.THROTTLE:  # a slow fault at a time: workbench.supervisor.slow_ranks
            self._slow_planned(fault)
            return
        w = self.worker(label)
        if w is None or (w.proc is None and w.conn is None) or label not in self.membership.members:
            self.recorder.event("fault_skipped", -1, f"{name} of rank {label}: not alive", rank=label)
            return
        if kind.notice:
            grace = fault.grace if fault is not None and fault.grace is not None else DEFAULT_GRACE_S
            self._notice(w, grace, w.steps_done, source)
            return
        if kind.signal is None:  # the rank fires it itself at its next step and says so (stall, delay, a flip)
            sent = FaultSpec(name, label, step=-1) if fault is None else replace(fault, step=-1, time=None)
            self.control.send(w, protocol.message("faults_add", faults=[str(sent)]))
            return
        w.fault = {"kind": name, "step": w.steps_done, "t": time.time()}
        self.launcher.signal(w, kind.signal, self.control.send)
        self.recorder.event(name, w.steps_done, f"{source} fault", rank=label)

    # -- boundaries --------------------------------------------------------------------------------------------
    def planned_pause(self: Any, members: list[int]) -> dict[str, Any] | None:
        """The boundary a generation of ``members`` stops at (``pause`` of its message): the one under way, else the
        next planned one (a resize's step, or the step after a member's planned notice, with a checkpoint as
        :meth:`_saves` says) that lies inside the run."""
        b = self.boundary
        if b is not None:
            return {"step": b.step, "checkpoint": self._saves()}
        resizes = [f.step for f in self.plan.resizes()]
        notices = [f.step + 1 for f in self.plan.notices() if f.rank in members]
        steps = [s for s in resizes + notices if self.recorder.committed <= s < self.config.steps]
        if not steps:
            return None
        step = min(steps)
        return {"step": step, "checkpoint": step in notices}

    def _arm(self: Any, step: int | None) -> Boundary | None:
        """The boundary under way, or a new one at ``step`` (None: a live one, ``MARGIN_STEPS`` ahead); None when
        the run ends before that step (said in an event)."""
        if self.boundary is None:
            if step is None:
                step = max((w.steps_done for w in self.member_workers if w is not None), default=0) + MARGIN_STEPS
            if step >= self.config.steps:
                self.recorder.event("boundary_skipped", -1, f"a step boundary at step {step}: the run ends first")
                return None
            self.boundary = Boundary(step)
        return self.boundary

    def _tell_members(self: Any) -> None:
        """Every member is told the boundary (again: a notice may have added a checkpoint to it)."""
        b = self.boundary
        pause = protocol.message("pause", gen=self.membership.gen, step=b.step, checkpoint=self._saves())
        for w in self.member_workers:
            if w is not None:
                self.control.send(w, pause)

    def _saves(self: Any) -> bool:
        """A preemption's boundary writes a checkpoint: checkpoint_restart restarts from it, and a run whose every
        rank is preempted (the whole job) ends there, to be resumed from it."""
        return self.boundary is not None and bool(self.boundary.notices) and self.peer is None

    def _notice(self: Any, w: Any, grace: float, step: int, source: str, planned: bool = False) -> None:
        """``w`` has ``grace`` seconds to leave: at the planned boundary, or at a live one."""
        if w.label not in self.membership.members or w.done:  # a spare, a newcomer, a rank that finished
            self.recorder.event("fault_skipped", step, f"{source} notice to a rank that is no member", rank=-1)
            return
        w.fault = {"kind": "preempt", "step": step, "t": time.time()}
        self.recorder.event("preempt", step, f"{source} notice: {grace:g} s to leave at a step boundary",
                            rank=w.label)
        b = self._arm(step + 1 if planned else None)
        if b is None:
            return  # the run ends before the boundary: nothing to leave
        b.notices[w.label] = (time.monotonic() + grace, grace, step, w.spawn_id)
        self._tell_members()

    def _resize(self: Any, world: int, planned: FaultSpec | None = None) -> None:
        members = self.membership.members
        now = self.boundary.world if self.boundary is not None and self.boundary.world is not None else len(members)
        if world == now and planned is None:
            self.recorder.event("resize", -1, f"the world has {world} ranks already")
            return
        at = planned.step if planned is not None else None  # a planned one at a step: its generation says so
        b = self._arm(at)
        if b is None:
            return
        b.world, b.planned = world, planned
        growing = len(self.membership.growing_labels())
        if world > len(members) + growing:
            self._apply(self.membership.grow(world - len(members) - growing))
        if at is None:
            self._tell_members()
        rule = "" if self.scale is None else "; " + self.scale.resized(b.step, units(self.config, world)).describe(
            b.step)
        self.recorder.event("resize", b.step, f"{len(members)} -> {world} ranks at step {b.step}{rule}")

    def _on_paused(self: Any, w: Any, m: dict[str, Any]) -> None:
        b = self.boundary
        if b is not None and m["gen"] == self.membership.gen:
            b.paused[w.spawn_id] = m["step"]
            b.paused_at[w.spawn_id] = time.monotonic()
            b.first_paused = b.first_paused or b.paused_at[w.spawn_id]

    def _boundaries(self: Any, now: float) -> None:
        """A preempted rank out of grace is killed (a failure); a boundary where all stopped is carried out."""
        b = self.boundary
        if b is None or self.membership.restarting:
            return
        for label, (deadline, grace, step, spawn) in list(b.notices.items()):
            w = self.worker(label)
            if w is None or w.spawn_id != spawn or not w.alive or w.done:
                del b.notices[label]  # it died, or finished, meanwhile: nothing to leave
                continue
            # it left in time only if its pause came before the deadline (a loaded loop may read both late)
            in_time = w.spawn_id in b.paused and b.paused_at.get(w.spawn_id, now) <= deadline
            if now > deadline and not in_time:
                del b.notices[label]
                b.paused.clear()  # the failure's generation comes first; the boundary, if it has more, stays
                b.paused_at.clear()
                b.first_paused = None
                if not b.notices and b.world is None:
                    self.boundary = None
                self.launcher.kill(w, self.control.send)
                self.recorder.event("preempt_fallback", step, f"the grace of {grace:g} s ran out before the step "
                                    f"boundary (step {b.step}): recovered as a failure", rank=label)
                self._on_death(w, f"was preempted: its {grace:g} s of notice ran out before the step boundary")
                return
        if self._carry_out(b, now):
            self._after_boundary()

    def _carry_out(self: Any, b: Boundary, now: float) -> bool:
        """The membership change once every member stopped (or the others had ``SETTLE_S``, the boundary's
        checkpoint written) and a resize's newcomers are ready."""
        members = [w for w in self.member_workers if w is not None]
        stopped = all(w.spawn_id in b.paused for w in members)
        written = not self._saves() or Path(self.membership.resume or "").name == ckpt.checkpoint_name(b.step)
        late = b.first_paused is not None and now - b.first_paused > SETTLE_S and written
        if not (stopped or late) or not self.membership.growth_ready():
            return False
        self.boundary = None
        unstaged = self._unstaged(b)
        if unstaged is not None:  # a stage's only copy: it cannot leave cleanly, it fails as it is taken
            w = self.worker(unstaged)
            self.launcher.kill(w, self.control.send)
            self._on_death(w, "was preempted, the only copy of its pipeline stage: recovered as a failure")
            return False
        causes = {label: f"was preempted (notice at step {step}, {grace:g} s of grace): left at step {b.step}"
                  for label, (_, grace, step, _) in b.notices.items()}
        if b.world is not None:
            staying = [m for m in self.membership.members if m not in causes] + self.membership.growing_labels()
            causes.update({label: "" for label in leaving(self.config, staying, b.world)})
        if b.planned is not None and b.planned in self.plan.step_faults:
            self.plan.step_faults.remove(b.planned)
        for label in causes:
            if (w := self.worker(label)) is not None:
                self.control.send(w, protocol.message("stop", reason=f"left the run at step {b.step}"))
        if b.world is not None and self.config.parallelism == "hybrid":
            self.lanes = b.world // self.config.pipeline_stages  # every generation message says so from here on
        if b.world is not None and self.scale is not None:  # from the step the members stopped before (a live
            at = max([b.step, *b.paused.values()])  # boundary may lie behind them when its message reached them)
            self.scale = self.recorder.scale = self.scale.resized(at, units(self.config, b.world))
        self._apply(self.membership.at_boundary(causes, b.step, world=b.world))
        return True

    def _unstaged(self: Any, b: Boundary) -> int | None:
        """A preempted rank that holds the only copy of its pipeline stage, where the strategy does not restart the
        world from the boundary's checkpoint (reinit: its replacement would find no copy to take)."""
        if self.config.parallelism not in ("pipeline", "hybrid") or self.strategy.recovering(
                self.membership.failures).reaction is strategies.Reaction.RESTART:
            return None
        stay = [m for m in self.membership.members if m not in b.notices]
        for label in b.notices:
            if not any(self.config.stage_of(m) == self.config.stage_of(label) for m in stay):
                return label
        return None

    def _after_boundary(self: Any) -> None:
        """The whole job stopped at its checkpoint: kept where the caller asked (a sweep point's next attempt),
        or said to go with a temporary directory."""
        if not self._outcome or self._outcome[0] != "stopped" or not self.membership.resume:
            return
        if self.keep_stopped is not None:
            self.keep_stopped(self.membership.resume)
        elif self.out_dir is None:
            self._outcome = ("stopped", self._outcome[1].split("; resume from")[0] + " (its checkpoint was in a "
                             "temporary directory: give the run an out directory to keep one)")
