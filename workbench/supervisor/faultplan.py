"""Fault plan: the planned faults of a run until they fire.

Step faults (``kill``/``hang``/``flip``/``slow`` at a step) and random failures travel with each generation to the rank
that is to fire them: the rank fires them itself at the step's fault point and says so (``fault``, ``flip``),
which crosses them off here — a fault fires once, whatever generation changes happen around it. Random failures
are drawn as (step, position among the live members): the position is resolved against each generation's
members. Time faults (``time=T`` seconds after the first step) are sent by the supervisor when due.
"""

from __future__ import annotations

from typing import Any

from workbench.config.run import RunConfig
from workbench.faults import kinds
from workbench.faults.kinds import Fires


class FaultPlan:
    def __init__(self, config: RunConfig, start: int = 0) -> None:
        """``start``: the step a resumed run starts at; the step faults planned before it happened (or not) in the
        run that wrote its checkpoint, not here (a slow-down may still be under way: it stays)."""
        self.time_faults = sorted(config.time_faults, key=lambda f: f.time)
        # kill, hang, flip, preempt, resize at a step, until they fire
        self.step_faults = [f for f in config.step_faults if f.step >= start or kinds.of(f).fires is Fires.THROTTLE]
        self.random = list(config.random_failures)  # (step, position among live ranks)

    def planned(self) -> int:
        """How many kills/hangs may still come (torchrun's agent needs a restart budget for them)."""
        return len(self.step_faults) + len(self.time_faults) + len(self.random)

    def for_member(self, label: int, members: list[int]) -> dict[str, Any]:
        """The part of a generation message that is ``label``'s pending faults."""
        random_here = [(step, members[pos % len(members)]) for step, pos in self.random]
        faults = [str(f) for f in self.step_faults if f.rank == label]
        faults += [f"kill:rank={label},step={step}" for step, r in random_here if r == label]
        return {"faults": faults, "random_steps": [step for step, r in random_here if r == label]}

    def fired(self, label: int | None, m: dict[str, Any]) -> list[Any]:
        """A rank announced a planned kill/hang/stall/preempt: crossed off; returns the faults that fired."""
        fired = [f for f in self.step_faults if (f.rank, f.step, f.kind) == (label, m["step"], m["kind"])]
        self.step_faults = [f for f in self.step_faults if f not in fired]
        self.random = [f for f in self.random if f[0] != m["step"] or not m.get("random")]
        return fired

    def unfired(self, steps_done: int) -> list[Any]:
        """The kills, hangs, stalls, notices and flips planned for a step the run got past that never fired: their
        rank was no member then, or the step was finished without it (said at the run's end, never silent)."""
        return [f for f in self.step_faults
                if f.step is not None and f.step < steps_done and kinds.of(f).fires in (Fires.RANK, Fires.INJECTOR)]

    def flipped(self, label: int | None, m: dict[str, Any]) -> bool:
        """A rank reported a flip (``flip``): a planned one at a step is crossed off; whether it was one."""
        before = len(self.step_faults)
        self.step_faults = [f for f in self.step_faults if not (
            kinds.of(f).fires is Fires.INJECTOR and f.rank == label and f.step == m["planned"]
            and f.target == m["target"])]
        return len(self.step_faults) < before

    def forget_slow(self, label: int) -> None:
        """Rank ``label``'s process was dropped as a straggler: its slow-downs do not follow the number to a
        replacement (the slow machine is gone)."""
        self.step_faults = [f for f in self.step_faults
                            if not (kinds.of(f).fires is Fires.THROTTLE and f.rank == label)]

    def resizes(self) -> list[Any]:
        """The planned boundaries that change the world (resize), until they happen."""
        return [f for f in self.step_faults if kinds.of(f).fires is Fires.BOUNDARY]

    def notices(self) -> list[Any]:
        """The planned notices (preempt), until they fire."""
        return [f for f in self.step_faults if kinds.of(f).notice]

    def due(self, since_first_step: float | None) -> list[Any]:
        """Time faults whose moment has come (none before the first step)."""
        if since_first_step is None:
            return []
        due = []
        while self.time_faults and since_first_step >= self.time_faults[0].time:
            due.append(self.time_faults.pop(0))
        return due
