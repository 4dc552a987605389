"""Which rank a live fault (``Run.kill``, ``Run.hang``, ``Run.flip``) may hit: a rank of the run that is alive now.

A wrong type, a rank the run never had, a rank that died or a run that ended is a
:class:`~workbench.base.errors.ConfigError` in one line, raised in the caller's thread before anything is sent to the
supervisor. A rank that dies between this check and the supervisor's signal is still recorded there as a
``fault_skipped`` event (the supervisor checks again).
"""

from __future__ import annotations

import numbers
from typing import Any

from workbench.base.errors import ConfigError
from workbench.faults import events as ev
from workbench.faults import kinds

# since the last generation: this rank is gone or going (a hang still counts alive)
_DEAD = (ev.FAILURE.name, *(k.name for k in kinds.REGISTRY.values() if k.kills))


def live_rank(rank: Any, action: str, status: dict[str, Any], events: list[dict[str, Any]], world_size: int,
              done: bool) -> int:
    """``rank`` as an int when ``action`` (kill, hang, flip) can hit it now, else a ConfigError saying why."""
    if isinstance(rank, bool) or not isinstance(rank, numbers.Integral):
        raise ConfigError("rank", f"must be an integer, got {type(rank).__name__} {rank!r}")
    rank = int(rank)
    if done:
        raise ConfigError("rank", f"cannot {action} rank {rank}: the run has ended ({status.get('state')})")
    members = list(status["members"]) if "members" in status else list(range(world_size))
    if not 0 <= rank < world_size and rank not in members:  # a resize may have added ranks
        raise ConfigError("rank", f"no rank {rank} in this run: its ranks are 0..{world_size - 1}")
    since_generation: set[int] = set()  # killed or failed since the latest generation
    last_fault: dict[int, str] = {}
    for event in list(events):
        if ev.kind_is(event, ev.GENERATION):
            since_generation = set()
        elif event.get("kind") in _DEAD:
            since_generation.add(event.get("rank", -1))
            last_fault[event.get("rank", -1)] = f"{event['kind']} at step {event.get('step')}: {ev.text(event, False)}"
    if rank not in members or rank in since_generation:
        why = f" ({last_fault[rank]})" if rank in last_fault else ""
        alive = [m for m in members if m not in since_generation]
        raise ConfigError("rank", f"cannot {action} rank {rank}: it is not alive{why}; live ranks: {alive}")
    return rank
