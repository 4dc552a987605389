"""Rank-side hooks of the recovery strategies: what happens to the step in flight when a generation changes under
it, and which member's state everyone takes.

A rank joining a recovery generation prepares locally (rollback undoes the applied buckets, reinit and
checkpoint_restart take a snapshot or checkpoint), the members agree on a source and settle their state
(:mod:`.transfer`), then settle the step in flight (forward and shrink finish the exchange among the members).
The source is the supervisor's choice where it matters, else the most advanced member, so no committed work is
dropped. The table per strategy: docs/permanent-faults.md and docs/internals.md.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class InFlight:
    """The step this rank was in when a generation changed: its number and this rank's place in the old
    generation (which shard of the global batch it held)."""

    step: int
    rank: int
    size: int
