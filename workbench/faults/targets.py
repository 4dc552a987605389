"""Checks a flip's tensor, index and bit against the real model before any process starts."""

from __future__ import annotations

from typing import TYPE_CHECKING

from workbench.base.errors import ConfigError
from workbench.faults.bitflip import width
from workbench.faults.spec import FaultSpec
from workbench.workloads.stages import buffer_tensors, model_tensors

if TYPE_CHECKING:
    from workbench.config.run import RunConfig


def check_flip_targets(config: RunConfig, faults: list[FaultSpec]) -> None:
    if not faults:
        return
    staged = config.mode.staged
    for f in faults:
        params, modules = model_tensors(config, f.rank if staged else None)
        where = f" on stage {config.stage_of(f.rank)} (rank {f.rank})" if staged else ""
        if f.target == "activation" and f.tensor is None:
            continue  # the stage's boundary activation
        if f.target == "activation":
            if f.tensor not in modules:
                raise ConfigError("fault", f"{f}: activation flips name a module; {f.tensor!r} is not one of "
                                  f"{', '.join(sorted(modules))}{where}")
            continue
        if f.target == "buffer":
            buffers = buffer_tensors(config, f.rank if staged else None)
            if f.tensor not in buffers:
                raise ConfigError("fault", f"{f}: buffer flips name a floating-point buffer (batch norm's running "
                                  f"statistics); {f.tensor!r} is not one{where}; allowed "
                                  f"{', '.join(buffers) or 'none: the model has no such buffer'}")
            params = buffers
        if f.tensor not in params:
            raise ConfigError("fault", f"{f}: {f.tensor!r} is not a parameter of the model{where}; allowed "
                              f"{', '.join(params)}")
        tensor = params[f.tensor]
        if f.index is not None and f.index >= tensor.numel():
            raise ConfigError("fault", f"{f}: index {f.index} is out of range: {f.tensor} has {tensor.numel()} "
                              "elements (flat index)")
        if f.bit is not None and f.bit >= width(tensor.dtype):
            raise ConfigError("fault", f"{f}: bit {f.bit} is out of range for {str(tensor.dtype)[6:]}: allowed "
                              f"0..{width(tensor.dtype) - 1} (LSB-0)")


def rank_holding(config: RunConfig, name: str) -> int:
    """The first rank whose model holds parameter or module ``name``: rank 0 for data-parallel and gossip runs
    (every rank a replica), the first replica of the stage that holds it in pipeline and hybrid runs."""
    if not config.mode.staged:
        return 0
    for stage in range(config.pipeline_stages):
        rank = stage * config.replicas
        params, modules = model_tensors(config, rank)
        if name in params or name in modules:
            return rank
    raise ConfigError("fault", f"{name!r} is neither a parameter nor a module of the model")
