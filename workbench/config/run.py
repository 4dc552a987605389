"""Run configuration: :class:`RunConfig`, its validation, and the ways to build it.

A :class:`RunConfig` is built from keyword arguments, from a dict (papermill parameters) or from a YAML file.
Every check runs in ``__post_init__``, so a bad value raises :class:`~workbench.base.errors.ConfigError` naming the
field and what is allowed before any rank process starts.

The fault plan's entries (:class:`~workbench.faults.spec.FaultSpec`, :class:`~workbench.faults.spec.RandomFailures`)
live in :mod:`workbench.faults.spec`, user models and datasets named by import path in
:mod:`workbench.base.callables`; both are re-exported here.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from workbench import strategies
from workbench.base import modes
from workbench.base.callables import IMPORT_PATH, resolve_callable
from workbench.base.errors import ConfigError, ProtocolError
from workbench.base.hosts_file import check_hosts
from workbench.base.types import as_floats, coerce_types
from workbench.config import devices
from workbench.config.files import missing_checkpoint, read_settings
from workbench.config.lr_schedule import SCHEDULES as LR_SCHEDULES
from workbench.config.resize_rule import check as check_rule
from workbench.config.resizing import MAX_WORLD_SIZE, check_notice, check_world
from workbench.faults import kinds
from workbench.faults.slow import check_straggler_settings
from workbench.faults.spec import DISTRIBUTIONS, FAULT_KINDS, FLIP_TARGETS, FaultSpec, RandomFailures, parse_fault
from workbench.workloads import registry
from workbench.workloads.dataset_files import AUGMENTS, check_dataset

# the models and datasets allowed are the workloads registry's as it stands (registry.model_names, dataset_forms)
__all__ = ["AUGMENTS", "DETECTORS", "DISTRIBUTIONS", "FAULT_KINDS", "FLIP_TARGETS", "LR_SCHEDULES", "MAX_WORLD_SIZE",
           "OPTIMIZERS", "PARALLELISMS", "PARALLEL_STRATEGIES", "REGROW_STRATEGIES", "SHUFFLES", "SPAWNS", "STRATEGIES",
           "FaultSpec", "RandomFailures", "RunConfig", "parse_fault", "resolve_callable"]

OPTIMIZERS = ("sgd", "adam")
STRATEGIES = strategies.NAMES  # workbench/strategies/registry.py: one object per name
REGROW_STRATEGIES = strategies.regrowing()
DETECTORS = ("fingerprint", "guard", "spike")
PARALLELISMS = modes.NAMES  # workbench/base/modes.py: one object per mode
SHUFFLES = ("ring", "none")
SPAWNS = ("template", "fresh")
PARALLEL_STRATEGIES = {m.name: tuple(filter(m.allows, STRATEGIES)) for m in modes.REGISTRY.values()}  # per mode
# settings whose default follows from others (None: derived in __post_init__ or by preflight.prepare), and what
# each follows from: RunConfig.overridden derives one again when an override changes what it follows from
DERIVED = {"warm_spares": ("regrow", "strategy"), "checkpoint_every": ("strategy",), "spawn": ("strategy",),
           "pipeline_stages": ("parallelism", "world_size"), "bind": ("hosts",),
           "stage_cuts": ("parallelism", "world_size", "pipeline_stages", "model", "hidden", "width", "dataset")}


@dataclass
class RunConfig:
    """Everything that defines a run; each field's meaning, allowed values and flag: :mod:`workbench.config.fields`."""

    world_size: int = 4
    steps: int = 300
    batch_size: int = 64
    lr: float = 0.05
    lr_schedule: str = "constant"  # workbench.config.lr_schedule: constant, cosine, step
    optimizer: str = "sgd"
    momentum: float = 0.9
    model: str = "mlp"
    hidden: list[int] = field(default_factory=lambda: [128, 64])
    width: float = 1.0
    dataset: str = "digits"
    synthetic_size: int = 4096
    augment: str = "none"
    seed: int = 0
    strategy: str = "none"
    regrow: bool = False
    warm_spares: int | None = None
    checkpoint_every: int | None = None
    resume: str | None = None
    resume_verify: bool = True
    eval_interval: int = 25
    detect: list[str] = field(default_factory=list)
    detect_every: int = 10
    guard_limit: float = 1e4
    spike_factor: float = 10.0
    faults: list[FaultSpec | RandomFailures] = field(default_factory=list)
    parallelism: str = "data"
    micro_batches: int = 4
    pipeline_stages: int | None = None
    stage_cuts: list[int] | None = None
    gossip_sync: bool = False
    shuffle: str = "ring"
    consensus_every: int = 1
    apoptosis: str | None = None  # canonical "key=value,..." text: the ranks and result files read one rule
    flush_denormal: bool | None = None  # None: flush subnormal floats to zero where apoptosis is on (flushes_denormals)
    bucket_cap_mb: float = 1.0
    buckets: int | None = None
    heartbeat_timeout: float = 2.0
    progress_timeout: float | None = None
    straggler_response: str = "flag"  # workbench.faults.slow: off, flag, drop
    straggler_factor: float = 1.5
    straggler_window: int = 10
    preempt_grace: float = 30.0
    notice_signals: list[str] = field(default_factory=lambda: ["SIGUSR1"])
    resize_rule: str = "keep"  # workbench.config.resize_rule: keep, linear
    startup_timeout: float = 120.0
    spawn: str = "template"
    device: str = "cpu"  # workbench.config.devices: cpu, cuda, auto
    op_timeout: float = 60.0
    speed_probe: bool = False
    hosts: list[dict[str, Any]] | None = None
    bind: str | None = None
    store_port: int = 0

    def _check_optimizer(self) -> None:
        _choice("lr_schedule", self.lr_schedule, LR_SCHEDULES)
        _choice("optimizer", self.optimizer, OPTIMIZERS)
        if not (isinstance(self.momentum, (int, float)) and 0 <= self.momentum < 1):
            raise ConfigError("momentum", f"{self.momentum!r} must be in [0, 1)")

    def __post_init__(self) -> None:
        coerce_types(self)  # a wrong type is named as a type ("must be an integer, got str '4'"), before any value
        self.faults = [parse_fault(f) for f in (self.faults or [])]
        _int_in("world_size", self.world_size, 1, MAX_WORLD_SIZE)
        _int_in("steps", self.steps, 1, 10_000_000)
        _int_in("batch_size", self.batch_size, 1, 1_000_000)
        if self.batch_size < self.world_size:
            raise ConfigError("batch_size", f"{self.batch_size} is smaller than world_size={self.world_size}: the "
                              "global batch is split over the ranks and each needs at least one sample")
        _positive("lr", self.lr)
        self._check_optimizer()
        _choice_or_import("model", self.model, registry.model_names())
        self.hidden = list(self.hidden) if isinstance(self.hidden, (list, tuple)) else self.hidden
        if not (isinstance(self.hidden, list) and self.hidden
                and all(isinstance(h, int) and not isinstance(h, bool) and 1 <= h <= 65536 for h in self.hidden)):
            raise ConfigError("hidden", f"{self.hidden!r} must be a non-empty list of layer widths 1..65536")
        if not (isinstance(self.width, (int, float)) and not isinstance(self.width, bool) and 0 < self.width <= 4):
            raise ConfigError("width", f"{self.width!r} is out of range: allowed numbers in (0, 4]")
        self.dataset = check_dataset(self.dataset, self.augment, self.synthetic_size)  # workloads/dataset_files.py
        _int_in("seed", self.seed, 0, 2**31 - 1)
        _choice("strategy", self.strategy, STRATEGIES)
        _choice("spawn", self.spawn, SPAWNS)
        _int_in("eval_interval", self.eval_interval, 1, 10_000_000)
        if isinstance(self.detect, str):
            self.detect = [d.strip() for d in self.detect.split(",") if d.strip()]
        for detector in self.detect:
            _choice("detect", detector, DETECTORS)
        _int_in("detect_every", self.detect_every, 1, 10_000_000)
        _positive("guard_limit", self.guard_limit)
        _positive("spike_factor", self.spike_factor)
        for name in ("regrow", "gossip_sync", "speed_probe"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(name, f"{getattr(self, name)!r} must be true or false")
        strategy = strategies.get(self.strategy)
        if self.regrow and not strategy.regrow:
            raise ConfigError("regrow", f"combines with {', '.join(REGROW_STRATEGIES)}, not with strategy "
                              f"{self.strategy!r} ({strategy.no_regrow})")
        if self.warm_spares is None:
            self.warm_spares = strategy.default_spares(self.regrow)
        _int_in("warm_spares", self.warm_spares, 0, 16)
        if self.warm_spares and not (self.regrow or strategy.reaction is strategies.Reaction.REPLACE):
            raise ConfigError("warm_spares", "spares replace dead ranks: use them with regrow or a strategy that "
                              f"waits for replacements ({', '.join(strategies.replacing())})")
        if self.checkpoint_every is None:
            self.checkpoint_every = strategy.checkpoint_every
        if self.checkpoint_every is not None:
            _int_in("checkpoint_every", self.checkpoint_every, 1, 10_000_000)
        if self.resume is not None and not Path(self.resume).is_file():
            raise ConfigError("resume", missing_checkpoint(self.resume))
        if self.resume is not None and self.resume_verify:
            from workbench.base.checkpoint import verify

            bad = verify(self.resume)
            if bad:
                raise ConfigError("resume", f"checkpoint {self.resume!r} fails its checksums in {', '.join(bad)} "
                                  "(resume_verify=False / --no-verify resumes from it anyway)")
        self._check_parallelism()
        self._check_apoptosis()
        for name in ("bucket_cap_mb", "heartbeat_timeout", "startup_timeout", "op_timeout"):
            _positive(name, getattr(self, name))
        if self.progress_timeout is not None:
            _positive("progress_timeout", self.progress_timeout)
        check_straggler_settings(self)
        check_notice(self)
        _int_in("buckets", 1 if self.buckets is None else self.buckets, 1, 100_000)
        _int_in("store_port", self.store_port, 0, 65535)
        check_hosts(self)  # hosts and bind
        self._check_peer()
        self.faults = [self._resolve_stage(f) for f in self.faults]
        for fault in self.faults:
            if isinstance(fault, RandomFailures):
                continue
            if fault.rank is not None and fault.rank >= self.world_size:
                raise ConfigError("fault", f"{fault} targets rank {fault.rank} but world_size={self.world_size} "
                                  f"has ranks 0..{self.world_size - 1}")
            if fault.step is not None and fault.step >= self.steps:
                raise ConfigError("fault", f"{fault} is at step {fault.step} but the run has steps 0..{self.steps - 1}")
            if kinds.of(fault).fires is kinds.Fires.BOUNDARY:
                check_world(self, fault.world, str(fault))

    def _check_parallelism(self) -> None:
        _choice("parallelism", self.parallelism, PARALLELISMS)
        devices.check_choice(self)  # which modes run on GPUs
        _choice("shuffle", self.shuffle, SHUFFLES)
        _int_in("consensus_every", self.consensus_every, 1, 10_000_000)
        mode = self.mode
        if mode.check is not None:
            mode.check(self)  # its world size and stages (pipeline_stages derived where it has stages)
        if not mode.staged and self.pipeline_stages is not None:
            raise ConfigError("pipeline_stages", f"applies to parallelism {modes.said(lambda m: m.staged)}, not "
                              f"{mode.name!r}")
        if mode.staged:
            _int_in("micro_batches", self.micro_batches, 1, 4096)
            lane = self.batch_size // self.replicas
            if lane < self.micro_batches:
                raise ConfigError("micro_batches", f"{self.micro_batches} micro-batches do not fit the "
                                  f"{lane} samples each pipeline gets (batch_size {self.batch_size} / "
                                  f"{self.replicas} replicas)")
        self._check_stage_cuts()
        if not mode.allows(self.strategy):
            raise ConfigError("strategy", f"{self.strategy!r} does not apply to parallelism {mode.name!r} "
                              f"({mode.no_strategy}): allowed {', '.join(PARALLEL_STRATEGIES[mode.name])}")
        if not mode.detectors and self.detect:
            raise ConfigError("detect", f"the soft-error detectors watch data-parallel replicas; parallelism "
                              f"{mode.name!r} takes bit flips without detectors (outcomes are classified against a "
                              "golden run)")
        check_rule(self)  # what the rule keeps per rank or per lane (before the planned resizes' checks)

    def _check_stage_cuts(self) -> None:
        """User-given cuts: their count and order here, their range against the model at the start (check_model)."""
        cuts, n = self.stage_cuts, self.pipeline_stages
        if cuts is not None and not self.mode.staged:
            raise ConfigError("stage_cuts", f"applies to parallelism {modes.said(lambda m: m.staged)}, not "
                              f"{self.parallelism!r}")
        if cuts is not None and not (isinstance(cuts, (list, tuple)) and len(cuts) == n - 1 and all(
                type(c) is int for c in cuts) and all(a < b for a, b in zip([0, *cuts], cuts))):
            raise ConfigError("stage_cuts", f"{cuts!r} must be {n - 1} increasing module indices > 0: where stages "
                              f"1..{n - 1} of {n} start")
        self.stage_cuts = None if cuts is None else list(cuts)

    def _check_peer(self) -> None:
        """The peers run the same model and data with their own machinery: only what they have applies."""
        peer = strategies.get(self.strategy).peer
        if peer is None:
            return
        unsupported = {"regrow": self.regrow, "detect": self.detect, "apoptosis": self.apoptosis,
                       "hosts": self.hosts, "resume": self.resume}
        for name, value in unsupported.items():
            if value:
                raise ConfigError("strategy", f"{self.strategy!r} runs the peer system as its users do; {name} is "
                                  "ours and does not apply to it")
        kinds.refuse_on_peer(self.strategy, self.faults)  # which kinds a peer takes: their objects say
        peer.require(self.strategy)
        self.spawn = "fresh"  # what runs: a peer's ranks start as its users' do, never forked by our template

    def _check_apoptosis(self) -> None:
        if self.apoptosis is None or self.apoptosis is False or self.apoptosis == "off":
            self.apoptosis = None
            return
        from workbench.workloads.apoptosis.rule import ApoptosisConfig

        rule = ApoptosisConfig.parse(self.apoptosis)
        self.apoptosis = None if rule is None else str(rule)
        if rule is not None and not self.mode.apoptosis:
            raise ConfigError("apoptosis", f"works with parallelism {modes.said(lambda m: m.apoptosis)} only, not "
                              f"{self.parallelism!r}: removing units changes the shapes every rank holds, which "
                              "pipeline stages and gossip replicas (each with its own parameters) would have to agree "
                              "on first")

    @property
    def flushes_denormals(self) -> bool:
        """Whether the ranks flush subnormal floats to zero: ``flush_denormal`` where set, else when apoptosis is on
        (its fading units leave subnormals behind); a campaign comparing runs with and without apoptosis sets it
        for every arm, so that the flush is not part of the difference measured."""
        return bool(self.apoptosis is not None if self.flush_denormal is None else self.flush_denormal)

    @property
    def apoptosis_rule(self) -> Any:
        """The parsed :class:`~workbench.workloads.apoptosis.rule.ApoptosisConfig`, or None when apoptosis is off."""
        if self.apoptosis is None:
            return None
        from workbench.workloads.apoptosis.rule import ApoptosisConfig

        return ApoptosisConfig.parse(self.apoptosis)

    @property
    def mode(self) -> modes.ParallelMode:
        """The run's parallel mode, the object ``parallelism`` names (:mod:`workbench.base.modes`)."""
        return modes.get(self.parallelism)

    @property
    def replicas(self) -> int:
        """Copies of each pipeline stage: world_size / stages for hybrid, 1 for pipeline, world_size otherwise."""
        if self.mode.staged and self.pipeline_stages:
            return self.world_size // self.pipeline_stages
        return self.world_size

    def stage_of(self, rank: int) -> int:
        """Pipeline stage held by rank number ``rank`` (stable labels: stage s holds ranks s*R .. s*R+R-1; ranks a
        resize added, numbered from world_size on, take the stages in turn)."""
        if not self.mode.staged:
            return 0
        return rank // self.replicas if rank < self.world_size else (rank - self.world_size) % self.pipeline_stages

    def _resolve_stage(self, fault: FaultSpec | RandomFailures) -> FaultSpec | RandomFailures:
        if not isinstance(fault, FaultSpec) or fault.stage is None:
            return fault
        if not self.mode.staged:
            raise ConfigError("fault", f"{fault} names a stage but parallelism {self.parallelism!r} has no stages")
        if fault.stage >= self.pipeline_stages:
            raise ConfigError("fault", f"{fault}: stage {fault.stage} is out of range: the pipeline has stages "
                              f"0..{self.pipeline_stages - 1}")
        if fault.rank is None:
            return dataclasses.replace(fault, rank=fault.stage * self.replicas)
        if fault.rank < self.world_size and self.stage_of(fault.rank) != fault.stage:
            raise ConfigError("fault", f"{fault}: rank {fault.rank} holds stage {self.stage_of(fault.rank)}, "
                              f"not stage {fault.stage}")
        return fault

    # -- building -------------------------------------------------------------------------------------------
    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> RunConfig:
        """Build from a dict (papermill parameters, JSON, YAML); ``fault`` is accepted for ``faults``."""
        values = dict(values)
        if "fault" in values:
            extra = values.pop("fault")
            values["faults"] = list(values.get("faults") or []) + (extra if isinstance(extra, list) else [extra])
        if isinstance(values.get("faults"), str):
            values["faults"] = [values["faults"]] if values["faults"].strip() else []
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - names)
        if unknown:
            raise ConfigError(unknown[0], f"is not a run setting; allowed: {', '.join(sorted(names))}")
        return cls(**as_floats(cls, values))

    @classmethod
    def from_yaml(cls, path: str | Path) -> RunConfig:
        """Build from a YAML file of settings (:func:`workbench.config.files.read_settings`: a key given twice, or
        a file that is not a mapping, is a ConfigError)."""
        return cls.from_dict(read_settings(path))

    def replace(self, **changes: Any) -> RunConfig:
        return dataclasses.replace(self, **changes)

    def overridden(self, **overrides: Any) -> RunConfig:
        """This configuration with ``overrides`` applied and validated again, its derived defaults
        (:data:`DERIVED`) derived again where an override changes what they follow from and does not set them
        itself: ``RunConfig(strategy="shrink").overridden(strategy="checkpoint_restart")`` gets the latter's
        ``checkpoint_every``, not the former's. No overrides: this configuration itself."""
        if not overrides:
            return self
        values = self.to_dict()
        for derived, sources in DERIVED.items():
            if derived not in overrides and any(s in overrides for s in sources):
                values.pop(derived)
        return RunConfig.from_dict({**values, **overrides})

    @property
    def step_faults(self) -> list[FaultSpec]:
        return [f for f in self.faults if isinstance(f, FaultSpec) and f.step is not None] + [
            s for f in self.faults if isinstance(f, RandomFailures) for s in f.slowdowns(self.steps, self.world_size)]

    @property
    def time_faults(self) -> list[FaultSpec]:
        return [f for f in self.faults if isinstance(f, FaultSpec) and f.time is not None]

    @property
    def random_failures(self) -> list[tuple[int, int]]:
        """Every drawn random failure as (step, position among the live ranks), in step order."""
        drawn = [d for f in self.faults if isinstance(f, RandomFailures) for d in f.draw(self.steps, self.world_size)]
        return sorted(drawn)

    def to_dict(self) -> dict[str, Any]:
        values = dataclasses.asdict(self)
        values["faults"] = [str(f) for f in self.faults]
        values["detect"] = list(self.detect)
        return values

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)


def _int_in(name: str, value: Any, low: int, high: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise ConfigError(name, f"{value!r} is out of range: allowed integers {low}..{high}")


def _positive(name: str, value: Any) -> None:
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not value > 0:
        raise ConfigError(name, f"{value!r} must be a number > 0")


def _choice(name: str, value: Any, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ConfigError(name, f"{value!r} is not known: allowed {', '.join(allowed)}")


def _choice_or_import(name: str, value: Any, allowed: tuple[str, ...]) -> None:
    if isinstance(value, str) and value in allowed:
        return
    if isinstance(value, str) and IMPORT_PATH.match(value):
        resolve_callable(name, value)
        return
    raise ConfigError(
        name, f"{value!r} is not known: allowed {', '.join(allowed)} or an import path 'package.module:callable'")


def config_from_wire(values: dict[str, Any]) -> RunConfig:
    """The :class:`~workbench.config.run.RunConfig` of a ``start`` message, as the supervisor checked and completed it
    (``RunConfig.to_dict``): no check runs again, so a rank needs no file that only the supervisor's host has (a
    resume checkpoint is read by the generation's source only, a hosts file was read into ``hosts``)."""
    names = [f.name for f in dataclasses.fields(RunConfig)]
    if set(values) != set(names):
        raise ProtocolError(f"control protocol: the configuration differs from this workbench's RunConfig (missing "
                            f"{sorted(set(names) - set(values))}, unknown {sorted(set(values) - set(names))}): "
                            "another version of the workbench sent it")
    config = object.__new__(RunConfig)  # no __post_init__: the supervisor ran the checks
    for name in names:
        setattr(config, name, values[name])
    config.faults = [parse_fault(f) for f in values["faults"]]
    return config
