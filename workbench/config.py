"""Run configuration and fault plan: dataclasses, validation, and the ways to build them.

A :class:`RunConfig` is built from keyword arguments, from a dict (papermill parameters) or from a YAML file.
Every check runs in ``__post_init__``, so a bad value raises :class:`~workbench.errors.ConfigError` naming the
field and what is allowed before any rank process starts.

Rank numbers in fault plans are the ranks of the initial world. They are stable identities: after a shrink the
survivors keep their numbers, and a replacement rank takes the number of the rank it replaces.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from workbench.errors import ConfigError

MODELS = ("mlp", "cnn")
DATASETS = ("digits", "synthetic")
OPTIMIZERS = ("sgd", "adam")
STRATEGIES = ("none", "checkpoint_restart", "shrink", "rollback", "forward", "reinit", "torchft", "torchrun")
REGROW_STRATEGIES = ("shrink", "rollback", "forward")
DISTRIBUTIONS = ("exponential", "weibull")
FAULT_KINDS = ("kill", "hang", "flip")
FLIP_TARGETS = ("weight", "grad", "grad_local", "activation", "optimizer")
DETECTORS = ("fingerprint", "guard", "spike")
PARALLELISMS = ("data", "pipeline", "gossip", "hybrid")
SHUFFLES = ("ring", "none")
# which recovery strategies mean something in each parallel mode (DESIGN §4, §6; README "Parallel modes")
PARALLEL_STRATEGIES = {
    "data": STRATEGIES,  # the peers (torchft, torchrun: workbench/peers) train data-parallel only
    # a stage's layers live on one rank only: nothing to shrink to, no replica to roll back with
    "pipeline": ("none", "checkpoint_restart", "reinit"),
    # replicas differ by design: there is no collective step to roll back or finish lossily, only survivors
    "gossip": ("none", "checkpoint_restart", "shrink", "reinit"),
    # a replicated stage shrinks inside its stage group; a stage with no replica left needs a restart
    "hybrid": ("none", "checkpoint_restart", "shrink", "reinit"),
}
MAX_WORLD_SIZE = 64
_IMPORT_PATH = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")


@dataclass(frozen=True)
class FaultSpec:
    """One planned fault: ``kind`` hits ``rank`` at training ``step`` or ``time`` seconds after the first step.

    ``kill`` sends SIGKILL, ``hang`` sends SIGSTOP (the rank freezes; only heartbeats can tell). A step fault
    fires inside the rank, in the middle of that step's gradient exchange (just before the rank hands its last
    gradient bucket to the allreduce), so it is exactly reproducible. A time fault is sent by the supervisor.
    """

    kind: str
    rank: int | None  # None only for a flip that names its pipeline ``stage`` instead (resolved by RunConfig)
    step: int | None = None
    time: float | None = None
    # flip only: what is hit (see FLIP_TARGETS), the tensor (a named_parameters() name, or a module name for
    # activations), the flat element index and the LSB-0 bit; index/bit left out are drawn from seed
    target: str | None = None
    tensor: str | None = None
    index: int | None = None
    bit: int | None = None
    seed: int | None = None
    stage: int | None = None  # pipeline/hybrid flips: the stage hit (its first replica unless rank= is given)

    def __post_init__(self) -> None:
        if self.kind not in FAULT_KINDS:
            raise ConfigError("fault", f"kind {self.kind!r} is not known: allowed {', '.join(FAULT_KINDS)}, random")
        if self.kind == "flip":
            if self.target not in FLIP_TARGETS:
                raise ConfigError("fault", f"flip target={self.target!r} is not known: "
                                  f"allowed {', '.join(FLIP_TARGETS)}")
            if not self.tensor and not (self.target == "activation" and self.stage is not None):
                raise ConfigError("fault", "flip needs tensor=NAME (a parameter name from named_parameters(), "
                                  "or a module name for target=activation; with stage=S an activation flip "
                                  "defaults to the activation stage S sends to the next stage)")
            for key in ("index", "bit", "seed", "stage"):
                value = getattr(self, key)
                if value is not None and (not isinstance(value, int) or value < 0):
                    raise ConfigError("fault", f"flip {key}={value!r} must be an integer >= 0")
        elif any(v is not None for v in (self.target, self.tensor, self.index, self.bit, self.seed, self.stage)):
            raise ConfigError("fault", f"{self.kind} takes rank and step or time only")
        if self.rank is None and self.stage is None:
            raise ConfigError("fault", f"{self.kind} names no rank (rank=R)")
        if self.rank is not None and (not isinstance(self.rank, int) or isinstance(self.rank, bool) or self.rank < 0):
            raise ConfigError("fault", f"rank={self.rank!r} must be an integer >= 0")
        if (self.step is None) == (self.time is None):
            raise ConfigError("fault", f"{self.kind}:rank={self.rank} needs exactly one of step=N or time=SECONDS")
        next_step = self.kind == "flip" and self.step == -1  # a live flip: at the rank's next step
        if self.step is not None and not next_step and (not isinstance(self.step, int) or self.step < 0):
            raise ConfigError("fault", f"step={self.step!r} must be an integer >= 0")
        if self.time is not None and not (isinstance(self.time, (int, float)) and self.time >= 0):
            raise ConfigError("fault", f"time={self.time!r} must be a number of seconds >= 0")

    @classmethod
    def parse(cls, text: str) -> FaultSpec:
        """Parse the CLI form ``kind:key=value,...``, e.g. ``kill:rank=2,step=50`` or ``hang:rank=1,time=3.5``."""
        kind, sep, rest = text.strip().partition(":")
        if not sep or not rest:
            raise ConfigError("fault", f"{text!r} is not of the form kind:rank=R,step=S (or time=T)")
        values: dict[str, Any] = {}
        for item in rest.split(","):
            key, eq, value = item.partition("=")
            key = key.strip()
            allowed = ("rank", "step", "time", "target", "tensor", "index", "bit", "seed", "stage")
            if not eq or key not in allowed or (kind.strip() != "flip" and key not in allowed[:3]):
                raise ConfigError("fault", f"{item!r} in {text!r} is not one of rank=R, step=S, time=T"
                                  + (", target=, tensor=, index=, bit=, seed=, stage=" if kind.strip() == "flip"
                                     else ""))
            try:
                values[key] = float(value) if key == "time" else value.strip() if key in ("target", "tensor") \
                    else int(value)
            except ValueError:
                raise ConfigError("fault", f"{key}={value!r} in {text!r} is not a number") from None
        if "rank" not in values and "stage" not in values:
            raise ConfigError("fault", f"{text!r} names no rank (rank=R)")
        values.setdefault("rank", None)
        return cls(kind=kind.strip(), **values)

    @classmethod
    def coerce(cls, value: Any) -> FaultSpec:
        if isinstance(value, FaultSpec):
            return value
        if isinstance(value, str):
            return cls.parse(value)
        if isinstance(value, dict):
            try:
                return cls(**value)
            except TypeError as exc:
                raise ConfigError("fault", f"{value!r}: {exc}") from None
        raise ConfigError("fault", f"{value!r} is neither a 'kind:rank=R,step=S' string nor a dict")

    def __str__(self) -> str:
        where = f"step={self.step}" if self.step is not None else f"time={self.time:g}"
        extra = "".join(f",{k}={getattr(self, k)}" for k in ("target", "tensor", "index", "bit", "seed", "stage")
                        if getattr(self, k) is not None)
        who = f"rank={self.rank}," if self.rank is not None else ""
        return f"{self.kind}:{who}{where}{extra}"


@dataclass(frozen=True)
class RandomFailures:
    """A failure process (the ANL failure-simulation framework): up to ``max`` kills of random ranks, with gaps
    in steps drawn from an exponential or Weibull distribution of mean ``mtbf_steps``. Everything is drawn from
    ``seed`` up front, so the same seed gives the same failures; a drawn failure names a position in the
    generation it lands in (``k``-th live rank), so it always hits a live rank."""

    mtbf_steps: float
    dist: str = "exponential"
    shape: float = 1.5
    seed: int = 0
    max: int = 3

    def __post_init__(self) -> None:
        if not (isinstance(self.mtbf_steps, (int, float)) and self.mtbf_steps >= 1):
            raise ConfigError("fault", f"random: mtbf_steps={self.mtbf_steps!r} must be a number >= 1")
        if self.dist not in DISTRIBUTIONS:
            raise ConfigError("fault", f"random: dist={self.dist!r} is not known: allowed {', '.join(DISTRIBUTIONS)}")
        if not (isinstance(self.shape, (int, float)) and self.shape > 0):
            raise ConfigError("fault", f"random: shape={self.shape!r} must be > 0")
        if not isinstance(self.max, int) or not 0 <= self.max <= 1000:
            raise ConfigError("fault", f"random: max={self.max!r} must be an integer 0..1000")

    @classmethod
    def parse(cls, text: str) -> RandomFailures:
        _, _, rest = text.partition(":")
        values: dict[str, Any] = {}
        types = {"mtbf_steps": float, "dist": str, "shape": float, "seed": int, "max": int}
        for item in filter(None, rest.split(",")):
            key, eq, value = item.partition("=")
            key = key.strip()
            if not eq or key not in types:
                raise ConfigError("fault", f"{item!r} in {text!r} is not one of {', '.join(f'{k}=' for k in types)}")
            try:
                values[key] = types[key](value.strip())
            except ValueError:
                raise ConfigError("fault", f"{key}={value!r} in {text!r} is not a {types[key].__name__}") from None
        if "mtbf_steps" not in values:
            raise ConfigError("fault", f"{text!r} needs mtbf_steps=M")
        return cls(**values)

    def draw(self, steps: int, world_size: int) -> list[tuple[int, int]]:
        """(step, position among the live ranks) of each failure, in step order, within ``1..steps-1``."""
        import numpy as np

        rng = np.random.default_rng(self.seed)
        failures, at = [], 0.0
        for _ in range(self.max):
            if self.dist == "exponential":
                gap = rng.exponential(self.mtbf_steps)
            else:  # Weibull with the given shape, scaled to the requested mean
                gap = self.mtbf_steps / math.gamma(1 + 1 / self.shape) * rng.weibull(self.shape)
            at += max(gap, 1.0)
            if at >= steps:
                break
            failures.append((int(at), int(rng.integers(world_size))))
        return failures

    def __str__(self) -> str:
        return (f"random:mtbf_steps={self.mtbf_steps:g},dist={self.dist},shape={self.shape:g},seed={self.seed},"
                f"max={self.max}")


def parse_fault(value: Any) -> FaultSpec | RandomFailures:
    if isinstance(value, (FaultSpec, RandomFailures)):
        return value
    if isinstance(value, str) and value.strip().startswith("random:"):
        return RandomFailures.parse(value.strip())
    if isinstance(value, dict) and value.get("kind") == "random":
        return RandomFailures(**{k: v for k, v in value.items() if k != "kind"})
    return FaultSpec.coerce(value)


@dataclass
class RunConfig:
    """Everything that defines a run. ``batch_size`` is the global mini-batch, split over the live ranks."""

    world_size: int = 4
    steps: int = 300
    batch_size: int = 64
    lr: float = 0.05
    optimizer: str = "sgd"
    momentum: float = 0.9
    model: str = "mlp"
    hidden: list[int] = field(default_factory=lambda: [128, 64])  # widths of the MLP's hidden layers
    dataset: str = "digits"
    synthetic_size: int = 4096
    seed: int = 0
    strategy: str = "none"
    regrow: bool = False
    warm_spares: int | None = None  # default: 1 with regrow or reinit (a replacement then costs no start-up)
    checkpoint_every: int | None = None
    resume: str | None = None
    resume_verify: bool = True  # check the checkpoint's checksums first (off: study an altered checkpoint)
    eval_interval: int = 25
    detect: list[str] = field(default_factory=list)  # soft-error detectors: fingerprint, guard, spike
    detect_every: int = 10  # steps between fingerprints and verified in-memory snapshots
    guard_limit: float = 1e4  # |weight|, |gradient| or |loss| beyond this counts as corrupt
    spike_factor: float = 10.0  # a loss this many times the recent median counts as a spike
    faults: list[FaultSpec | RandomFailures] = field(default_factory=list)
    parallelism: str = "data"  # data, pipeline (one stage per rank), gossip (GossipGraD), hybrid (stages x replicas)
    micro_batches: int = 4  # pipeline/hybrid: micro-batches per step (GPipe)
    pipeline_stages: int | None = None  # hybrid: number of stages (default 2); pipeline: world_size
    gossip_sync: bool = False  # gossip: blocking exchange after the update instead of overlapping the step
    shuffle: str = "ring"  # gossip: ring sample shuffle between neighbours, or none (fixed local partitions)
    consensus_every: int = 1  # gossip: steps between measurements of the consensus distance (a measurement only)
    # adaptive neuron apoptosis (workbench/apoptosis.py): None/"off", "on" (tuned defaults) or "tol=..,window=..";
    # kept as the canonical "key=value,..." text of every setting so ranks and result files read the same rule
    apoptosis: str | None = None
    bucket_cap_mb: float = 1.0
    heartbeat_timeout: float = 2.0
    startup_timeout: float = 120.0
    # how rank processes start: forked by this process's rank template (milliseconds; workbench/template.py)
    # or as fresh interpreters (each imports torch, ~1.1 s)
    spawn: str = "template"
    op_timeout: float = 60.0
    # where the ranks live (workbench/hosts.py): None = every rank on this machine; else hosts in file order
    hosts: list[dict[str, Any]] | None = None
    bind: str | None = None  # address of the store and control server; default the first host's, or 127.0.0.1
    store_port: int = 0  # 0: any free port (ranks started elsewhere need a known one: workbench rank --store)

    def __post_init__(self) -> None:
        self.faults = [parse_fault(f) for f in (self.faults or [])]
        _int_in("world_size", self.world_size, 1, MAX_WORLD_SIZE)
        _int_in("steps", self.steps, 1, 10_000_000)
        _int_in("batch_size", self.batch_size, 1, 1_000_000)
        if self.batch_size < self.world_size:
            raise ConfigError(
                "batch_size", f"{self.batch_size} is smaller than world_size={self.world_size}: "
                "the global batch is split over the ranks and each needs at least one sample")
        _positive("lr", self.lr)
        _choice("optimizer", self.optimizer, OPTIMIZERS)
        if not (isinstance(self.momentum, (int, float)) and 0 <= self.momentum < 1):
            raise ConfigError("momentum", f"{self.momentum!r} must be in [0, 1)")
        _choice_or_import("model", self.model, MODELS)
        self.hidden = list(self.hidden) if isinstance(self.hidden, (list, tuple)) else self.hidden
        if not (isinstance(self.hidden, list) and self.hidden
                and all(isinstance(h, int) and not isinstance(h, bool) and 1 <= h <= 65536 for h in self.hidden)):
            raise ConfigError("hidden", f"{self.hidden!r} must be a non-empty list of layer widths 1..65536")
        _choice_or_import("dataset", self.dataset, DATASETS)
        _int_in("synthetic_size", self.synthetic_size, 16, 100_000_000)
        _int_in("seed", self.seed, 0, 2**31 - 1)
        _choice("strategy", self.strategy, STRATEGIES)
        _choice("spawn", self.spawn, ("template", "fresh"))
        _int_in("eval_interval", self.eval_interval, 1, 10_000_000)
        if isinstance(self.detect, str):
            self.detect = [d.strip() for d in self.detect.split(",") if d.strip()]
        for detector in self.detect:
            _choice("detect", detector, DETECTORS)
        _int_in("detect_every", self.detect_every, 1, 10_000_000)
        _positive("guard_limit", self.guard_limit)
        _positive("spike_factor", self.spike_factor)
        if not isinstance(self.regrow, bool):
            raise ConfigError("regrow", f"{self.regrow!r} must be true or false")
        if self.regrow and self.strategy not in REGROW_STRATEGIES:
            why = ("it recovers by its own means" if self.strategy in ("torchft", "torchrun") else
                   "it restarts ranks itself" if self.strategy in ("reinit", "checkpoint_restart") else "no recovery")
            raise ConfigError("regrow", f"combines with {', '.join(REGROW_STRATEGIES)}, not with strategy "
                              f"{self.strategy!r} ({why})")
        if self.warm_spares is None:
            self.warm_spares = 1 if self.regrow or self.strategy == "reinit" else 0
        _int_in("warm_spares", self.warm_spares, 0, 16)
        if self.warm_spares and not (self.regrow or self.strategy == "reinit"):
            raise ConfigError("warm_spares", "spares replace dead ranks: use them with regrow or strategy 'reinit'")
        if self.checkpoint_every is None and self.strategy in ("checkpoint_restart", "reinit", "torchrun"):
            self.checkpoint_every = 25
        if self.checkpoint_every is not None:
            _int_in("checkpoint_every", self.checkpoint_every, 1, 10_000_000)
        if self.resume is not None and not Path(self.resume).is_file():
            raise ConfigError("resume", f"checkpoint {self.resume!r} does not exist")
        if self.resume is not None and self.resume_verify:
            from workbench.checkpoint import verify

            bad = verify(self.resume)
            if bad:
                raise ConfigError("resume", f"checkpoint {self.resume!r} fails its checksums in {', '.join(bad)} "
                                  "(resume_verify=False / --no-verify resumes from it anyway)")
        self._check_parallelism()
        self._check_apoptosis()
        _positive("bucket_cap_mb", self.bucket_cap_mb)
        _positive("heartbeat_timeout", self.heartbeat_timeout)
        _positive("startup_timeout", self.startup_timeout)
        _positive("op_timeout", self.op_timeout)
        self._check_hosts()
        self._check_peer()
        self.faults = [self._resolve_stage(f) for f in self.faults]
        for fault in self.faults:
            if isinstance(fault, RandomFailures):
                continue
            if fault.rank >= self.world_size:
                raise ConfigError(
                    "fault", f"{fault} targets rank {fault.rank} but world_size={self.world_size} "
                    f"has ranks 0..{self.world_size - 1}")
            if fault.step is not None and fault.step >= self.steps:
                raise ConfigError("fault", f"{fault} is at step {fault.step} but the run has steps 0..{self.steps - 1}")

    def _check_parallelism(self) -> None:
        _choice("parallelism", self.parallelism, PARALLELISMS)
        _choice("shuffle", self.shuffle, SHUFFLES)
        _int_in("consensus_every", self.consensus_every, 1, 10_000_000)
        if not isinstance(self.gossip_sync, bool):
            raise ConfigError("gossip_sync", f"{self.gossip_sync!r} must be true or false")
        mode = self.parallelism
        if mode == "gossip" and (self.world_size < 2 or self.world_size & (self.world_size - 1)):
            raise ConfigError("world_size", f"{self.world_size} is not a power of two: parallelism 'gossip' pairs "
                              "rank r with rank r XOR 2^h (GossipGraD's hypercube); use 2, 4, 8, 16, 32 or 64")
        if mode == "pipeline":
            if self.pipeline_stages not in (None, self.world_size):
                raise ConfigError("pipeline_stages", f"{self.pipeline_stages} != world_size={self.world_size}: "
                                  "a pipeline has one stage per rank (replicated stages: parallelism 'hybrid')")
            self.pipeline_stages = self.world_size
            if self.world_size < 2:
                raise ConfigError("world_size", "parallelism 'pipeline' needs at least 2 ranks (one stage each)")
        elif mode == "hybrid":
            if self.pipeline_stages is None:
                self.pipeline_stages = 2
            _int_in("pipeline_stages", self.pipeline_stages, 2, MAX_WORLD_SIZE)
            if self.world_size % self.pipeline_stages or self.world_size == self.pipeline_stages:
                raise ConfigError("pipeline_stages", f"{self.pipeline_stages} stages do not replicate over "
                                  f"world_size={self.world_size}: hybrid needs world_size = stages x replicas with "
                                  "at least 2 replicas (one replica per stage: parallelism 'pipeline')")
        elif self.pipeline_stages is not None:
            raise ConfigError("pipeline_stages", f"applies to parallelism 'hybrid' or 'pipeline', not {mode!r}")
        if mode in ("pipeline", "hybrid"):
            _int_in("micro_batches", self.micro_batches, 1, 4096)
            lane = self.batch_size // self.replicas
            if lane < self.micro_batches:
                raise ConfigError("micro_batches", f"{self.micro_batches} micro-batches do not fit the "
                                  f"{lane} samples each pipeline gets (batch_size {self.batch_size} / "
                                  f"{self.replicas} replicas)")
        allowed = PARALLEL_STRATEGIES[mode]
        if self.strategy not in allowed:
            why = {"pipeline": "a dead stage cannot be shrunk away or rolled back: no other rank holds its layers",
                   "gossip": "gossip has no collective step to roll back or finish lossily",
                   "hybrid": "a stage's replicas shrink; rollback/forward are data-parallel strategies"}[mode]
            raise ConfigError("strategy", f"{self.strategy!r} does not apply to parallelism {mode!r} ({why}): "
                              f"allowed {', '.join(allowed)}")
        if mode != "data" and self.detect:
            raise ConfigError("detect", f"the soft-error detectors watch data-parallel replicas; parallelism {mode!r} "
                              "takes bit flips without detectors (outcomes are classified against a golden run)")

    def _check_peer(self) -> None:
        """The peers run the same model and data with their own machinery: only what they have applies."""
        from workbench.peers import PEER_STRATEGIES, require_torchft

        if self.strategy not in PEER_STRATEGIES:
            return
        unsupported = {"regrow": self.regrow, "detect": self.detect, "apoptosis": self.apoptosis,
                       "hosts": self.hosts, "resume": self.resume,
                       "flip faults": [f for f in self.faults if isinstance(f, FaultSpec) and f.kind == "flip"]}
        for name, value in unsupported.items():
            if value:
                raise ConfigError("strategy", f"{self.strategy!r} runs the peer system as its users do; {name} is "
                                  "ours and does not apply to it")
        if self.parallelism != "data":
            raise ConfigError("strategy", f"{self.strategy!r} trains data-parallel only, not {self.parallelism!r}")
        if self.strategy == "torchft":
            require_torchft()

    def _check_hosts(self) -> None:
        from workbench.hosts import Host, check_address

        _int_in("store_port", self.store_port, 0, 65535)
        if self.hosts is None:
            self.bind = check_address("bind", self.bind or "127.0.0.1")
            return
        if not isinstance(self.hosts, (list, tuple)) or not self.hosts:
            raise ConfigError("hosts", f"{self.hosts!r} must be a non-empty list of hosts (first: this machine)")
        hosts = [Host.coerce(h, first=i == 0) for i, h in enumerate(self.hosts)]
        slots = sum(h.slots for h in hosts)
        if slots != self.world_size:
            raise ConfigError("hosts", f"the hosts hold {slots} ranks but world_size={self.world_size}: give each "
                              "rank a slot (one line per host: ADDRESS SLOTS [LAUNCH ...])")
        self.hosts = [h.to_dict() for h in hosts]
        self.bind = check_address("bind", self.bind or hosts[0].address)
        if self.bind != hosts[0].address:
            raise ConfigError("bind", f"{self.bind} is not the first host's address {hosts[0].address}: the first "
                              "host is this machine, where the store and control server listen")

    def _check_apoptosis(self) -> None:
        if self.apoptosis is None or self.apoptosis is False or self.apoptosis == "off":
            self.apoptosis = None
            return
        from workbench.apoptosis import ApoptosisConfig

        rule = ApoptosisConfig.parse(self.apoptosis)
        self.apoptosis = None if rule is None else str(rule)
        if rule is not None and self.parallelism != "data":
            raise ConfigError("apoptosis", f"works with parallelism 'data' only, not {self.parallelism!r}: removing "
                              "units changes the shapes every rank holds, which pipeline stages and gossip replicas "
                              "(each with its own parameters) would have to agree on first")

    @property
    def apoptosis_rule(self) -> Any:
        """The parsed :class:`~workbench.apoptosis.ApoptosisConfig`, or None when apoptosis is off."""
        if self.apoptosis is None:
            return None
        from workbench.apoptosis import ApoptosisConfig

        return ApoptosisConfig.parse(self.apoptosis)

    @property
    def replicas(self) -> int:
        """Copies of each pipeline stage: world_size / stages for hybrid, 1 for pipeline, world_size otherwise."""
        if self.parallelism in ("pipeline", "hybrid") and self.pipeline_stages:
            return self.world_size // self.pipeline_stages
        return self.world_size

    def stage_of(self, rank: int) -> int:
        """Pipeline stage held by rank number ``rank`` (stable labels: stage s holds ranks s*R .. s*R+R-1)."""
        return rank // self.replicas if self.parallelism in ("pipeline", "hybrid") else 0

    def _resolve_stage(self, fault: FaultSpec | RandomFailures) -> FaultSpec | RandomFailures:
        if not isinstance(fault, FaultSpec) or fault.stage is None:
            return fault
        if self.parallelism not in ("pipeline", "hybrid"):
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
        for f in dataclasses.fields(cls):
            if f.name in values and f.type in ("float", float) and isinstance(values[f.name], int):
                values[f.name] = float(values[f.name])
        return cls(**values)

    @classmethod
    def from_yaml(cls, path: str | Path) -> RunConfig:
        import yaml

        path = Path(path)
        try:
            values = yaml.safe_load(path.read_text())
        except FileNotFoundError:
            raise ConfigError("config", f"file {str(path)!r} does not exist") from None
        except yaml.YAMLError as exc:
            raise ConfigError("config", f"{str(path)!r} is not valid YAML: {str(exc).splitlines()[0]}") from None
        if values is None:
            values = {}
        if not isinstance(values, dict):
            raise ConfigError("config", f"{str(path)!r} must hold a mapping of run settings")
        return cls.from_dict(values)

    def replace(self, **changes: Any) -> RunConfig:
        return dataclasses.replace(self, **changes)

    @property
    def step_faults(self) -> list[FaultSpec]:
        return [f for f in self.faults if isinstance(f, FaultSpec) and f.step is not None]

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


def resolve_callable(field_name: str, path: str) -> Callable[..., Any]:
    """Import ``package.module:callable`` (attribute chains allowed) or raise a ConfigError saying why not."""
    module_name, _, attr = path.partition(":")
    try:
        obj: Any = importlib.import_module(module_name)
    except Exception as exc:  # noqa: BLE001 - any import failure is the user's to see, in one line
        raise ConfigError(field_name, f"cannot import module {module_name!r}: {type(exc).__name__}: {exc}") from None
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ConfigError(field_name, f"module {module_name!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise ConfigError(field_name, f"{path!r} is not callable")
    return obj


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
    if isinstance(value, str) and _IMPORT_PATH.match(value):
        resolve_callable(name, value)
        return
    raise ConfigError(
        name, f"{value!r} is not known: allowed {', '.join(allowed)} or an import path 'package.module:callable'")
