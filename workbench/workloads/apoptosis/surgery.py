"""The model surgery of adaptive neuron apoptosis (:mod:`workbench.workloads.apoptosis.rule` holds the rule that drives
it).

Which units a model has (:func:`find_pairs`: producer/consumer layer pairs of an ``nn.Sequential``), their
incoming and outgoing norms (:func:`unit_norms`), the group-lasso pressure that makes unneeded units fade
(:func:`group_lasso_`), and the removal of units: :func:`shrink` slices the producer's rows/channels, the
consumer's columns and the optimizer state alike; :func:`resize_to` makes a full-size model match shapes that
were shrunk elsewhere (a replacement rank, a checkpoint).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from workbench.base.errors import ConfigError

_NORMS = (nn.BatchNorm1d, nn.BatchNorm2d)  # a producer's batch norm: its entries go with the unit
# parameter-free modules a unit's activation may pass through between producer and consumer
_PASS_THROUGH = (nn.ReLU, nn.LeakyReLU, nn.ELU, nn.GELU, nn.SiLU, nn.Tanh, nn.Sigmoid, nn.Identity, nn.Dropout,
                 nn.MaxPool2d, nn.AvgPool2d, nn.AdaptiveAvgPool2d, nn.Flatten)


# -- which units exist ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Pair:
    """A producer layer whose outputs (units) feed a consumer layer; ``layer`` names the producer module."""

    layer: str
    consumer: str
    norm: str | None = None  # the batch norm right after the producer, whose channel entries belong to the unit

    def producer_module(self, model: nn.Module) -> nn.Module:
        return model.get_submodule(self.layer)

    def consumer_module(self, model: nn.Module) -> nn.Module:
        return model.get_submodule(self.consumer)

    def norm_module(self, model: nn.Module) -> nn.Module | None:
        return model.get_submodule(self.norm) if self.norm else None

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
    through parameter-free modules only (activations, pooling, ``Flatten``, dropout) and at most one batch norm
    of the producer's width (its entries belong to the unit: ``Pair.norm``), by a ``Linear``/``Conv2d`` whose
    inputs are the producer's outputs. Anything else (another parametrised module such as a residual block,
    ``Unflatten``, a ``Linear`` after a conv without ``Flatten``) ends a pair. Returns [] for models it cannot
    read."""
    if not isinstance(model, nn.Sequential):
        return []
    pairs: list[Pair] = []
    children = list(model.named_children())
    for i, (name, module) in enumerate(children):
        if not _shrinkable(module):
            continue
        flattened, norm, units = False, None, module.weight.shape[0]
        for next_name, nxt in children[i + 1:]:
            if isinstance(nxt, nn.Flatten):
                flattened = True
                continue
            if isinstance(nxt, _NORMS) and norm is None and not flattened and nxt.num_features == units:
                norm = next_name
                continue
            if isinstance(nxt, _PASS_THROUGH):
                continue
            if not _shrinkable(nxt):
                break
            conv_to_linear = isinstance(module, nn.Conv2d) and isinstance(nxt, nn.Linear)
            fits = (nxt.weight.shape[1] == units if not conv_to_linear
                    else flattened and nxt.weight.shape[1] % units == 0)
            if fits and not (isinstance(module, nn.Linear) and isinstance(nxt, nn.Conv2d)):
                pairs.append(Pair(name, next_name, norm))
            break
    return pairs


def require_pairs(model: nn.Module, name: str | None = None) -> list[Pair]:
    """:func:`find_pairs`, or a ConfigError saying what apoptosis can shrink (naming the model as ``name``, else by
    its class)."""
    pairs = find_pairs(model)
    if not pairs:
        raise ConfigError("apoptosis", f"cannot shrink this model ({name or type(model).__name__}): apoptosis needs an "
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
        incoming = _incoming_group(model, pair).detach().double()
        block = pair.block(model)
        # consumer weight (out, units*block[, k, k]) -> per unit all the weights reading it
        outgoing = consumer.weight.detach().double().reshape(consumer.weight.shape[0], units, block, -1)
        outgoing = outgoing.transpose(0, 1).reshape(units, -1)
        norms[pair.layer] = (incoming.pow(2).mean(1).sqrt().cpu(), outgoing.pow(2).mean(1).sqrt().cpu())
    return norms


def _incoming_group(model: nn.Module, pair: Pair) -> torch.Tensor:
    """(units, k): what makes each unit's output. After a batch norm the producer's weights do not (the norm
    divides their scale away): the channel's output is γ·x̂ + β, so its scale and shift are the group (the
    network-slimming view: a channel with γ = β = 0 outputs exactly 0, whatever its convolution)."""
    norm = pair.norm_module(model)
    if norm is not None and norm.affine:
        return torch.stack([norm.weight, norm.bias], 1)
    producer = pair.producer_module(model)
    rows = producer.weight.reshape(producer.weight.shape[0], -1)
    return rows if producer.bias is None else torch.cat([rows, producer.bias.unsqueeze(1)], 1)


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
        norm = pair.norm_module(model)
        for entry in ("weight", "bias", "running_mean", "running_var"):  # the unit's batch-norm entries go with it
            if norm is not None and getattr(norm, entry, None) is not None:
                plan.setdefault(f"{pair.norm}.{entry}", []).append((0, kept))
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
        if isinstance(module, _NORMS):
            changed |= _resize_norm(model, name, module, shapes)
            continue
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
        new = new.to_empty(device=module.weight.device).train(module.training)
        parent_name, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent_name) if parent_name else model, child, new)
        changed = True
    return changed


def _resize_norm(model: nn.Module, name: str, module: nn.Module, shapes: Mapping[str, Any]) -> bool:
    """A batch norm whose state in ``shapes`` has another number of channels is replaced by one of that size."""
    key = f"{name}.running_mean" if f"{name}.running_mean" in shapes else f"{name}.weight"
    if key not in shapes or tuple(shapes[key])[0] == module.num_features:
        return False
    device = next(iter([*module.parameters(), *module.buffers()]), torch.empty(0)).device  # the CPU or the GPU
    new = type(module)(tuple(shapes[key])[0], module.eps, module.momentum, module.affine,
                       module.track_running_stats, device="meta").to_empty(device=device).train(module.training)
    parent_name, _, child = name.rpartition(".")
    setattr(model.get_submodule(parent_name) if parent_name else model, child, new)
    return True


@torch.no_grad()
def shrink(model: nn.Module, pairs: list[Pair], removals: Mapping[str, torch.Tensor],
           optimizer_state: Mapping[str, Mapping[str, torch.Tensor]] | None = None
           ) -> dict[str, dict[str, torch.Tensor]]:
    """Remove the units ``removals`` (per layer, indices) from ``model`` in place (modules are replaced: the
    parameters are new objects, so optimizers and gradient hooks must be rebuilt by the caller) and return
    ``optimizer_state`` (per parameter name, as ``GradientExchange.named_optimizer_state``) sliced alike.

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
def group_lasso_(model: nn.Module, pairs: list[Pair], strength: float, lr: float, gamma: float = 0.0,
                 relative: bool = False) -> None:
    """Proximal step of a (reweighted) group-lasso penalty on every unit's incoming and outgoing weights, in place:
    a group's RMS shrinks by ``lr * strength * (mean / rms) ** gamma`` (mean: the layer's mean group RMS over its
    non-zero groups), to exactly zero when it is smaller. With ``gamma`` > 0 weak units are pressed harder than
    strong ones, so the units the loss does not need fade to zero while the others are barely touched. With
    ``relative`` the step is also multiplied by ``mean``: every layer loses the same fraction of its typical
    group per step, whatever its scale (a batch norm's γ, β near 1 fade as fast as fully connected weights near
    0.05). Deterministic: replicas that apply it to identical parameters stay bitwise identical."""
    base = lr * strength

    def keep(square_sum: torch.Tensor, count: int) -> torch.Tensor:
        rms = square_sum.div_(count).sqrt_().clamp_min_(1e-12)
        scale = base
        if gamma or relative:
            alive = (rms > 1e-12).sum().clamp_min(1)
            mean = rms.sum() / alive
            scale = base * mean ** (gamma + 1 if relative else gamma)
            rms = rms.pow_(gamma + 1)  # step / rms = base * mean**gamma / rms**(gamma + 1) (times mean: relative)
        return (1 - scale / rms).clamp_min_(0)

    for pair in pairs:
        producer, consumer = pair.producer_module(model), pair.consumer_module(model)
        units = producer.weight.shape[0]
        norm = pair.norm_module(model)
        if norm is not None and norm.affine:  # after a batch norm, the channel's scale and shift are its group
            factor = keep(norm.weight.square() + norm.bias.square(), 2)
            norm.weight.mul_(factor)
            norm.bias.mul_(factor)
        else:
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
