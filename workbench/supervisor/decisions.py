"""The decisions :class:`~workbench.supervisor.membership.Membership` hands the supervisor, in the order they are
carried out: start, assign, retire, restart, lost, generation, note, end."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Start:
    """Start a process for ``label`` (None: a warm spare). ``slot``: no process of ours, a slot that waits for
    one started elsewhere (torchrun's workers)."""

    id: int
    label: int | None
    slot: bool = False


@dataclass(frozen=True)
class Assign:
    """The ready warm spare ``id`` takes the place of rank ``label``."""

    id: int
    label: int


@dataclass(frozen=True)
class Retire:
    """These processes leave without being failures (a restarted world's members). ``kill``: stop them (ours);
    False: their launcher stops them (torchrun's agent)."""

    ids: tuple[int, ...]
    kill: bool = True


@dataclass(frozen=True)
class Restart:
    """The retired world's last reports are in (a checkpoint it finished writing counts): ask
    ``Membership.restart()`` where the fresh world resumes, and start it."""


@dataclass(frozen=True)
class Lost:
    """A member failed: its generation position and size (which share of the batch it held), the world size
    the strategy leads to, and the id of the process that takes its place (None: nobody yet)."""

    label: int
    id: int
    cause: str
    position: int
    size: int
    world_size_after: int
    replacement: int | None


@dataclass(frozen=True)
class Generation:
    """Generation ``gen`` of ``members`` (labels, in generation-rank order). ``source``: the generation rank whose
    state everyone takes (None: the members pick the most advanced one); ``resume``: a checkpoint the source
    loads first; ``recovery``: the strategy that led here (None: a start or a regrow)."""

    gen: int
    members: tuple[int, ...]
    holders: tuple[int, ...]  # the process id holding each member label
    source: int | None = None
    resume: str | None = None
    recovery: str | None = None


@dataclass(frozen=True)
class Note:
    """An event worth recording: its kind (workbench.faults.events), text, rank and its kind's fields."""

    kind: str
    detail: str
    rank: int = -1
    fields: dict[str, Any] = field(default_factory=dict, hash=False)


@dataclass(frozen=True)
class End:
    outcome: str
    reason: str


Decision = Start | Assign | Retire | Restart | Lost | Generation | Note | End
