"""Models: a small MLP and CNN sized for 8x8 digits, or the user's own ``nn.Module`` factory."""

from __future__ import annotations

import inspect
import math
from collections import OrderedDict

import torch
from torch import nn

from workbench.config import RunConfig, resolve_callable
from workbench.errors import ConfigError


def mlp(input_shape: tuple[int, ...], num_classes: int, hidden: tuple[int, ...] = (128, 64)) -> nn.Module:
    # readable parameter names (fc1.weight ...) for fault plans, checkpoints and bit flips
    layers: dict[str, nn.Module] = {"flatten": nn.Flatten()}
    width = math.prod(input_shape)
    for i, h in enumerate(hidden):
        layers[f"fc{i + 1}"] = nn.Linear(width, h)
        layers[f"relu{i + 1}"] = nn.ReLU()
        width = h
    layers[f"fc{len(hidden) + 1}"] = nn.Linear(width, num_classes)
    return nn.Sequential(OrderedDict(layers))


def cnn(input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    channels, height, width = input_shape if len(input_shape) == 3 else (1, *input_shape)
    return nn.Sequential(
        nn.Unflatten(1, (channels, height, width)) if len(input_shape) != 3 else nn.Identity(),
        nn.Conv2d(channels, 16, 3, padding=1), nn.ReLU(),
        nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(32 * (height // 2) * (width // 2), 64), nn.ReLU(), nn.Linear(64, num_classes),
    )


def build_model(config: RunConfig, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """Build the model on this process with the run's seed, so every rank starts from the same weights."""
    torch.manual_seed(config.seed)
    if config.model == "mlp":
        return mlp(input_shape, num_classes, tuple(config.hidden))
    if config.model == "cnn":
        if len(input_shape) not in (2, 3):
            raise ConfigError("model", f"'cnn' needs image inputs (C, H, W), the dataset gives {input_shape}")
        return cnn(input_shape, num_classes)
    factory = resolve_callable("model", config.model)
    kwargs = {k: v for k, v in (("input_shape", input_shape), ("num_classes", num_classes)) if accepts(factory, k)}
    model = factory(**kwargs)
    if not isinstance(model, nn.Module):
        raise ConfigError("model", f"{config.model!r} returned {type(model).__name__}, not a torch.nn.Module")
    return model


def accepts(func: object, name: str) -> bool:
    try:
        params = inspect.signature(func).parameters  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return False
    return name in params or any(p.kind is p.VAR_KEYWORD for p in params.values())


def split_stages(model: nn.Module, stages: int) -> list[list[str]]:
    """Split a ``nn.Sequential`` into ``stages`` contiguous runs of its top-level modules, balanced by parameters.

    The split minimises the largest stage's parameter count (a small dynamic programme over the cut points),
    and every stage holds at least one module with parameters. Returns the module names of each stage.
    """
    if not isinstance(model, nn.Sequential):
        raise ConfigError("model", f"pipeline parallelism splits an nn.Sequential by its top-level modules; the "
                          f"model is a {type(model).__name__}")
    names = [name for name, _ in model.named_children()]
    weights = [sum(p.numel() for p in module.parameters()) for _, module in model.named_children()]
    holders = sum(1 for w in weights if w > 0)
    if holders < stages:
        raise ConfigError("model", f"{holders} of its top-level modules hold parameters, too few for {stages} "
                          "pipeline stages (each stage needs one): add layers (e.g. --hidden 128,64,64) or use "
                          "fewer stages")
    n = len(names)
    prefix = [0]
    for w in weights:
        prefix.append(prefix[-1] + w)
    holders_before = [0]
    for w in weights:
        holders_before.append(holders_before[-1] + (w > 0))
    inf = float("inf")
    # best[k][i]: the smallest possible largest stage when the first i modules form k stages
    best = [[inf] * (n + 1) for _ in range(stages + 1)]
    cut = [[0] * (n + 1) for _ in range(stages + 1)]
    best[0][0] = 0
    for k in range(1, stages + 1):
        for i in range(1, n + 1):
            for j in range(k - 1, i):
                if best[k - 1][j] == inf or holders_before[i] - holders_before[j] == 0:
                    continue
                cost = max(best[k - 1][j], prefix[i] - prefix[j])
                if cost <= best[k][i]:  # ties: cut late, parameter-free modules (ReLU) stay with their layer
                    best[k][i], cut[k][i] = cost, j
    bounds, i = [], n
    for k in range(stages, 0, -1):
        bounds.append((cut[k][i], i))
        i = cut[k][i]
    return [names[a:b] for a, b in reversed(bounds)]


def stage_module(model: nn.Module, names: list[str]) -> nn.Sequential:
    """The modules ``names`` of ``model`` as one ``nn.Sequential`` that keeps their names (``fc2.weight`` ...),
    so checkpoints, fault plans and bit flips use the whole model's names on every stage."""
    children = dict(model.named_children())
    return nn.Sequential(OrderedDict((name, children[name]) for name in names))
