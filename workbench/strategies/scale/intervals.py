"""The checkpoint interval: Young's first-order optimum √(2·C·M), Daly's higher-order one, and Daly's exact
expected efficiency of checkpoint-restart under exponential failures, which both approximate.

Young, "A first order approximation to the optimum checkpoint interval", CACM 17(9), 1974; Daly, "A higher
order estimate of the optimum checkpoint interval for restart dumps", FGCS 22(3), 2006.
"""

from __future__ import annotations

import math

RULES = ("young", "daly")


def young(checkpoint_s: float, mtbf_s: float) -> float:
    """Young's interval √(2·C·M) of computation between checkpoints (seconds)."""
    return math.sqrt(2.0 * checkpoint_s * mtbf_s)


def daly(checkpoint_s: float, mtbf_s: float) -> float:
    """Daly's higher-order interval: √(2CM)·(1 + √(C/2M)/3 + (C/2M)/9) − C for C < 2M, else M."""
    if checkpoint_s >= 2.0 * mtbf_s:
        return mtbf_s
    x = checkpoint_s / (2.0 * mtbf_s)
    return math.sqrt(2.0 * checkpoint_s * mtbf_s) * (1.0 + math.sqrt(x) / 3.0 + x / 9.0) - checkpoint_s


def optimum(rule: str, checkpoint_s: float, mtbf_s: float) -> float:
    """The interval by ``rule`` (``young`` or ``daly``)."""
    return young(checkpoint_s, mtbf_s) if rule == RULES[0] else daly(checkpoint_s, mtbf_s)


def restart_efficiency(interval_s: float, checkpoint_s: float, restart_s: float, mtbf_s: float) -> float:
    """Daly's exact share of wall time spent on kept computation for checkpoint-restart under exponential
    failures: each segment of computation τ and checkpoint C is retried until it runs without a failure, each
    failure costing a restart R that can itself be interrupted: τ / (M·e^(R/M)·(e^((τ+C)/M) − 1))."""
    m = mtbf_s
    return interval_s / (m * math.exp(restart_s / m) * math.expm1((interval_s + checkpoint_s) / m))


def best_restart_interval(checkpoint_s: float, restart_s: float, mtbf_s: float) -> float:
    """The interval that maximises :func:`restart_efficiency` (golden-section search on a log scale)."""
    lo, hi = math.log(max(checkpoint_s, 1e-9) * 1e-3), math.log(50.0 * mtbf_s)
    ratio = (math.sqrt(5.0) - 1.0) / 2.0

    def value(x: float) -> float:
        return restart_efficiency(math.exp(x), checkpoint_s, restart_s, mtbf_s)

    a, b = hi - ratio * (hi - lo), lo + ratio * (hi - lo)
    for _ in range(200):
        if value(a) > value(b):
            hi = b
        else:
            lo = a
        a, b = hi - ratio * (hi - lo), lo + ratio * (hi - lo)
    return math.exp((lo + hi) / 2.0)
