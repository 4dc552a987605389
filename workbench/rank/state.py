"""Training state helpers shared by the parallel modes: optimizer state by parameter name, batch norm's running
statistics riding in an allreduce, and state as named tensors (what :mod:`.transfer` moves)."""

from __future__ import annotations

import torch
from torch import nn

from workbench.rank.optim import SGD, Adam, Optimizer


def named_optimizer_state(optimizer: Optimizer,
                          named_params: list[tuple[str, nn.Parameter]]) -> dict[str, dict[str, torch.Tensor]]:
    """Optimizer state per parameter name (the checkpoint layout ``optimizer/<name>/<key>``), cloned."""
    named = {}
    for name, param in named_params:
        state = optimizer.state.get(param, {})
        named[name] = {k: (v.detach().clone() if torch.is_tensor(v) else torch.tensor(v))
                       for k, v in state.items() if v is not None}
    return named


def load_named_optimizer_state(optimizer: Optimizer, named_params: list[tuple[str, nn.Parameter]],
                               named: dict[str, dict[str, torch.Tensor]]) -> None:
    for name, param in named_params:
        optimizer.state[param] = {k: v.clone() for k, v in named.get(name, {}).items()}


def init_history(optimizer: Optimizer) -> None:
    """Create the optimizer's per-parameter history now, exactly as its first step would (zeros), so replicas
    that exchange it have the same layout from step 0. SGD's first step with a zero momentum buffer equals its
    lazily cloned one (dampening 0); Adam's lazy state is zeros and step 0."""
    for group in optimizer.param_groups:
        for param in group["params"]:
            state = optimizer.state[param]
            if state:
                continue
            if isinstance(optimizer, SGD) and group.get("momentum", 0):
                state["momentum_buffer"] = torch.zeros_like(param, memory_format=torch.preserve_format)
            elif isinstance(optimizer, Adam):
                state["step"] = torch.tensor(0.0)
                state["exp_avg"] = torch.zeros_like(param, memory_format=torch.preserve_format)
                state["exp_avg_sq"] = torch.zeros_like(param, memory_format=torch.preserve_format)


def float_buffers(model: nn.Module) -> list[tuple[str, torch.Tensor]]:
    """The model's floating-point buffers by name (batch norm's ``running_mean``/``running_var``): training state
    that is not a parameter. Integer buffers (``num_batches_tracked``) advance alike on every replica."""
    return [(name, b) for name, b in model.named_buffers() if b.is_floating_point()]


class RunningStats:
    """Batch norm's running statistics of one replica, packed into the tail of a buffer that is allreduced anyway
    (gradients) with a contributor count, and set to the contributors' average afterwards: replicas stay bitwise
    identical at no extra collective. ``slots`` is 0 for a model without floating-point buffers."""

    def __init__(self, model: nn.Module) -> None:
        self.tensors = [b for _, b in float_buffers(model)]
        self.names = [name for name, _ in model.named_buffers()]  # every buffer: num_batches_tracked counts too
        self.every = [b for _, b in model.named_buffers()]
        self.numel = sum(b.numel() for b in self.tensors)
        self.slots = self.numel + 1 if self.tensors else 0

    def pack(self, region: torch.Tensor) -> None:
        """Write this replica's statistics and one contributor into ``region`` (``slots`` values)."""
        if self.tensors:
            torch.cat([b.reshape(-1) for b in self.tensors], out=region[:-1])
            region[-1] = 1.0

    @torch.no_grad()
    def unpack(self, region: torch.Tensor) -> None:
        """Take the average from an allreduced ``region`` (its sum over the contributors, and their count)."""
        count = region[-1].item() if self.tensors else 0.0
        if count <= 0:
            return  # nobody contributed (a retry among newcomers only): keep what this replica holds
        offset = 0
        for b in self.tensors:
            b.copy_(region[offset: offset + b.numel()].view_as(b) / count)
            offset += b.numel()

    def copy(self) -> list[torch.Tensor]:
        """Every buffer's value (before a forward that a rollback may undo: it also counts the batches)."""
        return [b.detach().clone() for b in self.every]

    @torch.no_grad()
    def restore(self, saved: list[torch.Tensor]) -> None:
        for b, value in zip(self.every, saved):
            b.copy_(value)


def history(optimizer: Optimizer, params: list[nn.Parameter]) -> list[torch.Tensor]:
    """The optimizer's per-element history tensors (momentum, Adam moments), in a fixed order."""
    tensors = []
    for param in params:
        state = optimizer.state.get(param, {})
        tensors += [state[k] for k in sorted(state) if torch.is_tensor(state[k]) and state[k].shape == param.shape]
    return tensors


def flatten_state(model: dict[str, torch.Tensor],
                  optim: dict[str, dict[str, torch.Tensor]]) -> list[tuple[str, torch.Tensor]]:
    """A (model state, optimizer state per parameter) pair as named tensors ``model/<name>``,
    ``optim/<parameter>/<key>``: what :mod:`.transfer` moves as raw buffers."""
    named = [(f"model/{k}", v) for k, v in model.items()]
    for name, state in optim.items():
        named += [(f"optim/{name}/{key}", v) for key, v in sorted(state.items()) if torch.is_tensor(v)]
    return named


def unflatten_state(named: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], dict[str, dict]]:
    """The inverse of :func:`flatten_state`."""
    model: dict[str, torch.Tensor] = {}
    optim: dict[str, dict[str, torch.Tensor]] = {}
    for name, tensor in named.items():
        if name.startswith("model/"):
            model[name[len("model/"):]] = tensor
        else:
            param, key = name[len("optim/"):].rsplit("/", 1)
            optim.setdefault(param, {})[key] = tensor
    return model, optim
