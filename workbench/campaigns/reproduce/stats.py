"""Intervals of the reproductions: a mean's Student-t interval over seeds (two-sided, or one-sided bounds for a
directional claim). Shared by the campaigns' checks (:mod:`workbench.campaigns.reproduce.common`) and the registered
tests (:mod:`workbench.campaigns.reproduce.registry`)."""

from __future__ import annotations

import math
from collections.abc import Iterable

from workbench.base.extras import need


def mean_interval(values: Iterable[float], confidence: float = 0.95) -> tuple[float, float, float]:
    """Mean and its two-sided Student-t interval over ``values`` (NaNs dropped); one value: (v, v, v)."""
    stats = need("scipy.stats", "studies", "the reproductions' statistics")

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


# -- power before registration ---------------------------------------------------------------------------------------
# The distance between the effect assumed true (the smallest effect of interest) and the margin the registered test
# must clear, per test (effects oriented so that positive favours the claim); equivalence must clear both bounds.
def _distance(test: str, sesoi: float, margin: float) -> float:
    if test == "superiority":  # true effect sesoi > margin
        return sesoi - margin
    if test == "non_inferiority":  # true effect sesoi (often 0) against -margin
        return sesoi + margin
    if test == "equivalence":  # true effect sesoi (often 0) inside (-margin, margin)
        return margin - abs(sesoi)
    if test == "difference":  # true |effect| sesoi beyond margin
        return abs(sesoi) - margin
    raise ValueError(f"no power for test {test!r}")


def t_power(n: int, sd: float, sesoi: float, margin: float, test: str, alpha: float) -> float:
    """Power of the registered paired (one-sample) t decision with ``n`` pairs of spread ``sd`` when the true mean
    effect is ``sesoi``: the chance that its two-sided 1 - 2 alpha interval lies wholly on the claim's side of the
    margin (noncentral t; equivalence: both one-sided tests, 2 p - 1, the usual TOST bound)."""
    stats = need("scipy.stats", "studies", "the reproductions' statistics")

    if n < 2 or sd <= 0:
        return math.nan
    delta = _distance(test, sesoi, margin)
    if delta <= 0:
        return 0.0
    crit = stats.t.ppf(1 - alpha, n - 1)
    one = float(stats.nct.sf(crit, n - 1, delta * math.sqrt(n) / sd))
    return max(0.0, 2 * one - 1) if test == "equivalence" else one


def n_paired(sd: float, sesoi: float, margin: float, test: str, alpha: float, power: float = 0.8,
             limit: int = 100_000) -> int | None:
    """The fewest pairs (one per seed) that give the registered t decision ``power`` at true effect ``sesoi``
    (:func:`t_power`); None when no n up to ``limit`` does (the effect of interest lies on the margin's wrong side)."""
    if _distance(test, sesoi, margin) <= 0 or sd <= 0:
        return None
    n = 2
    while n <= limit:
        if t_power(n, sd, sesoi, margin, test, alpha) >= power:
            return n
        n = n + 1 if n < 1000 else int(n * 1.01) + 1
    return None


def n_normal(sd: float, sesoi: float, margin: float, test: str, alpha: float, power: float = 0.8) -> float:
    """The normal approximation of :func:`n_paired` (closed form, no rounding): ((z_{1-alpha} + z_beta) sd / d)^2,
    with z_{1-beta/2} for equivalence."""
    from statistics import NormalDist

    z = NormalDist().inv_cdf
    beta = 1 - power
    second = z(1 - beta / 2) if test == "equivalence" else z(1 - beta)
    return ((z(1 - alpha) + second) * sd / _distance(test, sesoi, margin)) ** 2


def wilson(successes: int, trials: int, z: float = 1.96) -> tuple[float, float, float]:
    """A share and its Wilson score interval at normal quantile ``z`` (trials < 1: NaNs)."""
    if trials < 1:
        return math.nan, math.nan, math.nan
    p = successes / trials
    centre = (p + z * z / (2 * trials)) / (1 + z * z / trials)
    half = z * math.sqrt(p * (1 - p) / trials + z * z / (4 * trials * trials)) / (1 + z * z / trials)
    return p, max(0.0, centre - half), min(1.0, centre + half)


def newcombe(x1: int, n1: int, x2: int, n2: int, z: float = 1.96) -> tuple[float, float, float]:
    """The difference of two shares, x1/n1 - x2/n2, and Newcombe's hybrid score interval (his method 10: the
    two Wilson intervals combined)."""
    p1, l1, u1 = wilson(x1, n1, z)
    p2, l2, u2 = wilson(x2, n2, z)
    d = p1 - p2
    return (d, d - math.sqrt((p1 - l1) ** 2 + (u2 - p2) ** 2), d + math.sqrt((u1 - p1) ** 2 + (p2 - l2) ** 2))


def share_power(trials: int, share: float, margin: float, alpha: float, below: bool = True) -> float:
    """Exact binomial power of the registered Wilson decision with ``trials`` when the true share is ``share``:
    the chance that the Wilson interval (two-sided, 1 - 2 alpha) lies wholly below ``margin`` (``below``; above it
    otherwise)."""
    stats = need("scipy.stats", "studies", "the reproductions' statistics")

    z = float(stats.norm.ppf(1 - alpha))
    hits = [x for x in range(trials + 1)
            if (wilson(x, trials, z)[2] < margin if below else wilson(x, trials, z)[1] > margin)]
    return float(sum(stats.binom.pmf(x, trials, share) for x in hits))


def n_share(share: float, margin: float, alpha: float, power: float = 0.8, below: bool = True,
            limit: int = 20_000) -> int | None:
    """The fewest trials from which the Wilson decision keeps ``power`` at true share ``share`` for every larger n
    up to 1.5 n (the binomial's saw-tooth makes the power of single n's jump); None when none up to ``limit``."""
    if (share >= margin) if below else (share <= margin):
        return None
    n = 1
    while n <= limit:
        if share_power(n, share, margin, alpha, below) >= power and all(
                share_power(m, share, margin, alpha, below) >= power for m in range(n + 1, int(1.5 * n) + 2, 7)):
            return n
        n = n + 1 if n < 200 else int(n * 1.02) + 1
    return None
