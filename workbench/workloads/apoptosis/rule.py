"""Adaptive neuron apoptosis (after Siegel, Daily and Vishnu, arXiv 1610.00790, in our reading): hidden units or
conv channels that stop contributing are removed while training runs.

A unit's contribution is the geometric mean of the RMS of its incoming and outgoing weights; one below the
adaptive tolerance τ for ``window`` evaluations in a row is removed and the layer physically shrunk, optimizer
state alike. A group-lasso pressure in the middle of the run makes unneeded units fade. In data parallel, rank 0
decides and broadcasts the rule's state (:meth:`Apoptosis.pack`); every rank applies the same removals at the same
step. The rule, its phases and its measurements: docs/apoptosis.md and docs/internals.md. The model surgery is
:mod:`workbench.workloads.apoptosis.surgery`, whose names are re-exported here.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from workbench.base.errors import ConfigError
from workbench.workloads.apoptosis.surgery import (
    Pair,
    apply_plan,
    find_pairs,
    group_lasso_,
    hidden_units,
    parameter_count,
    require_pairs,
    resize_to,
    shrink,
    slice_plan,
    unit_norms,
)

__all__ = ["LASSO_STEPS", "PRESSURE_EVERY", "Apoptosis", "ApoptosisConfig", "Pair", "apply_plan", "find_pairs",
           "group_lasso_", "hidden_units", "parameter_count", "require_pairs", "resize_to", "shrink", "slice_plan",
           "unit_norms"]

# the group-lasso step runs every few steps with their summed strength: on a 0.5 ms toy step its ~40 small tensor
# operations cost as much as the step itself; batched, the overhead drops to a quarter at the same total pressure
PRESSURE_EVERY = 4
# the pressure's strength, chosen on seeds 10-29 (docs/apoptosis.md "Design"); seeds 0-9 are the reporting seeds
LASSO = 0.006
# the run length LASSO is stated for (the design's): a run of N steps is pressed LASSO * LASSO_STEPS / N per step,
# so the pressure's total, and with it the reduction, is the same at any length (docs/apoptosis.md "Design")
LASSO_STEPS = 400


@dataclass(frozen=True)
class ApoptosisConfig:
    """The rule's settings; ``ApoptosisConfig.parse('on' | 'tol=..,window=..,delta=..')``."""

    tol: float = 1e-3  # initial τ, in RMS weight magnitude (of a unit's contribution: see Apoptosis.observe)
    window: int = 2  # consecutive evaluations below τ before a unit is removed
    delta: float = 0.02  # accuracy (fraction) the run may lose from its best while τ keeps growing
    grow: float = 1.25  # τ ← τ·grow while accuracy holds
    shrink: float = 0.5  # τ ← τ·shrink when it falls
    min: int = 4  # units a layer keeps at least
    lasso: float = LASSO  # group-lasso strength per step of a LASSO_STEPS-step run (the pressure's total is fixed)
    gamma: float = 4.0  # reweighting: a unit at half its layer's mean norm is pressed 2**gamma = 16 times harder
    relative: int = 0  # 1: each layer is pressed in proportion to its mean group norm (conv channels fade too)
    start: float = 0.15  # fraction of the run trained before the pressure starts (units are judged once they learnt)
    until: float = 0.5  # fraction of the run at which the pressure ends; decisions end `window` evaluations later
    val: float = 0.1  # fraction of the training data held out as the validation split the rule decides on
    fold: int = 1  # 1: once the decisions end, the validation split rejoins the training data for the fine-tune

    def __post_init__(self) -> None:
        _check(self.tol > 0, "tol", self.tol, "a number > 0")
        _check(isinstance(self.window, int) and 1 <= self.window <= 10_000, "window", self.window, "an integer >= 1")
        _check(0 <= self.delta < 1, "delta", self.delta, "a fraction in [0, 1)")
        _check(self.grow >= 1, "grow", self.grow, "a factor >= 1")
        _check(0 < self.shrink <= 1, "shrink", self.shrink, "a factor in (0, 1]")
        _check(isinstance(self.min, int) and self.min >= 1, "min", self.min, "an integer >= 1")
        _check(self.lasso >= 0, "lasso", self.lasso, "a number >= 0")
        _check(self.gamma >= 0, "gamma", self.gamma, "a number >= 0")
        _check(self.relative in (0, 1), "relative", self.relative, "0 or 1")
        _check(0 <= self.start < 1, "start", self.start, "a fraction in [0, 1)")
        _check(self.start < self.until <= 1, "until", self.until, f"a fraction in (start={self.start}, 1]")
        _check(0 < self.val <= 0.5, "val", self.val, "a fraction in (0, 0.5]")
        _check(self.fold in (0, 1), "fold", self.fold, "0 or 1")

    @classmethod
    def parse(cls, value: Any) -> ApoptosisConfig | None:
        """``None``/``False``/``'off'`` → None (no apoptosis); ``True``/``'on'`` → the defaults; a dict or
        ``'tol=0.02,window=2,delta=0.01'`` (any subset of the fields; the rest default). ConfigError otherwise."""
        if value is None or value is False or (isinstance(value, str) and value.strip().lower() in ("off", "")):
            return None
        if isinstance(value, ApoptosisConfig):
            return value
        if value is True or (isinstance(value, str) and value.strip().lower() == "on"):
            return cls()
        fields = {f.name: f.type for f in dataclasses.fields(cls)}
        if isinstance(value, Mapping):
            items = dict(value)
        elif isinstance(value, str):
            items = {}
            for item in value.split(","):
                key, eq, text = item.partition("=")
                if not eq:
                    raise ConfigError("apoptosis", f"{item.strip()!r} in {value!r} is not key=value: use on, off or "
                                      f"{', '.join(f'{k}=' for k in fields)}")
                if key.strip() in items:
                    raise ConfigError("apoptosis", f"{key.strip()}= is given twice in {value!r}: give each key once")
                items[key.strip()] = text.strip()
        else:
            raise ConfigError("apoptosis", f"{value!r} is neither on, off, a dict nor 'tol=..,window=..,delta=..'")
        values: dict[str, Any] = {}
        for key, text in items.items():
            if key not in fields:
                raise ConfigError("apoptosis", f"{key!r} is not a setting: allowed {', '.join(fields)}")
            kind = int if fields[key] in ("int", int) else float
            try:
                if isinstance(text, bool) or (kind is int and isinstance(text, float) and not text.is_integer()):
                    raise ValueError(text)
                number = kind(text)
            except (TypeError, ValueError):
                raise ConfigError("apoptosis", f"{key}={text!r} is not {'an integer' if kind is int else 'a number'}"
                                  ) from None
            values[key] = number
        return cls(**values)

    def pressure(self, step: int, steps: int) -> float:
        """Group-lasso strength at ``step`` of a ``steps``-step run: ``lasso * LASSO_STEPS / steps`` from ``start *
        steps`` to ``until * steps``, 0 before (the network learns first: at initialisation no unit is more useful
        than another) and after (the survivors are fine-tuned without the pressure's pull on them). Scaled by the
        length so the total is the same for any run: the reduction a setting gives does not depend on ``steps``."""
        if not self.start * steps <= step < self.until * steps:
            return 0.0
        return self.lasso * LASSO_STEPS / steps

    def deciding(self, step: int, steps: int, eval_interval: int) -> bool:
        """Whether the evaluation after ``step`` steps may remove units: until ``window`` evaluations after the
        pressure ended (the units it killed last get their window), never at the run's last evaluation. Later
        removals would leave no time to recover from them, and τ, which keeps growing while accuracy holds,
        would reach the living units."""
        return step < steps and step <= self.until * steps + self.window * eval_interval

    def folded(self, step: int, steps: int, eval_interval: int) -> bool:
        """Whether training step ``step`` draws from the training data with the validation split folded back in
        (``fold=1``, once the decisions are over: nothing reads the split any more, so the fine-tune need not
        do without its samples)."""
        return bool(self.fold) and step >= self.until * steps + self.window * eval_interval

    def pressure_due(self, step: int, steps: int) -> float:
        """Strength of the lazy proximal step applied after ``step``: every ``PRESSURE_EVERY`` steps, the summed
        strength of those steps (the same total pressure at a fraction of the per-step cost); 0 otherwise."""
        if (step + 1) % PRESSURE_EVERY:
            return 0.0
        return sum(self.pressure(s, steps) for s in range(step + 1 - PRESSURE_EVERY, step + 1))

    def __str__(self) -> str:
        return ",".join(f"{f.name}={getattr(self, f.name)!r}" for f in dataclasses.fields(self))


def _check(ok: bool, key: str, value: Any, allowed: str) -> None:
    if not ok:
        raise ConfigError("apoptosis", f"{key}={value!r} must be {allowed}")


# -- the decision -----------------------------------------------------------------------------------------------
class Apoptosis:
    """The rule's state: τ, the best validation accuracy so far, and each unit's consecutive strikes.

    ``observe`` is pure over its inputs (norms, accuracy) and this state, so replicas that apply the same
    observations hold the same state; in a data-parallel run only rank 0 observes and :meth:`pack` /
    :meth:`unpack` carry the result to the others.
    """

    def __init__(self, config: ApoptosisConfig, widths: Mapping[str, int]) -> None:
        self.config = config
        self.tau = config.tol
        self.best = -math.inf
        self.evaluations = 0
        self.strikes = {layer: torch.zeros(n, dtype=torch.int64) for layer, n in widths.items()}

    def observe(self, norms: Mapping[str, tuple[torch.Tensor, torch.Tensor]], accuracy: float
                ) -> dict[str, torch.Tensor]:
        """One evaluation: adapt τ to ``accuracy``, count strikes, return per layer the indices of the units to
        remove (sorted, possibly empty). The strike counters keep the removed units until :meth:`forget`.

        A unit's contribution is the geometric mean of its incoming and outgoing RMS: a ReLU unit whose incoming
        weights are scaled by c and outgoing by 1/c computes the same, and so has the same contribution; a unit
        whose incoming group is zero (it outputs nothing) has none, however large its outgoing weights are."""
        cfg = self.config
        if accuracy >= self.best - cfg.delta:
            self.tau *= cfg.grow
        else:
            self.tau *= cfg.shrink
        self.best = max(self.best, accuracy)
        self.evaluations += 1
        removals = {}
        for layer, (incoming, outgoing) in norms.items():
            contribution = (incoming * outgoing).sqrt()
            below = contribution < self.tau
            self.strikes[layer] = (self.strikes[layer] + 1) * below
            due = (self.strikes[layer] >= cfg.window).nonzero().flatten()
            allowed = max(0, len(incoming) - cfg.min)
            if len(due) > allowed:  # keep the strongest of the due units so the layer keeps its minimum
                weakest = contribution[due].argsort()[:allowed]
                due = due[weakest]
            removals[layer] = due.sort().values
        return removals

    def forget(self, removals: Mapping[str, torch.Tensor]) -> None:
        """Drop the removed units' counters (call after the model was shrunk by the same removals)."""
        for layer, gone in removals.items():
            keep = torch.ones(len(self.strikes[layer]), dtype=torch.bool)
            keep[gone] = False
            self.strikes[layer] = self.strikes[layer][keep]

    # -- carrying the state --------------------------------------------------------------------------------------
    def pack(self, removals: Mapping[str, torch.Tensor] | None = None) -> torch.Tensor:
        """The state and the removal flags as one float64 vector (layout fixed by the current widths)."""
        parts = [torch.tensor([self.tau, self.best, float(self.evaluations)], dtype=torch.float64)]
        for layer, strikes in self.strikes.items():
            flags = torch.zeros(len(strikes), dtype=torch.float64)
            if removals is not None and layer in removals:
                flags[removals[layer]] = 1.0
            parts += [strikes.double(), flags]
        return torch.cat(parts)

    def packed_size(self) -> int:
        return 3 + 2 * sum(len(s) for s in self.strikes.values())

    def unpack(self, vector: torch.Tensor) -> dict[str, torch.Tensor]:
        """Adopt a packed state; returns the removals it carries."""
        self.tau, self.best, evaluations = vector[:3].tolist()
        self.evaluations = int(evaluations)
        offset, removals = 3, {}
        for layer, strikes in self.strikes.items():
            n = len(strikes)
            self.strikes[layer] = vector[offset: offset + n].round().long()
            removals[layer] = vector[offset + n: offset + 2 * n].nonzero().flatten()
            offset += 2 * n
        return removals

    def state_dict(self) -> dict[str, torch.Tensor]:
        state = {"tau": torch.tensor(self.tau, dtype=torch.float64),
                 "best": torch.tensor(self.best, dtype=torch.float64),
                 "evaluations": torch.tensor(self.evaluations, dtype=torch.int64)}
        state.update({f"strikes.{layer}": s.clone() for layer, s in self.strikes.items()})
        return state

    def load_state_dict(self, state: Mapping[str, torch.Tensor]) -> None:
        self.tau = float(state["tau"])
        self.best = float(state["best"])
        self.evaluations = int(state["evaluations"])
        self.strikes = {key[len("strikes."):]: value.clone().long() for key, value in state.items()
                        if key.startswith("strikes.")}
