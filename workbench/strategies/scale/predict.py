"""The scale model's doors (docs/scale.md): :func:`predict` (one strategy, one job: the closed form where it
holds, else the simulation) and :func:`crossover` (the world size or MTBF where one strategy overtakes another,
by bisection on the closed form).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from workbench.base.errors import ConfigError
from workbench.strategies.scale.closed_form import closed_form, holds
from workbench.strategies.scale.costs import Costs
from workbench.strategies.scale.profiles import Profile, profile
from workbench.strategies.scale.result import Prediction
from workbench.strategies.scale.scenario import FailureProcess, Scenario, plan
from workbench.strategies.scale.simulate import simulate

METHODS = ("auto", "closed", "simulate")
SCAN = 49  # points a crossover search scans before it bisects: ~5 a decade over 0.01-1e8 hours, ~8 over 2-1e6 ranks


def scenario(world: int, mtbf_hours: float | None = None, *, job_mtbf_hours: float | None = None,
             node_mtbf_hours: float | None = None, ranks_per_node: int = 1, weibull_shape: float = 1.0,
             **options: Any) -> Scenario:
    """A :class:`Scenario` from keywords: ``mtbf_hours`` is one rank's MTBF; ``job_mtbf_hours`` instead gives the
    whole job's (at this world size); ``node_mtbf_hours`` adds whole-node failures of ``ranks_per_node`` ranks;
    the other ``options`` are the scenario's fields."""
    if job_mtbf_hours is not None:
        if mtbf_hours is not None or node_mtbf_hours is not None:
            raise ConfigError("job_mtbf_hours", "give the job's MTBF or a rank's and a node's, not both")
        failures = FailureProcess.job(job_mtbf_hours, world if isinstance(world, int) else 1, ranks_per_node)
        failures = replace(failures, shape=weibull_shape)
    else:
        failures = FailureProcess(mtbf_hours, node_mtbf_hours, ranks_per_node, weibull_shape)
    return Scenario(world, failures, **options)


def predict(strategy: str | Profile = "checkpoint_restart", world: int = 1024, mtbf_hours: float | None = None, *,
            costs: Costs | None = None, regrow: bool = False, method: str = "auto", seed: int = 0,
            step_s: float | None = None, checkpoint_s: float | None = None, **options: Any) -> Prediction:
    """Predict one strategy's effective training time and costs for a job of ``world`` ranks whose ranks each
    fail every ``mtbf_hours`` on average (or see :func:`scenario` for the job's MTBF, node failures, Weibull
    failures, the model size, job length, checkpoint interval and spares). ``costs``: the strategy's
    :class:`~.costs.Costs` (default: the workbench's own small-world figures); ``step_s`` and ``checkpoint_s``
    override its step and checkpoint stall. ``method``: ``auto`` (the closed form where it holds, else the
    simulation), ``closed`` or ``simulate``; ``seed`` seeds the simulation."""
    if method not in METHODS:
        raise ConfigError("method", f"{method!r} is not known: allowed {', '.join(METHODS)}")
    chosen = profile(strategy, regrow)
    costs = costs or Costs()
    if step_s is not None:
        costs = replace(costs, step_s=step_s)
    if checkpoint_s is not None:
        costs = replace(costs, checkpoint_s=checkpoint_s)
    job = plan(chosen, scenario(world, mtbf_hours, **options), costs)
    if method == "closed" or (method == "auto" and holds(job)):
        return closed_form(job)
    return simulate(job, seed)


def _effective_gap(a: str, b: str, vary: str, value: float, fixed: dict[str, Any],
                   b_costs: Costs | None) -> float:
    options = {**fixed, vary: int(round(value)) if vary == "world" else value}
    other = {**options, "costs": b_costs} if b_costs is not None else options
    return (predict(a, method="closed", **options).effective - predict(b, method="closed", **other).effective)


def crossover(a: str, b: str, vary: str = "world", low: float = 2.0, high: float = 1e6,
              b_costs: Costs | None = None, **fixed: Any) -> float | None:
    """The value of ``vary`` (``world``, or any numeric keyword of :func:`predict` such as ``mtbf_hours``) in
    [low, high] where strategy ``a``'s effective time first crosses ``b``'s: the range scanned at ``SCAN`` points
    evenly spaced on a log scale, then bisection on the closed form between the first two where the lead changes
    hands (a tie, such as both at 0 %, is no crossing); None when neither overtakes the other. The other keywords
    are held fixed; ``b_costs``: ``b``'s own costs where they differ from ``a``'s (``costs`` among the keywords)."""
    if not 0 < low < high:
        raise ConfigError("crossover", f"low={low!r}, high={high!r}: give 0 < low < high")
    gap: Callable[[float], float] = lambda x: _effective_gap(a, b, vary, x, fixed, b_costs)  # noqa: E731
    points = [math.log(low) + (math.log(high) - math.log(low)) * i / (SCAN - 1) for i in range(SCAN)]
    leads = [(x, g) for x in points if (g := gap(math.exp(x))) != 0.0]
    pair = next(((x0, g0, x1) for (x0, g0), (x1, g1) in zip(leads, leads[1:]) if (g0 > 0) != (g1 > 0)), None)
    if pair is None:
        return None
    lo, g_lo, hi = pair
    for _ in range(100):
        mid = (lo + hi) / 2.0
        g_mid = gap(math.exp(mid))
        if g_mid != 0.0 and (g_mid > 0) == (g_lo > 0):
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-9:
            break
    found = math.exp((lo + hi) / 2.0)
    return float(round(found)) if vary == "world" else found
