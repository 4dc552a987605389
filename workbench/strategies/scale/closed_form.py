"""The first-order closed form of a strategy's effective training time (docs/scale.md, "The closed form"): it
holds while failures are rare against recovery (λ·(stall + redo + join) ≤ :data:`FIRST_ORDER`), failures are
exponential and the spares last; :func:`holds` says whether they do, the simulation answers where not.
"""

from __future__ import annotations

from workbench.strategies.scale.profiles import Redo, World
from workbench.strategies.scale.result import Prediction
from workbench.strategies.scale.scenario import HOUR, Plan

FIRST_ORDER = 0.1  # the largest λ × (time a failure costs) the closed form is used at: its error is ~ half its square


def redo_seconds(plan: Plan) -> tuple[float, float]:
    """(seconds of computation lost, steps redone) per failure, on average."""
    if plan.redo_steps is not None:
        return plan.redo_steps * plan.step_s, plan.redo_steps
    if plan.profile.redo is Redo.CHECKPOINT:
        tau, c = plan.interval_s, plan.checkpoint_s
        lost = (tau * tau / 2.0 + c * tau) / (tau + c)  # uniform over a cycle; during the stall, all of it
        return lost, lost / plan.step_s
    if plan.profile.redo is Redo.STEP:
        return plan.step_s, 1.0  # the failure shows at the step's end: the whole step is lost
    return 0.0, 0.0


def join_seconds(plan: Plan) -> float:
    """How long a replacement takes to be back once the survivors have settled (a spare's join)."""
    return plan.join_s


def cost_per_failure(plan: Plan) -> float:
    """World-seconds a failure costs: the stall, the lost computation, and (a replica group or replacement out)
    its share of the world for its join."""
    lost, _ = redo_seconds(plan)
    out = plan.ranks_out / plan.scenario.world if plan.profile.world is World.REGROW else 0.0
    return plan.stall_s + lost + out * join_seconds(plan)


def replacements(plan: Plan) -> float:
    """Ranks a job needs replaced over its length (each failed rank, for a strategy that restarts or regrows)."""
    if plan.profile.world is World.SHRINK:
        return 0.0
    return plan.rate * plan.seconds * plan.ranks_per_event


def holds(plan: Plan) -> bool:
    """Whether the first-order closed form holds for ``plan`` (else the simulation answers)."""
    s = plan.scenario
    rare = plan.rate * (plan.stall_s + redo_seconds(plan)[0] + join_seconds(plan)) <= FIRST_ORDER
    small_shrink = plan.profile.world is not World.SHRINK or \
        plan.rate * plan.seconds * plan.ranks_per_event <= FIRST_ORDER * s.world
    spares = s.spares is None or replacements(plan) <= s.spares
    return rare and small_shrink and spares and s.failures.shape == 1.0


def closed_form(plan: Plan) -> Prediction:
    """The first-order prediction: effective = τ/(τ+C) · (1 − λ·(D + redo + out·J/p)) − shrink, with λ the job's
    failure rate, D the stall, τ and C the checkpoint interval and stall, J a replacement's join, and for a
    strategy that shrinks, the ranks lost over the job, λ·k·T/(2p) on average."""
    s, p = plan.scenario, plan.scenario.world
    checkpointing = plan.interval_s / (plan.interval_s + plan.checkpoint_s) if plan.profile.checkpoints else 1.0
    effective = checkpointing * (1.0 - plan.rate * cost_per_failure(plan))
    failures = plan.rate * plan.seconds
    final = float(p)
    if plan.profile.world is World.SHRINK:
        effective -= plan.rate * plan.ranks_per_event * plan.seconds / (2.0 * p)
        final = max(p - failures * plan.ranks_per_event, 0.0)
    _, steps = redo_seconds(plan)
    lost = plan.samples_lost if plan.samples_lost is not None else \
        plan.ranks_out * s.batch_per_rank if plan.profile.lossy else 0.0
    spares = replacements(plan) if s.spares is None else min(replacements(plan), float(s.spares))
    return Prediction(plan.profile.name, p, max(effective, 0.0), failures, failures * steps,
                      plan.rate * HOUR * lost, spares, final,
                      plan.interval_s if plan.profile.checkpoints else None, 1.0 / plan.rate, "closed form",
                      holds(plan))
