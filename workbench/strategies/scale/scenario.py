"""The job a prediction is for: :class:`FailureProcess` (per-rank and per-node MTBF, exponential or Weibull,
node failures taking their k ranks together) and :class:`Scenario` (world, model size, job length, checkpoint
interval, spares); :class:`Plan` is both, with a strategy's profile and costs, evaluated at the job's size.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from workbench.base.errors import ConfigError
from workbench.strategies.scale.costs import Costs
from workbench.strategies.scale.intervals import RULES, optimum
from workbench.strategies.scale.profiles import Profile, World

HOUR = 3600.0


def _positive(field: str, value: float | None, unit: str, allow_none: bool = True, floor: float = 0.0) -> None:
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > floor or math.isnan(value):
        raise ConfigError(field, f"{value!r} is not allowed: a number of {unit} > {floor:g}")


@dataclass(frozen=True)
class FailureProcess:
    """Failures of the job's ranks. ``rank_mtbf_hours``: each rank's own failures (None: none);
    ``node_mtbf_hours``: failures of a whole node, its ``ranks_per_node`` ranks together (None: none);
    ``shape``: the Weibull shape of the times between one rank's (or node's) failures (1: exponential)."""

    rank_mtbf_hours: float | None = None
    node_mtbf_hours: float | None = None
    ranks_per_node: int = 1
    shape: float = 1.0

    def __post_init__(self) -> None:
        _positive("mtbf_hours", self.rank_mtbf_hours, "hours")
        _positive("node_mtbf_hours", self.node_mtbf_hours, "hours")
        if self.rank_mtbf_hours is None and self.node_mtbf_hours is None:
            raise ConfigError("mtbf_hours", "give a rank MTBF, a node MTBF or both")
        if isinstance(self.ranks_per_node, bool) or not isinstance(self.ranks_per_node, int) or \
                self.ranks_per_node < 1:
            raise ConfigError("ranks_per_node", f"{self.ranks_per_node!r} is not allowed: an integer >= 1")
        _positive("weibull_shape", self.shape, "(a Weibull shape)", allow_none=False)

    @classmethod
    def per_node_day(cls, failures_per_1000_node_days: float, ranks_per_node: int) -> FailureProcess:
        """Node failures at a rate given as failures per 1000 node-days (as cluster studies report it)."""
        _positive("failures_per_1000_node_days", failures_per_1000_node_days, "failures")
        return cls(node_mtbf_hours=1000.0 * 24.0 / failures_per_1000_node_days, ranks_per_node=ranks_per_node)

    @classmethod
    def job(cls, job_mtbf_hours: float, world: int, ranks_per_node: int = 1) -> FailureProcess:
        """A job of ``world`` ranks failing every ``job_mtbf_hours`` on average (one rank at a time, or one node
        of ``ranks_per_node`` ranks at a time)."""
        _positive("job_mtbf_hours", job_mtbf_hours, "hours")
        if ranks_per_node > 1:
            return cls(node_mtbf_hours=job_mtbf_hours * world / ranks_per_node, ranks_per_node=ranks_per_node)
        return cls(rank_mtbf_hours=job_mtbf_hours * world)

    def rates(self, world: int) -> tuple[float, float]:
        """Failure events per second of ``world`` ranks: (single ranks, whole nodes)."""
        ranks = 0.0 if self.rank_mtbf_hours is None else world / (self.rank_mtbf_hours * HOUR)
        nodes = 0.0 if self.node_mtbf_hours is None else world / self.ranks_per_node / (self.node_mtbf_hours * HOUR)
        return ranks, nodes

    def mtbf_s(self, world: int) -> float:
        """The job's mean time between failure events, seconds."""
        return 1.0 / sum(self.rates(world))


@dataclass(frozen=True)
class Scenario:
    """A job: ``world`` ranks training ``params`` parameters for ``job_hours`` of wall time under ``failures``;
    ``interval_s`` of computation between checkpoints (None: ``interval_rule``'s optimum, ``young`` or
    ``daly``); ``spares`` ready ranks (None: never short of one), ``replacement_s`` to get one once they are
    used up; ``replica_ranks``: the ranks of one replica group (torchft; 0: the failed ranks only);
    ``batch_per_rank``: samples per rank per step (the unit of samples lost)."""

    world: int
    failures: FailureProcess
    params: float = 1e9
    job_hours: float = 720.0
    interval_s: float | None = None
    interval_rule: str = "young"
    spares: int | None = None
    replacement_s: float = 0.0
    replica_ranks: int = 0
    batch_per_rank: float = 1.0

    def __post_init__(self) -> None:
        if isinstance(self.world, bool) or not isinstance(self.world, int) or self.world < 1:
            raise ConfigError("world", f"{self.world!r} is not allowed: an integer >= 1")
        _positive("params", self.params, "parameters", allow_none=False, floor=-1)
        _positive("job_hours", self.job_hours, "hours", allow_none=False)
        _positive("interval_s", self.interval_s, "seconds")
        if self.interval_rule not in RULES:
            raise ConfigError("interval_rule", f"{self.interval_rule!r} is not known: allowed "
                              f"{', '.join(RULES)}")
        if self.spares is not None and (isinstance(self.spares, bool) or not isinstance(self.spares, int)
                                        or self.spares < 0):
            raise ConfigError("spares", f"{self.spares!r} is not allowed: an integer >= 0 (None: unlimited)")
        _positive("replacement_s", self.replacement_s, "seconds", allow_none=False, floor=-1)
        if isinstance(self.replica_ranks, bool) or not isinstance(self.replica_ranks, int) or \
                not 0 <= self.replica_ranks <= self.world:
            raise ConfigError("replica_ranks", f"{self.replica_ranks!r} is not allowed: an integer 0..world")
        _positive("batch_per_rank", self.batch_per_rank, "samples", allow_none=False, floor=-1)


@dataclass(frozen=True)
class Plan:
    """A scenario, a profile and costs evaluated at the job's size: what the closed form and the simulation
    both read (seconds; rates per second)."""

    profile: Profile
    scenario: Scenario
    step_s: float
    stall_s: float  # what the whole world waits for at each failure
    join_s: float  # until a replacement (or a replica group) is back, after the stall
    checkpoint_s: float  # the stall per checkpoint (0 for a strategy that writes none)
    interval_s: float  # computation between checkpoints (0 for a strategy that writes none)
    rank_rate: float
    node_rate: float
    redo_steps: float | None  # a given number of steps redone per failure (None: implied by the profile)
    samples_lost: float | None  # a given number of samples lost per failure (None: implied)

    @property
    def rate(self) -> float:
        return self.rank_rate + self.node_rate

    @property
    def ranks_per_event(self) -> float:
        k = self.scenario.failures.ranks_per_node
        return (self.rank_rate + self.node_rate * k) / self.rate

    @property
    def ranks_out(self) -> float:
        """The ranks a failure takes out of the world (its replica group, for a replica strategy)."""
        lost = self.ranks_per_event
        return max(lost, float(self.scenario.replica_ranks)) if self.profile.replica else lost

    @property
    def seconds(self) -> float:
        return self.scenario.job_hours * HOUR


def plan(profile: Profile, scenario: Scenario, costs: Costs) -> Plan:
    """Evaluate ``costs`` at the scenario's size for ``profile``; the checkpoint interval by the scenario's rule
    when it gives none (never shorter than a step or a checkpoint's write)."""
    c = costs.at(scenario.world, scenario.params)
    if not c["step_s"] > 0:
        raise ConfigError("step_s", f"{c['step_s']!r} is not allowed: a failure-free step of seconds > 0")
    rank_rate, node_rate = scenario.failures.rates(scenario.world)
    checkpoint = c["checkpoint_s"] if profile.checkpoints else 0.0
    interval = 0.0
    if profile.checkpoints:
        interval = scenario.interval_s if scenario.interval_s is not None else \
            optimum(scenario.interval_rule, checkpoint, 1.0 / (rank_rate + node_rate))
        interval = max(interval, c["step_s"], c["write_s"] - checkpoint)
    join = c["join_s"] if profile.world is World.REGROW else 0.0
    stall = sum(c[name] for name in profile.stall)
    return Plan(profile, scenario, c["step_s"], stall, join, checkpoint, interval, rank_rate, node_rate,
                c["steps_redone"], c["samples_lost"])
