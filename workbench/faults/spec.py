"""The fault plan: planned faults (:class:`FaultSpec`), random failure processes (:class:`RandomFailures`) and
their text forms (``kill:rank=2,step=50``, ``random:mtbf_steps=80,seed=1``).

A fault checks itself in ``__post_init__`` (kind, target, rank, step or time); what depends on the run (the rank
exists, the step is inside the run, a pipeline stage resolves to a rank) is checked by
:class:`~workbench.config.run.RunConfig`, which holds the plan in ``faults``.

Rank numbers in fault plans are the ranks of the initial world. They are stable identities: after a shrink the
survivors keep their numbers, and a replacement rank takes the number of the rank it replaces.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any

from workbench.base.errors import ConfigError
from workbench.faults import kinds
from workbench.faults.kinds import FLIP_TARGETS, Fires
from workbench.faults.kinds import number as _number

DISTRIBUTIONS = ("exponential", "weibull")
FAULT_KINDS = kinds.NAMES  # each kind is one object of workbench/faults/kinds.py: its keys, checks, behaviour
# the keys each kind takes beside rank and step|time (resize names no rank)
KIND_KEYS = {k.name: k.keys for k in kinds.REGISTRY.values() if k.keys}
_FLOAT_KEYS = ("time", "factor", "grace")
RANDOM_KINDS = kinds.RANDOM_NAMES  # what a random process draws
__all__ = ["DEFAULT_GRACE_S", "DISTRIBUTIONS", "FAULT_KINDS", "FLIP_TARGETS", "FaultSpec", "RandomFailures",
           "parse_fault"]
SLOW_FACTOR, SLOW_STEPS = 3.0, 20  # a random slow-down's factor and duration when none is given
DEFAULT_GRACE_S = 30.0  # a preemption notice's lead time when none is given (Kubernetes' default)


@dataclass(frozen=True)
class FaultSpec:
    """One planned fault: ``kind`` hits ``rank`` at training ``step`` or ``time`` seconds after the first step.

    ``kill`` sends SIGKILL, ``hang`` sends SIGSTOP (the rank freezes; only heartbeats can tell), ``stall`` blocks
    the rank's training thread while its heartbeat goes on (only the progress watchdog can tell). ``slow`` makes
    the rank's steps ``factor`` times as long from ``step`` (or ``time``) until ``until`` (same unit; None: to the
    end). ``preempt`` gives the rank notice: ``grace`` seconds to leave at a step boundary. ``resize`` (no rank)
    changes the world to ``world`` ranks at a step boundary. A step fault
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
    factor: float | None = None  # slow: how many times as long each step takes (> 1)
    until: float | None = None  # slow: the step (or time) the slow-down ends at; None: the run's end
    grace: float | None = None  # preempt: seconds of notice (default DEFAULT_GRACE_S)
    world: int | None = None  # resize: the world size from the boundary on
    ms: int | None = None  # delay: milliseconds the rank's messages of that step are held back

    def __post_init__(self) -> None:
        kind = kinds.get(self.kind)
        extra = [k for k in kinds.KEYS if getattr(self, k) is not None and k not in kind.keys]
        if extra:
            takes = ", ".join(f"{k}=" for k in kind.keys)
            base = "rank and step or time" if kind.names_rank else "step or time"
            raise ConfigError("fault", f"{self.kind} takes {base}{' and ' + takes if takes else ' only'}; "
                              f"{extra[0]}= does not apply")
        if kind.check is not None:
            kind.check(self)
        if self.rank is None and self.stage is None and kind.names_rank:
            raise ConfigError("fault", f"{self.kind} names no rank (rank=R)")
        if self.rank is not None and (not isinstance(self.rank, int) or isinstance(self.rank, bool) or self.rank < 0):
            raise ConfigError("fault", f"rank={self.rank!r} must be an integer >= 0")
        if (self.step is None) == (self.time is None):
            who = "" if self.rank is None else f"rank={self.rank}"
            raise ConfigError("fault", f"{self.kind}:{who} needs exactly one of step=N or time=SECONDS")
        next_step = kind.next_step and self.step == -1  # a live flip or stall: at the next step
        if self.step is not None and not next_step and (not isinstance(self.step, int) or self.step < 0):
            raise ConfigError("fault", f"step={self.step!r} must be an integer >= 0")
        if self.time is not None and not _number(self.time, 0):
            raise ConfigError("fault", f"time={self.time!r} must be a number of seconds >= 0")

    @classmethod
    def parse(cls, text: str) -> FaultSpec:
        """Parse the CLI form ``kind:key=value,...``, e.g. ``kill:rank=2,step=50`` or ``hang:rank=1,time=3.5``."""
        kind, sep, rest = text.strip().partition(":")
        if not sep or not rest:
            raise ConfigError("fault", f"{text!r} is not of the form kind:rank=R,step=S (or time=T)")
        values: dict[str, Any] = {}
        kind = kind.strip()
        known = kinds.find(kind)
        allowed = ("rank", "step", "time")[0 if kinds.names_rank(kind) else 1:] + (known.keys if known else ())
        for item in rest.split(","):
            key, eq, value = item.partition("=")
            key = key.strip()
            if not eq or key not in allowed:
                raise ConfigError("fault", f"{item!r} in {text!r} is not one of "
                                  + ", ".join(f"{k}={k[0].upper()}" if k in ("rank", "step", "time") else f"{k}="
                                              for k in allowed))
            if key in values:
                raise ConfigError("fault", f"{key}= is given twice in {text!r}: give each key once")
            try:
                values[key] = float(value) if key in _FLOAT_KEYS else value.strip() if key in ("target", "tensor") \
                    else _int_or_float(value) if key == "until" else int(value)
            except ValueError:
                raise ConfigError("fault", f"{key}={value!r} in {text!r} is not a number") from None
        if "rank" not in values and "stage" not in values and kinds.names_rank(kind):
            raise ConfigError("fault", f"{text!r} names no rank (rank=R)")
        values.setdefault("rank", None)
        return cls(kind=kind, **values)

    @classmethod
    def coerce(cls, value: Any) -> FaultSpec:
        if isinstance(value, FaultSpec):
            return value
        if isinstance(value, str):
            return cls.parse(value)
        if isinstance(value, dict):
            return cls(**_fault_keys(cls, value, "kind", "kind: kill and rank: R"))
        raise ConfigError("fault", f"{value!r} is neither a 'kind:rank=R,step=S' string nor a dict")

    def __str__(self) -> str:
        where = f"step={self.step}" if self.step is not None else f"time={self.time:g}"
        values = [(k, getattr(self, k)) for k in KIND_KEYS.get(self.kind, ()) if getattr(self, k) is not None]
        extra = "".join(f",{k}={v:g}" if isinstance(v, float) else f",{k}={v}" for k, v in values)
        if not kinds.get(self.kind).names_rank:  # resize:world=N,step=S
            return f"{self.kind}:{extra[1:]},{where}"
        who = f"rank={self.rank}," if self.rank is not None else ""
        return f"{self.kind}:{who}{where}{extra}"


def _int_or_float(text: str) -> int | float:
    text = text.strip()
    try:
        return int(text)
    except ValueError:
        return float(text)


@dataclass(frozen=True)
class RandomFailures:
    """A failure process (the ANL failure-simulation framework): up to ``max`` kills of random ranks, with gaps
    in steps drawn from an exponential or Weibull distribution of mean ``mtbf_steps``. Everything is drawn from
    ``seed`` up front, so the same seed gives the same failures; a drawn failure names a position in the
    generation it lands in (``k``-th live rank), so it always hits a live rank. ``kind=slow``: slow-downs instead
    of kills, each of ``factor`` for ``duration`` steps on a rank of the initial world (:meth:`slowdowns`)."""

    mtbf_steps: float
    dist: str = "exponential"
    shape: float = 1.5
    seed: int = 0
    max: int = 3
    kind: str = "kill"
    factor: float | None = None  # slow only (default SLOW_FACTOR)
    duration: int | None = None  # slow only: steps (default SLOW_STEPS)

    def __post_init__(self) -> None:
        if self.kind not in RANDOM_KINDS:
            raise ConfigError("fault", f"random: kind={self.kind!r} is not known: allowed {', '.join(RANDOM_KINDS)}")
        if self._drawn.fires is not Fires.THROTTLE and (self.factor is not None or self.duration is not None):
            raise ConfigError("fault", "random: factor= and duration= apply to kind=slow only")
        if self.factor is not None and not (_number(self.factor, 1) and self.factor > 1):
            raise ConfigError("fault", f"random: factor={self.factor!r} must be a number > 1")
        if self.duration is not None and (not isinstance(self.duration, int) or self.duration < 1):
            raise ConfigError("fault", f"random: duration={self.duration!r} must be an integer >= 1 (steps)")
        if not (isinstance(self.mtbf_steps, (int, float)) and self.mtbf_steps >= 1):
            raise ConfigError("fault", f"random: mtbf_steps={self.mtbf_steps!r} must be a number >= 1")
        if self.dist not in DISTRIBUTIONS:
            raise ConfigError("fault", f"random: dist={self.dist!r} is not known: allowed {', '.join(DISTRIBUTIONS)}")
        if not (isinstance(self.shape, (int, float)) and self.shape > 0):
            raise ConfigError("fault", f"random: shape={self.shape!r} must be > 0")
        if not isinstance(self.max, int) or not 0 <= self.max <= 1000:
            raise ConfigError("fault", f"random: max={self.max!r} must be an integer 0..1000")

    @property
    def _drawn(self) -> kinds.FaultKind:
        return kinds.get(self.kind)

    @classmethod
    def parse(cls, text: str) -> RandomFailures:
        _, _, rest = text.partition(":")
        values: dict[str, Any] = {}
        types = {"mtbf_steps": float, "dist": str, "shape": float, "seed": int, "max": int, "kind": str,
                 "factor": float, "duration": int}
        for item in filter(None, rest.split(",")):
            key, eq, value = item.partition("=")
            key = key.strip()
            if not eq or key not in types:
                raise ConfigError("fault", f"{item!r} in {text!r} is not one of {', '.join(f'{k}=' for k in types)}")
            if key in values:
                raise ConfigError("fault", f"{key}= is given twice in {text!r}: give each key once")
            try:
                values[key] = types[key](value.strip())
            except ValueError:
                raise ConfigError("fault", f"{key}={value!r} in {text!r} is not a {types[key].__name__}") from None
        if "mtbf_steps" not in values:
            raise ConfigError("fault", f"{text!r} needs mtbf_steps=M")
        return cls(**values)

    def draw(self, steps: int, world_size: int) -> list[tuple[int, int]]:
        """(step, position among the live ranks) of each failure, in step order, within ``1..steps-1``; none for
        kind=slow (:meth:`slowdowns`)."""
        return self._draw(steps, world_size) if self._drawn.fires is Fires.RANK else []

    def _draw(self, steps: int, world_size: int) -> list[tuple[int, int]]:
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

    def slowdowns(self, steps: int, world_size: int) -> list[FaultSpec]:
        """kind=slow: the drawn slow-downs as planned ``slow`` faults, each on a rank of the initial world (one
        that is gone by then is not slowed) for ``duration`` steps (cut at the run's end)."""
        if self._drawn.fires is not Fires.THROTTLE:
            return []
        factor, duration = self.factor or SLOW_FACTOR, self.duration or SLOW_STEPS
        return [FaultSpec(self.kind, rank, step=step, factor=factor, until=step + duration if step + duration < steps
                          else None) for step, rank in self._draw(steps, world_size)]

    def __str__(self) -> str:
        slow = f",kind=slow,factor={self.factor or SLOW_FACTOR:g},duration={self.duration or SLOW_STEPS}" \
            if self._drawn.fires is Fires.THROTTLE else ""
        return (f"{kinds.RANDOM}:mtbf_steps={self.mtbf_steps:g},dist={self.dist},shape={self.shape:g},seed={self.seed},"
                f"max={self.max}{slow}")


def parse_fault(value: Any) -> FaultSpec | RandomFailures:
    """One entry of a fault plan: a fault, a ``kind:key=value,...`` string or a dict (``kind: random`` for a
    failure process)."""
    if isinstance(value, (FaultSpec, RandomFailures)):
        return value
    if isinstance(value, str) and value.strip().startswith(f"{kinds.RANDOM}:"):
        return RandomFailures.parse(value.strip())
    if isinstance(value, dict) and value.get("kind") == kinds.RANDOM:
        return RandomFailures(**_fault_keys(RandomFailures, {k: v for k, v in value.items() if k != "kind"},
                                            "mtbf_steps", "mtbf_steps: M"))
    return FaultSpec.coerce(value)


def _fault_keys(cls: type, value: dict[Any, Any], needed: str, example: str) -> dict[str, Any]:
    """A fault's dict (YAML, JSON) as keyword arguments of ``cls``, or a ConfigError naming the key it does not take
    (with the allowed ones) or the one it lacks."""
    allowed = [f.name for f in fields(cls)]
    unknown = [k for k in value if k not in allowed]
    if unknown:
        what = "random failure process" if cls is RandomFailures else "fault"
        raise ConfigError("fault", f"{value!r}: {unknown[0]!r} is not a key of a {what}; allowed: "
                          + ", ".join(allowed))
    if needed not in value or ("rank" not in value and "stage" not in value and cls is FaultSpec
                               and kinds.names_rank(value.get("kind"))):
        missing = needed if needed not in value else "rank"
        raise ConfigError("fault", f"{value!r} names no {missing} (e.g. {example})")
    return {"rank": None, **value} if cls is FaultSpec else value
