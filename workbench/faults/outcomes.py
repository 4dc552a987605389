"""Outcome classes of an injection, against a golden run with the same seed and configuration (the ISCA'23
training-time classes Masked / Immediate INF-NaN / SlowDegrade, plus crash; docs/soft-errors.md).
"""

from __future__ import annotations

import math
from typing import Any

from workbench.faults import events as ev
from workbench.faults.kinds import FLIP

MASKED, DEGRADED, NONFINITE, CRASH = OUTCOMES = ("masked", "degraded", "nonfinite", "crash")  # best to worst


def classify_values(accuracy: float | None, golden_accuracy: float, losses: list[float], completed: bool,
                    tolerance: float) -> str:
    if not completed:
        return CRASH
    if any(not math.isfinite(v) for v in losses) or accuracy is None or not math.isfinite(accuracy):
        return NONFINITE
    return DEGRADED if accuracy < golden_accuracy - tolerance else MASKED


# a flip that moves a value by at most this share of itself (fp32 mantissa bits 0-9) is masked: the JPDC'24 finding
MASKED_RELATIVE_CHANGE = 2.0**-13


def possible_outcomes(old: float, new: float) -> tuple[str, ...]:
    """The outcome classes a flip of one weight from ``old`` to ``new`` may have, as the notebooks assert them: a
    non-finite weight makes every sum it enters non-finite (NaN x 0 is NaN), so only ``nonfinite``; a change of
    at most ``MASKED_RELATIVE_CHANGE`` of the value (or of 1e-30 for zeros) is ``masked``; anything else may be
    any class but a crash (a flipped value never stops a run by itself)."""
    if not math.isfinite(new):
        return (NONFINITE,)
    if abs(new - old) <= MASKED_RELATIVE_CHANGE * max(abs(old), 1e-30):
        return (MASKED,)
    return (MASKED, DEGRADED, NONFINITE)


def classify(result: Any, golden: Any, tolerance: float = 0.01) -> dict[str, Any]:
    """``outcome`` (masked / degraded / nonfinite / crash), ``detected``, ``recovered``, accuracy delta."""
    accuracy = result.summary["final_test_accuracy"]
    golden_accuracy = golden.summary["final_test_accuracy"]
    outcome = classify_values(accuracy, golden_accuracy, [r["loss"] for r in result.metrics],
                              result.completed, tolerance)
    return {"outcome": outcome, "detected": bool(ev.of(result.events, ev.DETECTED)),
            "recovered": bool(ev.of(result.events, ev.RECOVERED)) and outcome == "masked",
            "accuracy": accuracy, "accuracy_delta": None if accuracy is None else accuracy - golden_accuracy,
            "flips": ev.count(result.events, FLIP.name)}


def wilson(successes: int, trials: int, z: float = 1.96) -> tuple[float, float, float]:
    """Share and its Wilson score interval (share, low, high); NaNs for no trials."""
    if trials == 0:
        return math.nan, math.nan, math.nan
    p = successes / trials
    centre = (p + z * z / (2 * trials)) / (1 + z * z / trials)
    half = z * math.sqrt(p * (1 - p) / trials + z * z / (4 * trials * trials)) / (1 + z * z / trials)
    return p, max(0.0, centre - half), min(1.0, centre + half)


def outcome_shares(frame: Any, z: float = 1.96) -> Any:
    """Share of each outcome per bit of bit-sensitivity trials (:func:`workbench.campaigns.studies.sensitivity.
    bit_sensitivity`) with Wilson score intervals (columns share, low, high)."""
    import pandas as pd

    rows = []
    for bit, group in frame.groupby("bit"):
        n = len(group)
        for outcome in OUTCOMES:
            share, low, high = wilson(int((group.outcome == outcome).sum()), n, z)
            rows.append({"bit": bit, "field": group.field.iloc[0], "outcome": outcome, "n": n, "share": share,
                         "low": low, "high": high})
    return pd.DataFrame(rows)
