"""Membership changes at a step boundary (a mixin of :class:`~workbench.supervisor.membership.Membership`): every
member has stopped before the same step holding the same state, so nothing is lost or redone. A resize grows the
world with new labels (forked now, admitted at the boundary) or lets the newest ranks leave; a preempted rank
leaves, and the strategy says what follows (docs/permanent-faults.md, "Preemption with notice")."""

from __future__ import annotations

from typing import Any

from workbench.strategies import Reaction
from workbench.supervisor.decisions import Lost, Note, Retire

BOUNDARY = "boundary"  # a generation's ``recovery`` after a change at a step boundary: no state to recover


class Departures:
    """Needs the Membership's ``procs``, ``members``, ``plan``, ``failures``, ``regrow``, ``stage_of`` and its
    helpers ``_new``, ``_generation``, ``_restart_world``, ``_fresh``, ``_end``."""

    growing: list[int]  # ids of the newcomers of a resize, admitted at its boundary
    labels: list[int]  # the rank numbers of the world after a resize (empty: 0..world_size-1)

    def grow(self: Any, n: int) -> list[Any]:
        """Start ``n`` new ranks (labels after every label used so far), admitted at the boundary."""
        first = 1 + max((p.label for p in self.procs.values() if p.label is not None), default=-1)
        starts = [self._new(label) for label in range(first, first + n)]
        self.growing += [s.id for s in starts]
        return [*starts, Note("resize", f"starting ranks {list(range(first, first + n))}: they join at the next "
                              "step boundary")]

    def growing_labels(self: Any) -> list[int]:
        """The labels of a resize's newcomers that are alive."""
        return [self.procs[id].label for id in self.growing if self.procs[id].alive]

    def growth_ready(self: Any) -> bool:
        return all(self.procs[id].ready for id in self.growing if self.procs[id].alive)

    def at_boundary(self: Any, leaving: dict[int, str], step: int, world: int | None = None) -> list[Any]:
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
        out: list[Any] = []
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
            out.append(Note("resize", f"world size {len(members)} from step {step}"
                            + (f": ranks {newcomers} joined" if newcomers else "")
                            + (f"; ranks {shrunk} left" if shrunk else "")))
        return out

    def _leaving_record(self: Any, label: int, cause: str, announced: list[int], after: int,
                        replacement: int | None = None) -> Any:
        return Lost(label, self._leaving_ids[label], cause, announced.index(label), len(announced), after,
                    replacement)

    def _stage_emptied(self: Any, preempted: list[int], stay: list[int]) -> tuple[int, int] | None:
        """(a preempted label, its stage) when it was the last replica of its pipeline stage (hybrid)."""
        if self.stage_of is None:
            return None
        for label in preempted:
            if not any(self.stage_of(s) == self.stage_of(label) for s in stay):
                return label, self.stage_of(label)
        return None

    def world_labels(self: Any) -> list[int]:
        """The rank numbers a restarted world starts: 0..world_size-1 until a resize changed them."""
        return list(self.labels) if self.labels else list(range(self.world_size))

    def growing_ids_alive(self: Any, labels: list[int]) -> list[int]:
        """The processes holding these newcomer labels."""
        return [p.id for p in self.procs.values() if p.alive and p.label in labels]
