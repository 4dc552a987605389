"""A step boundary under way (:class:`Boundary`), the state the :class:`~workbench.supervisor.core.Supervisor`
keeps for one: a preemption notice or a resize stops every member before one step (a planned one: the step its
generation message names; a live one: ``MARGIN_STEPS`` after the furthest step committed, in a ``pause`` message);
once all have said ``paused`` (and a resize's newcomers are ready) the membership changes there. A preempted rank
whose grace runs out before that is killed, and recovered from as a failure. Details: docs/permanent-faults.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from workbench.faults.spec import FaultSpec

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

    def pause(self, spawn_id: int, step: int, now: float) -> None:
        """Member ``spawn_id`` said it stopped before ``step`` (at ``now``, monotonic)."""
        self.paused[spawn_id] = step
        self.paused_at[spawn_id] = now
        self.first_paused = self.first_paused or now

    def paused_in_time(self, spawn_id: int, deadline: float, now: float) -> bool:
        """Whether member ``spawn_id`` paused by ``deadline`` (a loaded loop may read its pause and the deadline
        late: the time its pause came counts)."""
        return spawn_id in self.paused and self.paused_at.get(spawn_id, now) <= deadline

    def void_pauses(self) -> None:
        """A failure's generation comes first: the pauses so far count no more (the boundary, if it has more to
        do, stays, and the new generation stops at it again)."""
        self.paused.clear()
        self.paused_at.clear()
        self.first_paused = None
