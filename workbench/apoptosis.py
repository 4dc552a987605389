"""Adaptive neuron apoptosis: hidden units (or conv channels) that no longer contribute are removed during training.

After Siegel, Daily and Vishnu, "Adaptive neuron apoptosis for accelerating deep learning on large scale
systems" (arXiv 1610.00790). The paper's exact rule is not available to us; this module implements OUR reading:

* A *unit* is an output of a producer layer (a ``Linear`` row or a ``Conv2d`` output channel) that feeds a
  consumer layer (the next ``Linear``/``Conv2d`` of an ``nn.Sequential``, through parameter-free modules only).
  Its *incoming* norm is the RMS of its producer weights and bias, its *outgoing* norm the RMS of the consumer
  weights that read it (RMS = L2 norm / sqrt(count), so one tolerance fits layers of any fan-in).
* At every test-set evaluation (except the last one), a unit whose incoming AND outgoing norms are both below
  the tolerance τ gets one more strike; a unit above it loses its strikes. A unit with ``window`` consecutive
  strikes is removed: the layer is physically shrunk (producer rows/channels and consumer columns sliced out),
  and the optimizer state (momentum, Adam moments) is sliced alike. A layer never drops below ``min`` units.
* τ adapts: it is multiplied by ``grow`` while the test accuracy holds within ``delta`` of its best so far, and
  by ``shrink`` when it falls further (removals that hurt make the rule more careful).
* Pressure (part of OUR reading, stated plainly): with plain SGD the weights of units the loss does not need do
  not fade by themselves in a few hundred steps (measured: no unit fell below any useful τ on digits), so with
  apoptosis on, training steps end with the proximal step of a reweighted group-lasso penalty on each unit's
  incoming and outgoing weights (:func:`group_lasso_`): a unit's RMS shrinks by ``lr * lasso * (layer mean /
  its RMS) ** gamma`` per step (applied every ``PRESSURE_EVERY`` steps with their summed strength), so weak units
  die (exactly zero) while strong ones are hardly touched. The strength fades linearly to zero at ``until`` of
  the run, so the surviving units are fine-tuned without it.
  Ranks of an apoptosis run flush subnormal floats to zero (``torch.set_flush_denormal``): fading units leave
  subnormals behind, which made every CPU operation that touched them several times slower.
  The threshold rule is what removes units; the pressure is what makes them stop contributing.

Data-parallel protocol (``workbench.rank.replicated.Trainer``): the norms are computed on replicated parameters
(bitwise identical on every replica after a step) and the test accuracy is rank 0's; rank 0 decides and
broadcasts the rule's whole state and the removal flags (:meth:`Apoptosis.pack`), every rank applies the same
removals at the same step and rebuilds its gradient buckets and optimizers. The model's current shapes travel
with every state (generation changes, checkpoints, in-memory snapshots): :func:`resize_to` makes a full-size
model (a fresh or replacement rank) match them before the state is loaded.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from workbench.errors import ConfigError

# the group-lasso step runs every few steps with their summed strength: on a 0.5 ms toy step its ~40 small tensor
# operations cost as much as the step itself; batched, the overhead drops to a quarter at the same total pressure
PRESSURE_EVERY = 4
# parameter-free modules a unit's activation may pass through between producer and consumer
_PASS_THROUGH = (nn.ReLU, nn.LeakyReLU, nn.ELU, nn.GELU, nn.SiLU, nn.Tanh, nn.Sigmoid, nn.Identity, nn.Dropout,
                 nn.MaxPool2d, nn.AvgPool2d, nn.AdaptiveAvgPool2d, nn.Flatten)


@dataclass(frozen=True)
class ApoptosisConfig:
    """The rule's settings; ``ApoptosisConfig.parse('on' | 'tol=..,window=..,delta=..')``."""

    tol: float = 1e-3  # initial τ, in RMS weight magnitude
    window: int = 2  # consecutive evaluations below τ before a unit is removed
    delta: float = 0.02  # accuracy (fraction) the run may lose from its best while τ keeps growing
    grow: float = 1.25  # τ ← τ·grow while accuracy holds
    shrink: float = 0.5  # τ ← τ·shrink when it falls
    min: int = 4  # units a layer keeps at least
    lasso: float = 0.015  # group-lasso strength: the pressure that drives unneeded units to zero (see module doc)
    gamma: float = 2.0  # reweighting: a unit at half its layer's mean norm is pressed 2**gamma times harder
    until: float = 0.75  # fraction of the run over which the pressure fades linearly to zero (then: fine-tuning)

    def __post_init__(self) -> None:
        _check(self.tol > 0, "tol", self.tol, "a number > 0")
        _check(isinstance(self.window, int) and 1 <= self.window <= 10_000, "window", self.window, "an integer >= 1")
        _check(0 <= self.delta < 1, "delta", self.delta, "a fraction in [0, 1)")
        _check(self.grow >= 1, "grow", self.grow, "a factor >= 1")
        _check(0 < self.shrink <= 1, "shrink", self.shrink, "a factor in (0, 1]")
        _check(isinstance(self.min, int) and self.min >= 1, "min", self.min, "an integer >= 1")
        _check(self.lasso >= 0, "lasso", self.lasso, "a number >= 0")
        _check(self.gamma >= 0, "gamma", self.gamma, "a number >= 0")
        _check(0 < self.until <= 1, "until", self.until, "a fraction in (0, 1]")

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
        """Group-lasso strength at ``step`` of a ``steps``-step run: ``lasso`` fading linearly to zero at
        ``until * steps`` (pressure early, fine-tuning of the surviving units late)."""
        end = self.until * steps
        return self.lasso * max(0.0, 1.0 - step / end) if end > 0 else 0.0

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


# -- which units exist ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Pair:
    """A producer layer whose outputs (units) feed a consumer layer; ``layer`` names the producer module."""

    layer: str
    consumer: str

    def producer_module(self, model: nn.Module) -> nn.Module:
        return model.get_submodule(self.layer)

    def consumer_module(self, model: nn.Module) -> nn.Module:
        return model.get_submodule(self.consumer)

    def units(self, model: nn.Module) -> int:
        return self.producer_module(model).weight.shape[0]

    def block(self, model: nn.Module) -> int:
        """Consumer inputs per unit: 1, or a channel's H·W positions when a conv feeds a Linear through Flatten."""
        return self.consumer_module(model).weight.shape[1] // self.units(model)


def _shrinkable(module: nn.Module) -> bool:
    if isinstance(module, nn.Linear):
        return True
    return isinstance(module, nn.Conv2d) and module.groups == 1 and module.padding_mode == "zeros"


def find_pairs(model: nn.Module) -> list[Pair]:
    """Producer/consumer pairs of an ``nn.Sequential`` (top-level modules): ``Linear``/``Conv2d`` followed,
    through parameter-free modules only (activations, pooling, ``Flatten``, dropout), by a ``Linear``/``Conv2d``
    whose inputs are the producer's outputs. Anything else (another parametrised module, ``Unflatten``, a
    ``Linear`` after a conv without ``Flatten``) ends a pair. Returns [] for models it cannot read."""
    if not isinstance(model, nn.Sequential):
        return []
    pairs: list[Pair] = []
    children = list(model.named_children())
    for i, (name, module) in enumerate(children):
        if not _shrinkable(module):
            continue
        flattened = False
        for next_name, nxt in children[i + 1:]:
            if isinstance(nxt, nn.Flatten):
                flattened = True
                continue
            if isinstance(nxt, _PASS_THROUGH):
                continue
            if not _shrinkable(nxt):
                break
            units = module.weight.shape[0]
            conv_to_linear = isinstance(module, nn.Conv2d) and isinstance(nxt, nn.Linear)
            fits = (nxt.weight.shape[1] == units if not conv_to_linear
                    else flattened and nxt.weight.shape[1] % units == 0)
            if fits and not (isinstance(module, nn.Linear) and isinstance(nxt, nn.Conv2d)):
                pairs.append(Pair(name, next_name))
            break
    return pairs


def require_pairs(model: nn.Module) -> list[Pair]:
    """:func:`find_pairs`, or a ConfigError saying what apoptosis can shrink."""
    pairs = find_pairs(model)
    if not pairs:
        raise ConfigError("apoptosis", f"cannot shrink this model ({type(model).__name__}): apoptosis needs an "
                          "nn.Sequential in which a Linear or Conv2d (groups=1) feeds another through "
                          "parameter-free modules only (activations, pooling, Flatten), e.g. --model mlp or cnn")
    return pairs


def hidden_units(model: nn.Module, pairs: list[Pair] | None = None) -> int:
    """Units apoptosis may remove: the outputs of every producer layer (the MLP's hidden widths summed)."""
    return sum(p.units(model) for p in (find_pairs(model) if pairs is None else pairs))


def parameter_count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


# -- norms ------------------------------------------------------------------------------------------------------
@torch.no_grad()
def unit_norms(model: nn.Module, pairs: list[Pair]) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """Per layer: (incoming RMS, outgoing RMS) of each unit, float64 vectors of the layer's width."""
    norms = {}
    for pair in pairs:
        producer, consumer = pair.producer_module(model), pair.consumer_module(model)
        units = producer.weight.shape[0]
        incoming = producer.weight.detach().reshape(units, -1).double()
        if producer.bias is not None:
            incoming = torch.cat([incoming, producer.bias.detach().double().unsqueeze(1)], 1)
        block = pair.block(model)
        # consumer weight (out, units*block[, k, k]) -> per unit all the weights reading it
        outgoing = consumer.weight.detach().double().reshape(consumer.weight.shape[0], units, block, -1)
        outgoing = outgoing.transpose(0, 1).reshape(units, -1)
        norms[pair.layer] = (incoming.pow(2).mean(1).sqrt(), outgoing.pow(2).mean(1).sqrt())
    return norms


# -- the decision -----------------------------------------------------------------------------------------------
class Apoptosis:
    """The rule's state: τ, the best test accuracy so far, and each unit's consecutive strikes.

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
        remove (sorted, possibly empty). The strike counters keep the removed units until :meth:`forget`."""
        cfg = self.config
        if accuracy >= self.best - cfg.delta:
            self.tau *= cfg.grow
        else:
            self.tau *= cfg.shrink
        self.best = max(self.best, accuracy)
        self.evaluations += 1
        removals = {}
        for layer, (incoming, outgoing) in norms.items():
            below = (incoming < self.tau) & (outgoing < self.tau)
            self.strikes[layer] = (self.strikes[layer] + 1) * below
            due = (self.strikes[layer] >= cfg.window).nonzero().flatten()
            allowed = max(0, len(incoming) - cfg.min)
            if len(due) > allowed:  # keep the strongest of the due units so the layer keeps its minimum
                weakest = torch.maximum(incoming, outgoing)[due].argsort()[:allowed]
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


# -- shrinking --------------------------------------------------------------------------------------------------
def slice_plan(model: nn.Module, pairs: list[Pair], removals: Mapping[str, torch.Tensor]
               ) -> dict[str, list[tuple[int, torch.Tensor]]]:
    """Per parameter name: the (dimension, indices kept) slices for the given removals. Producer weight and bias lose
    rows/channels (dim 0), the consumer weight loses the columns (dim 1) reading them (a channel's whole block
    of H·W positions when a conv feeds a Linear)."""
    plan: dict[str, list[tuple[int, torch.Tensor]]] = {}
    for pair in pairs:
        gone = removals.get(pair.layer)
        if gone is None or len(gone) == 0:
            continue
        units = pair.units(model)
        keep = torch.ones(units, dtype=torch.bool)
        keep[gone] = False
        kept = keep.nonzero().flatten()
        block = pair.block(model)
        columns = (kept.unsqueeze(1) * block + torch.arange(block)).flatten()
        # a middle layer is both a consumer (columns) and a producer (rows): its weight gets two slices
        plan.setdefault(f"{pair.layer}.weight", []).append((0, kept))
        if pair.producer_module(model).bias is not None:
            plan.setdefault(f"{pair.layer}.bias", []).append((0, kept))
        plan.setdefault(f"{pair.consumer}.weight", []).append((1, columns))
    return plan


def apply_plan(tensors: Mapping[str, torch.Tensor], plan: Mapping[str, list[tuple[int, torch.Tensor]]],
               shapes: Mapping[str, torch.Size] | None = None) -> dict[str, torch.Tensor]:
    """Slice the tensors named in ``plan`` (others are returned as they are). With ``shapes`` (per-parameter
    optimizer state), only tensors of their parameter's shape are sliced: Adam's scalar ``step`` stays."""
    out = {}
    for name, tensor in tensors.items():
        if name in plan and (shapes is None or tensor.shape == shapes[name]):
            for dim, index in plan[name]:
                tensor = tensor.index_select(dim, index)
            tensor = tensor.contiguous()
        out[name] = tensor
    return out


def resize_to(model: nn.Module, shapes: Mapping[str, torch.Size | tuple[int, ...]]) -> bool:
    """Make every ``Linear``/``Conv2d`` of ``model`` match the weight shapes in ``shapes`` (a state dict's names),
    replacing a mismatched module by an uninitialised one of the new shape (no RNG draw; the caller loads the
    state next). Returns whether anything changed. Raises ConfigError for a mismatch it cannot rebuild."""
    changed = False
    for name, module in list(model.named_modules()):
        key = f"{name}.weight"
        if key not in shapes or not hasattr(module, "weight") or tuple(module.weight.shape) == tuple(shapes[key]):
            continue
        shape = tuple(shapes[key])
        bias = getattr(module, "bias", None) is not None
        if isinstance(module, nn.Linear) and len(shape) == 2:
            new: nn.Module = nn.Linear(shape[1], shape[0], bias=bias, device="meta")
        elif isinstance(module, nn.Conv2d) and module.groups == 1 and len(shape) == 4:
            new = nn.Conv2d(shape[1], shape[0], module.kernel_size, module.stride, module.padding, module.dilation,
                            bias=bias, padding_mode=module.padding_mode, device="meta")
        else:
            raise ConfigError("apoptosis", f"cannot resize {name} ({type(module).__name__}) to weight shape {shape}")
        new = new.to_empty(device=module.weight.device)
        parent_name, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent_name) if parent_name else model, child, new)
        changed = True
    return changed


@torch.no_grad()
def shrink(model: nn.Module, pairs: list[Pair], removals: Mapping[str, torch.Tensor],
           optimizer_state: Mapping[str, Mapping[str, torch.Tensor]] | None = None
           ) -> dict[str, dict[str, torch.Tensor]]:
    """Remove the units ``removals`` (per layer, indices) from ``model`` in place (modules are replaced: the
    parameters are new objects, so optimizers and gradient hooks must be rebuilt by the caller) and return
    ``optimizer_state`` (per parameter name, as ``DataParallel.named_optimizer_state``) sliced alike.

    The kept units compute exactly what they computed before; the model's output changes only by the removed
    units' contribution (none when their outgoing weights are zero)."""
    plan = slice_plan(model, pairs, removals)
    old_shapes = {n: p.shape for n, p in model.named_parameters()}
    state = apply_plan(model.state_dict(), plan)
    resize_to(model, {k: v.shape for k, v in state.items()})
    model.load_state_dict(state)
    sliced = {}
    for name, entry in (optimizer_state or {}).items():
        sliced[name] = apply_plan({f"{k}": v for k, v in entry.items()},
                                  {k: plan[name] for k in entry} if name in plan else {},
                                  {k: old_shapes[name] for k in entry})
    return sliced


@torch.no_grad()
def group_lasso_(model: nn.Module, pairs: list[Pair], strength: float, lr: float, gamma: float = 0.0) -> None:
    """Proximal step of a (reweighted) group-lasso penalty on every unit's incoming and outgoing weights, in place:
    a group's RMS shrinks by ``lr * strength * (mean / rms) ** gamma`` (mean: the layer's mean group RMS over its
    non-zero groups), to exactly zero when it is smaller. With ``gamma`` > 0 weak units are pressed harder than
    strong ones, so the units the loss does not need fade to zero while the others are barely touched.
    Deterministic: replicas that apply it to identical parameters stay bitwise identical."""
    base = lr * strength

    def keep(square_sum: torch.Tensor, count: int) -> torch.Tensor:
        rms = square_sum.div_(count).sqrt_().clamp_min_(1e-12)
        scale = base
        if gamma:
            alive = (rms > 1e-12).sum().clamp_min(1)
            scale = base * (rms.sum() / alive) ** gamma
            rms = rms.pow_(gamma + 1)  # step / rms = base * mean**gamma / rms**(gamma + 1)
        return (1 - scale / rms).clamp_min_(0)

    for pair in pairs:
        producer, consumer = pair.producer_module(model), pair.consumer_module(model)
        units = producer.weight.shape[0]
        rows = producer.weight.view(units, -1)
        square = rows.square().sum(1)
        if producer.bias is not None:
            factor = keep(square.add_(producer.bias.square()), rows.shape[1] + 1)
            producer.bias.mul_(factor)
        else:
            factor = keep(square, rows.shape[1])
        rows.mul_(factor.unsqueeze(1))
        cols = consumer.weight.view(consumer.weight.shape[0], units, -1)
        factor = keep(cols.square().sum((0, 2)), cols.shape[0] * cols.shape[2])
        cols.mul_(factor.view(1, units, 1))
