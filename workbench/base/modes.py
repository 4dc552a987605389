"""Parallel modes: one frozen :class:`ParallelMode` per way of spreading training over the ranks (``parallelism``).

A mode says everything the rest of the code asks of it: its rank trainer, whether it cuts the model into pipeline
stages and replicates them over lanes, how its ranks pair and read their samples, whether and how its world may be
resized, and the strategies, detectors, apoptosis and devices it allows; its own checks are functions held by the
object. ``RunConfig.mode`` is the run's object: code asks it, never compares the name. Adding a mode is one object
here plus its trainer (docs/parallel-modes.md, "Adding a parallel mode").
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from workbench.base.errors import ConfigError

MAX_WORLD_SIZE = 64  # the most ranks a run may have, at its start and after any resize


@dataclass(frozen=True)
class ParallelMode:
    """One parallel mode."""

    name: str
    summary: str  # one line: how it spreads training
    trainer: str  # "module:Class", the rank trainer; imported in the rank process only (workbench.rank.main)
    staged: bool = False  # the model is cut into pipeline stages (stage_cuts, micro_batches, pipeline_stages)
    lanes: bool = False  # the stages are replicated over lanes: a stage's replicas regroup, a resize moves whole lanes
    hypercube: bool = False  # rank r pairs with rank r XOR 2^h: a world that is no power of two leaves slots empty
    partitions: bool = False  # each rank steps on its own batch from its own partition, not the shared sample stream
    strategies: tuple[str, ...] | None = None  # the recovery strategies it allows, by name; None: every one
    no_strategy: str = ""  # why a strategy it does not allow does not apply
    detectors: bool = False  # the soft-error detectors watch its replicas
    apoptosis: bool = False  # apoptosis may remove units (every rank holds the same shapes)
    gpus: bool = False  # its ranks may run on GPUs (--device cuda|auto)
    check: Callable[[Any], None] | None = None  # its own checks of world_size and pipeline_stages (may derive them)
    check_resize: Callable[[Any, int, str], None] | None = None  # its own checks of a world size to resize to
    no_resize: str | None = None  # why its world is never resized; None: it may be

    @property
    def resizes(self) -> bool:
        """Its world may be resized at a step boundary (``resize:world=N``, a shrink of a preemption)."""
        return self.no_resize is None

    def allows(self, strategy: str) -> bool:
        """The strategy named ``strategy`` applies to it."""
        return self.strategies is None or strategy in self.strategies


def _power_of_two(n: int) -> bool:
    return n >= 2 and not n & (n - 1)


def _check_hypercube(config: Any) -> None:
    if not _power_of_two(config.world_size):
        raise ConfigError("world_size", f"{config.world_size} is not a power of two: parallelism 'gossip' pairs rank "
                          "r with rank r XOR 2^h (GossipGraD's hypercube); use 2, 4, 8, 16, 32 or 64")


def _resize_hypercube(config: Any, n: int, what: str) -> None:
    if not _power_of_two(n):
        raise ConfigError("fault", f"{what}: {n} is not a power of two; parallelism 'gossip' pairs rank r with "
                          "r XOR 2^h: allowed 2, 4, 8, 16, 32 or 64")


def _check_pipeline(config: Any) -> None:
    """One stage per rank: ``pipeline_stages`` is ``world_size``, at least 2."""
    if config.pipeline_stages not in (None, config.world_size):
        raise ConfigError("pipeline_stages", f"{config.pipeline_stages} != world_size={config.world_size}: "
                          "a pipeline has one stage per rank (replicated stages: parallelism 'hybrid')")
    config.pipeline_stages = config.world_size
    if config.world_size < 2:
        raise ConfigError("world_size", "parallelism 'pipeline' needs at least 2 ranks (one stage each)")


def _check_lanes(config: Any) -> None:
    """``pipeline_stages`` (default 2) replicated over at least 2 lanes: world_size = stages x lanes."""
    if config.pipeline_stages is None:
        config.pipeline_stages = 2
    stages = config.pipeline_stages
    if not isinstance(stages, int) or isinstance(stages, bool) or not 2 <= stages <= MAX_WORLD_SIZE:
        raise ConfigError("pipeline_stages", f"{stages!r} is out of range: allowed integers 2..{MAX_WORLD_SIZE}")
    if config.world_size % stages or config.world_size == stages:
        raise ConfigError("pipeline_stages", f"{stages} stages do not replicate over world_size={config.world_size}: "
                          "hybrid needs world_size = stages x replicas with at least 2 replicas (one replica per "
                          "stage: parallelism 'pipeline')")


def _resize_lanes(config: Any, n: int, what: str) -> None:
    stages = config.pipeline_stages
    if n % stages:
        raise ConfigError("fault", f"{what}: {n} is not a multiple of the {stages} pipeline stages: a hybrid run "
                          "grows and shrinks by whole lanes (one replica of every stage)")
    if config.resize_rule == "keep" and config.batch_size // (n // stages) < config.micro_batches:
        raise ConfigError("fault", f"{what}: {n // stages} lanes leave fewer samples per lane than "
                          f"micro_batches={config.micro_batches}")


# the strategies a mode without the data-parallel collective step allows: no other rank holds a pipeline stage's
# layers, and nothing can roll back or finish lossily a step that no allreduce joins
_STAGE_STRATEGIES = ("none", "checkpoint_restart", "reinit")
_REPLICA_STRATEGIES = ("none", "checkpoint_restart", "shrink", "reinit")

DATA = ParallelMode("data", "every rank a replica, bucketed allreduce", "workbench.rank.replicated:Trainer",
                    no_strategy="it is not a data-parallel strategy", detectors=True, apoptosis=True, gpus=True)
PIPELINE = ParallelMode(
    "pipeline", "a stage per rank (GPipe)", "workbench.rank.pipeline:PipelineTrainer", staged=True,
    strategies=_STAGE_STRATEGIES,
    no_strategy="a dead stage cannot be shrunk away or rolled back: no other rank holds its layers",
    check=_check_pipeline, no_resize="a pipeline run has one rank per stage")
GOSSIP = ParallelMode(
    "gossip", "GossipGraD: one partner per step, no allreduce", "workbench.rank.gossip:GossipTrainer",
    hypercube=True, partitions=True, strategies=_REPLICA_STRATEGIES,
    no_strategy="gossip has no collective step to roll back or finish lossily", check=_check_hypercube,
    check_resize=_resize_hypercube)
HYBRID = ParallelMode(
    "hybrid", "replicated stages", "workbench.rank.pipeline:PipelineTrainer", staged=True, lanes=True,
    strategies=_REPLICA_STRATEGIES,
    no_strategy="a stage's replicas shrink; rollback/forward are data-parallel strategies", check=_check_lanes,
    check_resize=_resize_lanes)

REGISTRY: dict[str, ParallelMode] = {m.name: m for m in (DATA, PIPELINE, GOSSIP, HYBRID)}
NAMES = tuple(REGISTRY)


def get(name: str) -> ParallelMode:
    """The mode named ``name``, or a one-line ConfigError naming the allowed ones."""
    mode = REGISTRY.get(name) if isinstance(name, str) else None
    if mode is None:
        raise ConfigError("parallelism", f"{name!r} is not known: allowed {', '.join(NAMES)}")
    return mode


def said(where: Callable[[ParallelMode], bool], last: str = "or", lanes: str = "") -> str:
    """The modes ``where`` holds for, quoted in name order for a message: ``'hybrid' or 'pipeline'``; ``lanes``
    follows the name of a mode with lanes."""
    names = [repr(m.name) + (lanes if m.lanes else "") for m in sorted(REGISTRY.values(), key=lambda m: m.name)
             if where(m)]
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} {last} {names[-1]}"
