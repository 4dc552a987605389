"""Checks a flip's tensor, index and bit against the real model before any process starts."""

from __future__ import annotations

import torch

from workbench.config import FaultSpec, RunConfig
from workbench.errors import ConfigError
from workbench.faults.bitflip import width


def model_tensors(config: RunConfig) -> tuple[dict[str, torch.Tensor], set[str]]:
    """(parameters by name, module names) of the run's model, built here without touching the caller's RNG."""
    from workbench.data import load_dataset
    from workbench.models import build_model

    data = load_dataset(config)
    with torch.random.fork_rng():
        model = build_model(config, data.input_shape, data.num_classes)
    return dict(model.named_parameters()), {name for name, _ in model.named_modules() if name}


def check_flip_targets(config: RunConfig, faults: list[FaultSpec]) -> None:
    if not faults:
        return
    params, modules = model_tensors(config)
    for f in faults:
        if f.target == "activation":
            if f.tensor not in modules:
                raise ConfigError("fault", f"{f}: activation flips name a module; {f.tensor!r} is not one of "
                                  f"{', '.join(sorted(modules))}")
            continue
        if f.tensor not in params:
            raise ConfigError("fault", f"{f}: {f.tensor!r} is not a parameter of the model; allowed "
                              f"{', '.join(params)}")
        tensor = params[f.tensor]
        if f.index is not None and f.index >= tensor.numel():
            raise ConfigError("fault", f"{f}: index {f.index} is out of range: {f.tensor} has {tensor.numel()} "
                              "elements (flat index)")
        if f.bit is not None and f.bit >= width(tensor.dtype):
            raise ConfigError("fault", f"{f}: bit {f.bit} is out of range for {str(tensor.dtype)[6:]}: allowed "
                              f"0..{width(tensor.dtype) - 1} (LSB-0)")
