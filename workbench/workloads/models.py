"""Models: a small MLP and CNN sized for 8x8 digits, the seed papers' CNNs
(:mod:`workbench.workloads.architectures`), or the user's own ``nn.Module`` factory; and how a model is cut into
pipeline stages (by parameters or measured cost).
"""

from __future__ import annotations

import copy
import inspect
import math
import statistics
import time
from collections import OrderedDict
from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch
from torch import nn

from workbench.base.callables import resolve_callable
from workbench.base.errors import ConfigError
from workbench.workloads import registry

if TYPE_CHECKING:
    from workbench.config.run import RunConfig


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
    if len(input_shape) not in (2, 3):
        raise ConfigError("model", f"'cnn' needs image inputs (C, H, W), the dataset gives {input_shape}")
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
    entry = registry.model(config.model)
    if entry is not None:  # a registered model: its builder, with its knobs
        return entry.build(tuple(input_shape), num_classes, config)
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


def split_stages(model: nn.Module, stages: int, costs: Sequence[float] | None = None) -> list[list[str]]:
    """Split a ``nn.Sequential`` into ``stages`` contiguous runs of its top-level modules, balanced by cost.

    The cost of a module is ``costs[i]`` (seconds of forward+backward, :func:`block_costs`) or, when ``costs`` is
    None, its parameter count. The split minimises the largest stage's cost (a small dynamic programme over the
    cut points), and every stage holds at least one module with parameters. Returns the module names of each stage.
    """
    if not isinstance(model, nn.Sequential):
        raise ConfigError("model", f"pipeline parallelism splits an nn.Sequential by its top-level modules; the "
                          f"model is a {type(model).__name__}")
    names = [name for name, _ in model.named_children()]
    params = [sum(p.numel() for p in module.parameters()) for _, module in model.named_children()]
    holders = sum(1 for w in params if w > 0)
    if holders < stages:
        raise ConfigError("model", f"{holders} of its top-level modules hold parameters, too few for {stages} "
                          "pipeline stages (each stage needs one): add layers (e.g. --hidden 128,64,64) or use "
                          "fewer stages")
    weights = params if costs is None else list(costs)
    if len(weights) != len(names):
        raise ValueError(f"{len(weights)} costs for {len(names)} top-level modules")
    n = len(names)
    prefix = [0]
    for w in weights:
        prefix.append(prefix[-1] + w)
    holders_before = [0]
    for w in params:
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


def block_costs(model: nn.Module, input_shape: tuple[int, ...], batch: int = 2, repeats: int = 9,
                budget: float = 0.3) -> list[float]:
    """Seconds of forward+backward of each top-level module on a random batch of ``batch`` samples, in one thread
    as a rank computes; parameter-free modules (ReLU, Flatten) come out near 0.

    A warm-up pass over the whole model (dropped: the first call of a kernel can cost a second), then timed
    passes until ``repeats`` are done or they took ``budget`` seconds (at least one); each module's cost is its
    median over the timed passes. Measured on a copy with its own random generator: the model (weights,
    running statistics, gradients) and torch's global RNG stay as they were.
    """
    children = [module for _, module in copy.deepcopy(model).named_children()]
    x0 = torch.randn(batch, *input_shape, generator=torch.Generator().manual_seed(0))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    passes: list[list[float]] = []
    started = time.perf_counter()
    try:
        while len(passes) < 2 or (len(passes) < repeats + 1 and time.perf_counter() - started < budget):
            x, times = x0, []
            for child in children:
                x = x.detach().requires_grad_(x.is_floating_point())
                t0 = time.perf_counter()
                y = child(x)
                t1 = time.perf_counter()
                grad = torch.ones_like(y) if y.requires_grad else None
                t2 = time.perf_counter()
                if grad is not None:
                    y.backward(grad)
                times.append(t1 - t0 + time.perf_counter() - t2)
                x = y
            passes.append(times)
            if len(passes) == 1:
                started = time.perf_counter()  # the budget counts the timed passes only
    finally:
        torch.set_num_threads(threads)
    return [statistics.median(column) for column in zip(*passes[1:])]


def cuts_of(stages: list[list[str]]) -> list[int]:
    """Where ``stages`` cut the model: the index of each stage's first module, after the first stage."""
    sizes = [len(names) for names in stages]
    return [sum(sizes[:k]) for k in range(1, len(sizes))]


def stages_from_cuts(model: nn.Module, cuts: Sequence[int]) -> list[list[str]]:
    """The module names of each stage when ``model``'s top-level modules are cut before each index of ``cuts``
    (ConfigError when the cuts leave the model or a stage holds no parameters)."""
    children = list(model.named_children())
    bounds = [0, *cuts, len(children)]
    if any(not 0 <= a < b for a, b in zip(bounds, bounds[1:])):
        raise ConfigError("stage_cuts", f"{list(cuts)} must be increasing indices in 1..{len(children) - 1}: the "
                          f"model has {len(children)} top-level modules")
    stages = [children[a:b] for a, b in zip(bounds, bounds[1:])]
    for k, stage in enumerate(stages):
        if not any(p.numel() for _, module in stage for p in module.parameters()):
            raise ConfigError("stage_cuts", f"{list(cuts)} leave stage {k} ({', '.join(n for n, _ in stage)}) "
                              "without parameters: each stage needs one module with parameters")
    return [[name for name, _ in stage] for stage in stages]


def run_stages(model: nn.Module, config: RunConfig) -> list[list[str]]:
    """The stages of a pipeline or hybrid run: cut at ``config.stage_cuts`` (measured where the run starts,
    :func:`workbench.workloads.stages.stage_cuts`), or balanced by parameters when the config has no cut."""
    if config.stage_cuts is not None:
        return stages_from_cuts(model, config.stage_cuts)
    return split_stages(model, config.pipeline_stages)


def stage_module(model: nn.Module, names: list[str]) -> nn.Sequential:
    """The modules ``names`` of ``model`` as one ``nn.Sequential`` that keeps their names (``fc2.weight`` ...),
    so checkpoints, fault plans and bit flips use the whole model's names on every stage."""
    children = dict(model.named_children())
    return nn.Sequential(OrderedDict((name, children[name]) for name in names))


def boundary_shapes(model: nn.Module, stages: list[list[str]], sample: torch.Tensor) -> list[tuple[int, ...]]:
    """Per-sample shape of each stage's output (what crosses to the next stage), found with one sample in eval
    mode: batch norm's running statistics are not touched."""
    shapes, out, training = [], sample[:1], model.training
    model.eval()
    with torch.no_grad():
        for names in stages:
            out = stage_module(model, names)(out)
            shapes.append(tuple(out.shape[1:]))
    model.train(training)
    return shapes
