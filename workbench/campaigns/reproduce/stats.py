"""Intervals of the reproductions: a mean's Student-t interval over seeds (two-sided, or one-sided bounds for a
directional claim). Shared by the campaigns' checks (:mod:`workbench.campaigns.reproduce.common`) and the registered
tests (:mod:`workbench.campaigns.reproduce.registry`)."""

from __future__ import annotations

import math
from collections.abc import Iterable


def mean_interval(values: Iterable[float], confidence: float = 0.95) -> tuple[float, float, float]:
    """Mean and its two-sided Student-t interval over ``values`` (NaNs dropped); one value: (v, v, v)."""
    from scipy import stats

    data = [float(v) for v in values if v is not None and not math.isnan(float(v))]
    if not data:
        return math.nan, math.nan, math.nan
    mean = sum(data) / len(data)
    if len(data) < 2:
        return mean, mean, mean
    sd = math.sqrt(sum((v - mean) ** 2 for v in data) / (len(data) - 1))
    half = stats.t.ppf(0.5 + confidence / 2, len(data) - 1) * sd / math.sqrt(len(data))
    return mean, mean - half, mean + half


def one_sided(values: Iterable[float], confidence: float = 0.95) -> tuple[float, float, float]:
    """Mean and its one-sided Student-t bounds (lower, upper) at ``confidence``: for a directional claim
    ("a costs more than b": the lower bound of the paired differences is above 0)."""
    return mean_interval(values, 2 * confidence - 1)
