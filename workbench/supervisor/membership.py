"""Membership: who is in the run, and what each recovery strategy does when that changes — a pure state machine,
no sockets, no processes, no clocks.

Events in: ``start()``, ``ready(id)``, ``died(id, cause)``, ``checkpoint(path)``, ``stop()``. Decisions out, in the
order they are carried out: :class:`Start`, :class:`Retire`, :class:`Restart` (carried out by ``restart()``, after the
retired ranks' last reports), :class:`Lost`, :class:`Generation`, :class:`Note`, :class:`End`. Processes have spawn
ids; ranks have stable labels, which a replacement inherits. A process that dies before it is a member is started anew,
at most ``max_starts`` times in a row per label. A death is met with the :class:`~workbench.strategies.Reaction` of the
strategy that recovers it; at a step boundary (a resize, a preemption: ``at_boundary``) nothing is lost or redone
(docs/internals.md, docs/permanent-faults.md)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from workbench import strategies
from workbench.strategies import Reaction, Strategy
from workbench.supervisor.decisions import Assign, Decision, End, Generation, Lost, Note, Restart, Retire, Start

__all__ = ["Assign", "Decision", "End", "Generation", "Lost", "Membership", "Note", "Proc", "Restart", "Retire",
           "Start"]

BOUNDARY = "boundary"  # a generation's ``recovery`` after a change at a step boundary: no state to recover




@dataclass
class Proc:
    id: int
    label: int | None
    ready: bool = False
    alive: bool = True
    slot: bool = False


@dataclass
class Membership:
    """The membership of one run. ``stage_of(label)`` (hybrid parallelism): the pipeline stage a label holds;
    ``verify(path)``: why a checkpoint cannot be resumed from (None: it can; a restart takes the newest that can)."""

    strategy: str | Strategy
    world_size: int
    regrow: bool = False
    warm_spares: int = 0
    resume: str | None = None
    stage_of: Callable[[int], int] | None = None
    verify: Callable[[str], str | None] | None = None
    max_starts: int = 5
    gen: int = -1
    members: list[int] = field(default_factory=list)
    generation_members: list[int] = field(default_factory=list)  # as announced (reinit/torchft then wait smaller)
    procs: dict[int, Proc] = field(default_factory=dict)
    pending: list[int] = field(default_factory=list)  # ids of replacements (or a restarted world) not yet admitted
    restarting: bool = False  # checkpoint_restart / torchrun: a fresh world is starting
    failures: int = 0  # members lost so far
    recovery: Strategy | None = None  # the strategy recovering the last failure
    ended: End | None = None
    checkpoints: list[str] = field(default_factory=list)  # where a restart may resume, oldest first
    _starts: dict[int, int] = field(default_factory=dict)  # label -> consecutive starts that failed

    def __post_init__(self) -> None:
        self.growing: list[int] = []  # ids of the newcomers of a resize, admitted at its boundary
        self.labels: list[int] = []  # the rank numbers of the world after a resize (empty: 0..world_size-1)
        self._leaving_ids: dict[int, int] = {}  # at a boundary: label -> id of each process that leaves
        self.plan = strategies.get(self.strategy) if isinstance(self.strategy, str) else self.strategy
        self.strategy = self.plan.name
        if self.resume is not None:
            self.checkpoints.append(self.resume)

    # -- views ----------------------------------------------------------------------------------------------------
    def holder(self, label: int) -> Proc | None:
        """The live process holding ``label``."""
        for proc in self.procs.values():
            if proc.label == label and proc.alive:
                return proc
        return None

    @property
    def started(self) -> bool:
        return self.gen >= 0

    # -- events ---------------------------------------------------------------------------------------------------
    def start(self) -> list[Decision]:
        slots = self.plan.peer is not None and self.plan.peer.agent
        out: list[Decision] = [self._new(label, slot=slots) for label in range(self.world_size)]
        out += [self._new(None) for _ in range(self.warm_spares)]
        return out

    def ready(self, id: int) -> list[Decision]:
        proc = self.procs.get(id)
        if proc is None or not proc.alive or proc.ready or self.ended:
            return []
        proc.ready = True
        self._starts.pop(-1 if proc.label is None else proc.label, None)
        if not self.started:
            if all(p.ready for p in self.procs.values() if p.alive):
                return self._generation(list(range(self.world_size)), source=0, resume=self.resume)
            return []
        return self._admit()

    def died(self, id: int, cause: str, step: int | None = None) -> list[Decision]:
        """``id``'s process is gone; ``step``: where the rank was (named in a reason that ends the run)."""
        proc = self.procs.get(id)
        if proc is None or not proc.alive or self.ended:
            return []
        proc.alive = False
        if not self.started:
            who = f"rank {proc.label}" if proc.label is not None else "a warm spare"
            return self._end("failed", f"{who} {cause} during start-up")
        if id in self.pending:
            self.pending.remove(id)
            if self._agent_restarts() and self.restarting:
                return [Note("restart", f"a restarted torchrun worker (rank {proc.label}) {cause}; the agent "
                             "restarts the world again", fields={"world": self.world_size, "resume": None}),
                        *self._restart_agent_world()]
            return self._start_again(proc, cause)
        if proc.label is None or proc.label not in self.members or self.restarting:
            out: list[Decision] = [Note("spare_lost", f"a starting or spare rank {cause}",
                                        fields={"cause": cause, "refilled": False})]
            if proc.label is None and self._wants_spares():
                out = self._start_again(proc, cause)  # keep the pool full, bounded like a replacement
            return out
        out = self._member_lost(proc, cause, "" if step is None else f" at step {step}")
        return out if self.ended else out + self._admit()  # a spare taken for reinit/torchft may be ready now

    def checkpoint(self, path: str) -> None:
        self.resume = path
        self.checkpoints.append(path)

    def stop(self, reason: str) -> list[Decision]:
        return self._end("stopped", reason)

    # -- a member failed --------------------------------------------------------------------------------------------
    def _member_lost(self, proc: Proc, cause: str, where: str) -> list[Decision]:
        label = proc.label
        assert label is not None
        announced = self.generation_members if label in self.generation_members else self.members
        position, size = announced.index(label), len(announced)
        survivors = [m for m in self.members if m != label]
        recovering = self.recovery = self.plan.recovering(self.failures)
        self.failures += 1
        reaction = recovering.reaction

        def lost(after: int, replacement: int | None = None) -> Lost:
            return Lost(label, proc.id, cause, position, size, after, replacement)

        if reaction is Reaction.END or (not survivors and recovering.needs_survivors):
            why = f"strategy {recovering.name!r} does not recover" if reaction is Reaction.END else "no rank survived"
            return [lost(len(survivors)), *self._end("failed", f"rank {label} {cause}{where}; {why}")]
        if self.stage_of is not None and reaction is Reaction.REGROUP:
            stage = self.stage_of(label)
            if not any(self.stage_of(s) == stage for s in survivors):
                return [lost(len(survivors)), *self._end(
                    "failed", f"rank {label} {cause}{where}, the last replica of pipeline stage {stage}; "
                    f"{recovering.name} cannot rebuild a stage's layers (checkpoint_restart or reinit can)")]
        if reaction is Reaction.PEER:
            return self._peer_lost(recovering, label, survivors, lost)
        if reaction is Reaction.RESTART:
            return [lost(self.world_size), *self._restart_world()]
        if reaction is Reaction.REPLACE:
            self.members = survivors  # the replacement is admitted with everyone, in _admit
            start = self._replace(label)
            return [lost(self.world_size, start[0].id), *start]
        # REGROUP: the survivors go on now
        spare = self._take_spare(label) if self.regrow else []
        members = sorted(survivors + ([label] if spare else []))
        out: list[Decision] = [lost(len(members), spare[0].id if spare else None), *spare]
        out += self._generation(members, recovery=recovering.name)
        if self.regrow and not spare:
            start = self._fresh(label)
            out[0] = lost(len(members), start.id)
            out.append(start)
        return out

    def _peer_lost(self, recovering: Strategy, label: int, survivors: list[int],
                   lost: Callable[..., Lost]) -> list[Decision]:
        """The peer runtime reacts by its own means; membership follows what it does."""
        peer = recovering.peer
        assert peer is not None
        if peer.restarts_world:
            return [lost(self.world_size), Note("restart", f"{recovering.name} restarts the world",
                                                fields={"world": self.world_size, "resume": None}),
                    *self._restart_agent_world()]
        self.members = survivors
        if peer.replaces:  # the replicas find out by themselves; recovery is a restart + heal
            start = self._replace(label)
            return [lost(len(survivors), start[0].id), *start]
        # the survivors' MPI layer shrinks the communicator itself
        return [lost(len(survivors)), Note("shrinking", f"the {len(survivors)} survivors revoke, shrink and go on",
                                           fields={"survivors": len(survivors)})]

    def _restart_world(self) -> list[Decision]:
        """checkpoint_restart: every member retires; once their last reports are in, a fresh world starts
        (:meth:`restart`; it is admitted when all are ready)."""
        retired = tuple(p.id for p in (self.holder(m) for m in self.members) if p is not None)
        for id in retired:
            self.procs[id].alive = False
        self.restarting = True
        return [Retire(retired), Restart()]

    def restart(self) -> list[Decision]:
        """Carrying out :class:`Restart`: the newest checkpoint that verifies is where the fresh world resumes."""
        skipped = self._choose_resume()
        starts = [self._new(label) for label in self.world_labels()]
        self.pending = [s.id for s in starts]
        where = f"checkpoint {self.resume}" if self.resume else "step 0"
        return [*skipped, *starts, Note("restart", f"world stopped; {self.world_size} fresh ranks resume from {where}",
                                        fields={"world": self.world_size, "resume": self.resume})]

    def _choose_resume(self) -> list[Decision]:
        """The newest checkpoint that verifies becomes ``resume``; a Note for each one skipped (and forgotten)."""
        notes: list[Decision] = []
        while self.checkpoints:
            path = self.checkpoints[-1]
            why = self.verify(path) if self.verify is not None else None
            if why is None:
                self.resume = path
                return notes
            self.checkpoints.pop()
            older = f"checkpoint {self.checkpoints[-1]}" if self.checkpoints else "no older checkpoint"
            notes.append(Note("checkpoint_skipped", f"checkpoint {path} cannot be resumed from ({why}); trying "
                              f"{older}", fields={"path": path, "reason": why}))
        self.resume = None
        return notes

    def _agent_restarts(self) -> bool:
        return self.plan.peer is not None and self.plan.peer.restarts_world

    def _restart_agent_world(self) -> list[Decision]:
        """Every current worker and slot retires (the agent stops them); fresh slots wait for the next workers."""
        retired = tuple(p.id for p in self.procs.values()
                        if p.alive and p.label is not None and (p.label in self.members or p.id in self.pending))
        for id in retired:
            self.procs[id].alive = False
        self.restarting = True
        starts = [self._new(label, slot=True) for label in range(self.world_size)]
        self.pending = [s.id for s in starts]
        return [Retire(retired, kill=False), *starts]

    # -- replacements ---------------------------------------------------------------------------------------------
    def _replace(self, label: int) -> list[Decision]:
        """A spare (if one is ready) or a fresh process for ``label``; the first decision names the process."""
        taken = self._take_spare(label)
        if taken:
            self.pending.append(taken[0].id)
            return taken
        start = self._fresh(label)
        return [start, Note("respawn", f"starting a fresh process for rank {label}", rank=label,
                            fields={"cause": None})]

    def _fresh(self, label: int) -> Start:
        start = self._new(label)
        self.pending.append(start.id)
        return start

    def _take_spare(self, label: int) -> list[Decision]:
        """[Assign the spare to ``label``, the Start of its successor in the pool, a Note] or []."""
        for proc in self.procs.values():
            if proc.label is None and proc.alive and proc.ready:
                proc.label = label
                return [Assign(proc.id, label), self._new(None),
                        Note("spare", f"a warm spare takes the place of rank {label}", rank=label,
                             fields={"spawn_id": proc.id})]
        return []

    def _start_again(self, proc: Proc, cause: str) -> list[Decision]:
        """A replacement died before it was admitted: start another for its label (bounded)."""
        label = proc.label
        failures = self._starts.get(-1 if label is None else label, 0) + 1
        self._starts[-1 if label is None else label] = failures
        if label is None:
            if failures >= self.max_starts:
                return [Note("spare_lost", f"a warm spare {cause}; {failures} in a row failed to start: the pool "
                             "is not refilled", fields={"cause": cause, "refilled": False})]
            return [Note("spare_lost", f"a starting or spare rank {cause}", fields={"cause": cause, "refilled": True}),
                    self._new(None)]
        self._starts[label] = failures
        if failures >= self.max_starts:
            return self._end("failed", f"rank {label}'s replacement failed to start {failures} times in a row "
                             f"(last: {cause})")
        start = self._new(label, slot=proc.slot)
        self.pending.append(start.id)
        return [Note("respawn", f"rank {label}'s replacement {cause}; starting another", rank=label,
                     fields={"cause": cause}), start]

    def _admit(self) -> list[Decision]:
        """Bring ready replacements into the next generation (regrow, reinit, torchft, a restarted world)."""
        ready = [id for id in self.pending if self.procs[id].ready]
        if not ready:
            return []
        if self.restarting:
            if len(ready) < len(self.pending):
                return []
            self.pending.clear()
            self.restarting = False
            recovery = self.recovery.name if self.recovery is not None else self.strategy
            # a write the retired world finished since the restart began counts (verified like the others)
            skipped = self._choose_resume() if self.checkpoints[-1:] != [self.resume] else []
            return [*skipped, *self._generation(self.world_labels(), source=0, resume=self.resume,
                                                recovery=recovery)]
        if self.recovery is not None and self.recovery.reaction is Reaction.REPLACE:
            if len(ready) < len(self.pending):
                return []  # everyone restarts together
            self.pending.clear()
            members = sorted(self.members + [self.procs[id].label for id in ready])
            return self._generation(members, source=members.index(min(self.members)), recovery=self.recovery.name)
        for id in ready:
            self.pending.remove(id)
        labels = [self.procs[id].label for id in ready]
        members = sorted(self.members + labels)
        return [*self._generation(members), Note("regrow", f"ranks {labels} rejoined: world size {len(members)}",
                                                 fields={"ranks": labels})]

    # -- a step boundary (a resize, a preemption) -------------------------------------------------------------------
    def grow(self, n: int) -> list[Decision]:
        """Start ``n`` new ranks (labels after every label used so far), admitted at the boundary."""
        first = 1 + max((p.label for p in self.procs.values() if p.label is not None), default=-1)
        starts = [self._new(label) for label in range(first, first + n)]
        self.growing += [s.id for s in starts]
        labels = list(range(first, first + n))
        return [*starts, Note("newcomers", f"starting ranks {labels}: they join at the next step boundary",
                              fields={"ranks": labels})]

    def growing_labels(self) -> list[int]:
        """The labels of a resize's newcomers that are alive."""
        return [self.procs[id].label for id in self.growing if self.procs[id].alive]

    def growth_ready(self) -> bool:
        return all(self.procs[id].ready for id in self.growing if self.procs[id].alive)

    def at_boundary(self, leaving: dict[int, str], step: int, world: int | None = None) -> list[Decision]:
        """Every member stopped before ``step``. ``leaving``: label -> cause ("" for a rank a shrink retires,
        else why it leaves: a preemption); ``world``: a resize's size, what a restart of the world starts from then
        on. Returns the decisions: retirements, the preempted ranks' records, then the next generation (or a
        restart of the world from the boundary's checkpoint, or the end)."""
        announced = list(self.members)
        self._leaving_ids = {label: self.holder(label).id for label in leaving if self.holder(label) is not None}
        preempted = [label for label, cause in leaving.items() if cause and label in announced]
        stay = [m for m in announced if m not in leaving]
        newcomers = [label for label in self.growing_labels() if label not in leaving]
        self.growing = []
        if world is not None:  # the world a restart brings back from now on: the preempted ranks' numbers in it
            self.labels = sorted([m for m in announced if leaving.get(m) != ""] + newcomers)
            self.world_size = len(self.labels)
        out: list[Decision] = []
        if preempted and not stay and not newcomers:  # the whole job is preempted: it ends at its checkpoint
            where = f"; resume from {self.resume}" if self.resume else ""
            return [self._leaving_record(label, leaving[label], announced, 0) for label in preempted] + \
                self._end("stopped", f"every rank was preempted: stopped at step {step}{where}")
        recovering = self.plan.recovering(self.failures) if preempted else None
        reaction = recovering.reaction if recovering is not None else Reaction.REGROUP
        if reaction is Reaction.RESTART:  # the world restarts from the boundary's checkpoint: nothing redone
            idle = tuple(id for id in self.growing_ids_alive(newcomers))
            for id in idle:
                self.procs[id].alive = False
            out += [Retire(idle)] if idle else []
            out += [self._leaving_record(label, leaving[label], announced, self.world_size) for label in preempted]
            self.failures += len(preempted)
            self.recovery = recovering  # the restarted world says so when it joins
            return out + self._restart_world()
        gone = [self.procs[id] for id in self._leaving_ids.values()]
        for proc in gone:
            proc.alive = False
        out.append(Retire(tuple(p.id for p in gone)))
        if reaction is Reaction.END or not stay:
            why = f"strategy {recovering.name!r} does not recover" if reaction is Reaction.END else "no rank stays"
            return out + [self._leaving_record(label, leaving[label], announced, len(stay)) for label in preempted] \
                + self._end("failed", f"rank {preempted[0]} {leaving[preempted[0]]}; {why}")
        lost_stage = self._stage_emptied(preempted, stay)
        if lost_stage is not None:
            return out + self._end("failed", f"rank {lost_stage[0]} {leaving[lost_stage[0]]}, the last replica of "
                                   f"pipeline stage {lost_stage[1]}: a stage's layers cannot be rebuilt without them")
        replace = reaction is Reaction.REPLACE or self.regrow
        self.recovery = None  # a replacement is admitted as a regrow: the members' state, nothing restored
        members = sorted(stay + newcomers)
        for label in preempted:
            spare = self._take_spare(label) if replace else []  # a ready warm spare takes the label at once
            start = self._fresh(label) if replace and not spare else None  # admitted when ready (a regrow)
            members += [label] if spare else []
            replacement = spare[0].id if spare else start.id if start else None
            out += [self._leaving_record(label, leaving[label], announced, len(members) + (start is not None),
                                         replacement), *spare, *([start] if start else [])]
        members.sort()
        self.failures += len(preempted)
        out += self._generation(members, recovery=BOUNDARY)  # the most advanced member: all hold its state
        shrunk = [label for label, cause in leaving.items() if not cause]
        if newcomers or shrunk:
            out.append(Note("resized", f"world size {len(members)} from step {step}"
                            + (f": ranks {newcomers} joined" if newcomers else "")
                            + (f"; ranks {shrunk} left" if shrunk else ""),
                            fields={"world": len(members), "joined": list(newcomers), "left": shrunk}))
        return out

    def _leaving_record(self, label: int, cause: str, announced: list[int], after: int,
                        replacement: int | None = None) -> Lost:
        return Lost(label, self._leaving_ids[label], cause, announced.index(label), len(announced), after,
                    replacement)

    def _stage_emptied(self, preempted: list[int], stay: list[int]) -> tuple[int, int] | None:
        """(a preempted label, its stage) when it was the last replica of its pipeline stage (hybrid)."""
        if self.stage_of is None:
            return None
        for label in preempted:
            if not any(self.stage_of(s) == self.stage_of(label) for s in stay):
                return label, self.stage_of(label)
        return None

    def world_labels(self) -> list[int]:
        """The rank numbers a restarted world starts: 0..world_size-1 until a resize changed them."""
        return list(self.labels) if self.labels else list(range(self.world_size))

    def growing_ids_alive(self, labels: list[int]) -> list[int]:
        """The processes holding these newcomer labels."""
        return [p.id for p in self.procs.values() if p.alive and p.label in labels]

    # -- helpers ----------------------------------------------------------------------------------------------------
    def _new(self, label: int | None, slot: bool = False) -> Start:
        id = len(self.procs)
        self.procs[id] = Proc(id, label, slot=slot)
        return Start(id, label, slot)

    def _wants_spares(self) -> bool:
        return self.warm_spares > 0 and sum(1 for p in self.procs.values() if p.label is None and p.alive) < \
            self.warm_spares

    def _generation(self, members: list[int], source: int | None = None, resume: str | None = None,
                    recovery: str | None = None) -> list[Decision]:
        self.gen += 1
        self.members = list(members)
        self.generation_members = list(members)
        holders = []
        for label in members:
            proc = self.holder(label)
            assert proc is not None, f"label {label} has no live process"
            holders.append(proc.id)
        return [Generation(self.gen, tuple(members), tuple(holders), source, resume, recovery)]

    def _end(self, outcome: str, reason: str) -> list[Decision]:
        if self.ended is None:
            self.ended = End(outcome, reason)
            return [self.ended]
        return []
