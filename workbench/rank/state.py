"""Training state helpers shared by the parallel modes: optimizer state by parameter name, serialised state."""

from __future__ import annotations

import io
from typing import Any

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


def history(optimizer: Optimizer, params: list[nn.Parameter]) -> list[torch.Tensor]:
    """The optimizer's per-element history tensors (momentum, Adam moments), in a fixed order."""
    tensors = []
    for param in params:
        state = optimizer.state.get(param, {})
        tensors += [state[k] for k in sorted(state) if torch.is_tensor(state[k]) and state[k].shape == param.shape]
    return tensors


def to_bytes(value: Any) -> bytes:
    buffer = io.BytesIO()
    torch.save(value, buffer)
    return buffer.getvalue()


def from_bytes(payload: bytes) -> Any:
    return torch.load(io.BytesIO(payload), weights_only=True)
