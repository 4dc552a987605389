"""What a prediction says about a job (docs/scale.md, "Outputs"): :class:`Prediction`."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class Prediction:
    """``effective``: the share of the job's rank-time spent on steps that count (1: no failure, no checkpoint
    stall); ``failures``: failure events over the job; ``steps_redone``: steps computed again over the job;
    ``samples_lost_per_hour``: samples dropped by a lossy recovery; ``spares_used``: ranks taken from the spares;
    ``final_world``: the world at the job's end; ``interval_s``: computation between checkpoints (None: the
    strategy writes none); ``job_mtbf_s``: the job's mean time between failures at full size; ``method``:
    ``closed form`` or ``simulation``; ``first_order``: whether the closed form holds (failures rare against
    recovery, exponential failures, spares enough)."""

    strategy: str
    world: int
    effective: float
    failures: float
    steps_redone: float
    samples_lost_per_hour: float
    spares_used: float
    final_world: float
    interval_s: float | None
    job_mtbf_s: float
    method: str
    first_order: bool

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
