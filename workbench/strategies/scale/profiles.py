"""How each strategy recovers, as its paper means it: one frozen :class:`Profile` per name, the only place the
scale model tells strategies apart (docs/scale.md, "Strategies").

A profile says which costs stop the whole world, what is redone (the steps since the last checkpoint, the step
in flight, nothing), whether the strategy checkpoints, what becomes of the world (restarted whole, shrunk,
regrown by replacements, a replica group healed from a peer) and whether the failed ranks' samples are lost.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, replace

from workbench.base.errors import ConfigError


class Redo(enum.Enum):
    CHECKPOINT = "the steps since the last checkpoint"
    STEP = "the step in flight"
    NONE = "nothing"


class World(enum.Enum):
    RESTART = "the whole world restarts at full size (a replacement per failed rank)"
    SHRINK = "the survivors go on; the world stays smaller"
    REGROW = "the survivors go on; replacements join and the world returns to its size"


@dataclass(frozen=True)
class Profile:
    """One strategy's recovery. ``stall``: the costs (fields of :class:`~.costs.Costs`) the whole world waits
    for at each failure; ``redo``: what is redone; ``checkpoints``: it writes checkpoints (or snapshots) with a
    stall; ``world``: what becomes of the world; ``lossy``: the failed ranks' share of a step is lost;
    ``replica``: a failure takes its whole replica group out until the group heals (torchft)."""

    name: str
    summary: str
    stall: tuple[str, ...]
    redo: Redo
    world: World
    checkpoints: bool = False
    lossy: bool = False
    replica: bool = False


_SHRINK = Profile("shrink", "ULFM shrink-and-continue: the survivors retry the failed allreduce without the dead "
                  "rank's share and go on smaller", ("detection_s", "settle_s"), Redo.NONE, World.SHRINK, lossy=True)
PROFILES: dict[str, Profile] = {p.name: p for p in (
    Profile("checkpoint_restart", "every rank stops; a fresh world loads the last checkpoint and redoes the steps "
            "since", ("detection_s", "restart_s", "reload_s"), Redo.CHECKPOINT, World.RESTART, checkpoints=True),
    _SHRINK,
    Profile("rollback", "immediate mini-batch rollback: the step in flight is undone and redone by the survivors",
            ("detection_s", "settle_s"), Redo.STEP, World.SHRINK),
    Profile("forward", "lossy forward recovery: the step completes with the survivors' gradients",
            ("detection_s", "settle_s"), Redo.NONE, World.SHRINK, lossy=True),
    Profile("reinit", "global in-process restart: the dead rank is replaced and every rank returns to the last "
            "in-memory snapshot", ("detection_s", "settle_s", "join_s", "reload_s"), Redo.CHECKPOINT,
            World.RESTART, checkpoints=True),
    replace(_SHRINK, name="regrow", summary="shrink, then a replacement (a spare) joins with a live peer's state",
            world=World.REGROW),
    Profile("torchft", "torchft: the step in flight is discarded, the failed replica group restarts and heals "
            "from a live peer while the others train", ("detection_s", "settle_s"), Redo.STEP, World.REGROW,
            replica=True),
    Profile("torchrun", "torchrun: the whole job restarts from its last checkpoint",
            ("detection_s", "restart_s", "reload_s"), Redo.CHECKPOINT, World.RESTART, checkpoints=True),
    replace(_SHRINK, name="ulfm", summary="ULFM: the communicator is shrunk in process; the survivors go on"),
)}
NAMES = tuple(PROFILES)


def profile(strategy: str | Profile, regrow: bool = False) -> Profile:
    """The profile of ``strategy`` (a name of :data:`NAMES`, or a profile); ``regrow`` makes a shrinking one
    regrow (shrink, rollback and forward with ``--regrow``)."""
    if isinstance(strategy, Profile):
        found = strategy
    else:
        found = PROFILES.get(strategy)
        if found is None:
            raise ConfigError("strategy", f"{strategy!r} is not known: allowed {', '.join(NAMES)}")
    if regrow:
        if found.world is World.RESTART:
            raise ConfigError("regrow", f"{found.name} restarts the whole world: it has nothing to regrow")
        found = replace(found, world=World.REGROW)
    return found
