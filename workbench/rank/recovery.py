"""Rank-side hooks of the recovery strategies (DESIGN §4): what happens to the step in flight when a generation
changes under it, and which member's state everyone takes.

On joining generation ``g`` with ``recovery`` set, a rank first prepares locally, then the members agree on a
source and settle their state (:mod:`.transfer`: only members that differ from the source receive it), then
they settle the step that was in flight:

=================== ======================================== =========================================
recovery            before the state is settled              after it
=================== ======================================== =========================================
``rollback``        undo the buckets of the failed step      nothing: the training loop redoes the
                    already applied (undoable steps)         whole step, re-split over the new members
``forward``         keep the applied buckets                 finish the other buckets among the
                                                             members (dead rank's share lost)
``shrink``          nothing (no update before the whole      retry the failed allreduce among the
                    exchange completed, as in MaTEx-Caffe)   members (dead rank's share lost)
``reinit``          the source takes its last in-memory      nothing: training resumes at the
                    snapshot                                 snapshot's step
``checkpoint_       the source (a fresh rank) loads the      nothing: training resumes at the
restart``           last HDF5 checkpoint                     checkpoint's step
=================== ======================================== =========================================

Source: the supervisor names it when it matters (reinit, restart, the first generation); otherwise the
members allreduce a progress score (steps committed, then buckets applied) and the most advanced one wins,
so no committed work is ever dropped. A replacement rank scores -1 and never wins. (The data-parallel trainer
does this inside :func:`workbench.rank.transfer.agree`; gossip and pipeline still broadcast a serialised state
to their replacements.)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from workbench.rank.comm import Comm


@dataclass
class InFlight:
    """The step this rank was in when a generation changed: its number and this rank's place in the old
    generation (which shard of the global batch it held)."""

    step: int
    rank: int
    size: int


def most_advanced(comm: Comm, score: float) -> int:
    """Generation rank of the member with the highest score (lowest rank on ties); one small allreduce."""
    scores = torch.zeros(comm.size, dtype=torch.float64)
    scores[comm.rank] = score
    comm.wait(comm.allreduce(scores))
    best = scores.max().item()
    return int((scores == best).nonzero()[0].item())
