"""The discrete-event simulation of one job (docs/scale.md, "The simulation"): where the closed form does not
hold — failures during a recovery, spares running out, whole nodes failing, Weibull failures, a world that
shrinks a lot. The whole job's failure process is sampled at once (numpy, seeded), then walked event by event.
"""

from __future__ import annotations

import heapq
import math
from typing import TYPE_CHECKING

from workbench.strategies.scale.closed_form import holds
from workbench.strategies.scale.costs import Costs
from workbench.strategies.scale.profiles import Redo, World
from workbench.strategies.scale.result import Prediction
from workbench.strategies.scale.scenario import HOUR, Plan

if TYPE_CHECKING:
    import numpy as np

# The point the speed gate times (benchmarks/gate.py, scale_des_100k): 100,000 ranks for 30 days, ranks failing
# alone (Weibull, shape 0.8) and 8 at a time with their node (6.5 failures per 1000 node-days), torchft's replica
# groups of 64 healing from a peer, 20,000 spares: about 8,000 failure events, every one walked.
SPEED_POINT = {"strategy": "torchft", "world": 100_000, "mtbf_hours": 50_000.0, "node_mtbf_hours": 24_000 / 6.5,
               "ranks_per_node": 8, "weibull_shape": 0.8, "replica_ranks": 64, "spares": 20_000,
               "replacement_s": 4 * 3600.0, "job_hours": 720.0, "method": "simulate",
               "costs": Costs(step_s=5.0, detection_s=30.0, settle_s=60.0, join_s=600.0)}


def failure_times(plan: Plan, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Every failure event of the job at full size, merged over its ranks and nodes: (sorted times in seconds,
    ranks each takes down). Exponential failures are one Poisson process per kind; Weibull ones the renewal
    processes of all ranks (or nodes) sampled together, one draw per rank per round."""
    import numpy as np  # here: the CLI's parser imports this package and needs none of it

    f, p, horizon = plan.scenario.failures, plan.scenario.world, plan.seconds
    streams = [(p, f.rank_mtbf_hours, 1), (p / f.ranks_per_node, f.node_mtbf_hours, f.ranks_per_node)]
    times, sizes = [], []
    for slots, mtbf_hours, size in streams:
        if mtbf_hours is None:
            continue
        mtbf = mtbf_hours * HOUR
        if f.shape == 1.0:
            drawn = rng.uniform(0.0, horizon, rng.poisson(slots * horizon / mtbf))
        else:
            scale = mtbf / math.gamma(1.0 + 1.0 / f.shape)
            parts, due = [], scale * rng.weibull(f.shape, max(int(round(slots)), 1))
            while due.size:
                due = due[due < horizon]
                parts.append(due)
                due = due + scale * rng.weibull(f.shape, due.size)
            drawn = np.concatenate(parts)
        times.append(drawn)
        sizes.append(np.full(drawn.size, size, dtype=np.int64))
    t, k = np.concatenate(times), np.concatenate(sizes)
    order = np.argsort(t, kind="stable")
    return t[order], k[order]


class _Job:
    """The state of one simulated job: the time accounted up to, the end of the current stall, the live world,
    where it is in its checkpoint cycle (or step), and what it has kept, redone and lost."""

    def __init__(self, plan: Plan) -> None:
        self.plan = plan
        self.p = plan.scenario.world
        self.t = 0.0
        self.stall_end = 0.0
        self.world = float(self.p)
        self.cycle = plan.interval_s + plan.checkpoint_s
        self.position = 0.0  # in the checkpoint cycle (a checkpointing strategy) or in the step
        self.useful = 0.0  # rank-seconds of computation kept
        self.failures = self.redone = self.samples = self.spares_used = 0.0
        self.spares = plan.scenario.spares
        self.joins: list[tuple[float, float]] = []

    def _computed(self, position: float) -> float:
        """Computation done from a cycle's start to ``position`` (checkpoint stalls excluded)."""
        whole, rest = divmod(position, self.cycle)
        return whole * self.plan.interval_s + min(rest, self.plan.interval_s)

    def advance(self, until: float) -> None:
        """Work from the accounted time to ``until`` (nothing while a stall lasts)."""
        start = max(self.t, self.stall_end)
        if until > start and self.world > 0:
            span = until - start
            if self.plan.profile.checkpoints:
                self.useful += self.world * (self._computed(self.position + span) - self._computed(self.position))
                self.position = (self.position + span) % self.cycle
            else:
                self.useful += self.world * span
                self.position = (self.position + span) % self.plan.step_s
        self.t = max(self.t, until)

    def take_spares(self, ranks: float) -> bool:
        """Take ``ranks`` replacements from the spares; False when they are used up (a replacement is waited for)."""
        if self.spares is not None and self.spares < ranks:
            self.spares = 0
            return False
        if self.spares is not None:
            self.spares -= int(ranks)
        self.spares_used += ranks
        return True

    def lose_work(self) -> float:
        """Charge the computation a failure loses while the job works; the seconds of the step left to finish."""
        plan, profile = self.plan, self.plan.profile
        if plan.redo_steps is not None:
            self.useful -= self.world * plan.redo_steps * plan.step_s
            self.redone += plan.redo_steps
            return 0.0
        if profile.redo is Redo.CHECKPOINT:
            since = min(self.position, plan.interval_s)
            self.useful -= self.world * since
            self.redone += since / plan.step_s
            self.position = 0.0
            return 0.0
        if profile.redo is Redo.STEP:
            done = self.position
            self.useful -= self.world * done
            self.redone += 1.0
            self.position = 0.0
            return plan.step_s - done  # the failure shows at the step's end
        return 0.0

    def fail(self, when: float, ranks: int) -> None:
        """A failure of ``ranks`` ranks at ``when`` (the job has been advanced to it)."""
        plan, profile = self.plan, self.plan.profile
        self.failures += 1.0
        working = when >= self.stall_end
        rest = self.lose_work() if working else 0.0
        out = max(float(ranks), float(plan.scenario.replica_ranks)) if profile.replica else float(ranks)
        out = min(out, self.world)
        if plan.samples_lost is not None:
            self.samples += plan.samples_lost
        elif profile.lossy:
            self.samples += out * plan.scenario.batch_per_rank
        wait = 0.0
        if profile.world is World.RESTART:
            wait = 0.0 if self.take_spares(ranks) else plan.scenario.replacement_s
            self.position = 0.0
        else:
            self.world -= out
        self.stall_end = when + plan.stall_s + rest + wait
        if profile.world is World.REGROW and out > 0:
            join = plan.join_s if self.take_spares(ranks) else plan.scenario.replacement_s
            heapq.heappush(self.joins, (self.stall_end + join, out))

    def join(self, ranks: float) -> None:
        self.world = min(self.world + ranks, float(self.p))


def simulate(plan: Plan, seed: int = 0) -> Prediction:
    """One simulated job of ``plan`` (seeded: the same seed, the same job)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    times, sizes = failure_times(plan, rng)
    keep = rng.random(times.size)
    job, horizon, shrinks = _Job(plan), plan.seconds, plan.profile.world is not World.RESTART
    for when, ranks, draw in zip(times.tolist(), sizes.tolist(), keep.tolist()):
        while job.joins and job.joins[0][0] <= when:
            at, back = heapq.heappop(job.joins)
            job.advance(at)
            job.join(back)
        if shrinks and draw >= job.world / job.p:  # the rank (or node) that fails is already gone
            continue
        job.advance(when)
        job.fail(when, ranks)
    while job.joins and job.joins[0][0] <= horizon:
        at, back = heapq.heappop(job.joins)
        job.advance(at)
        job.join(back)
    job.advance(horizon)
    s = plan.scenario
    return Prediction(plan.profile.name, s.world, max(job.useful / (s.world * horizon), 0.0), job.failures,
                      job.redone, job.samples / s.job_hours, job.spares_used, job.world,
                      plan.interval_s if plan.profile.checkpoints else None, 1.0 / plan.rate, "simulation",
                      holds(plan))
