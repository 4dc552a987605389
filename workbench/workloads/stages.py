"""Pipeline stage planning: where a pipeline or hybrid run's model is cut into stages, checked against the real
model before any process starts, and the tensors each rank's stage holds."""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from workbench.config.run import RunConfig



def _built(config: RunConfig) -> tuple[torch.nn.Module, tuple[int, ...]]:
    """(the run's model, the dataset's input shape), built here without touching the caller's RNG."""
    from workbench.workloads.data import load_dataset
    from workbench.workloads.models import build_model

    data = load_dataset(config)
    with torch.random.fork_rng():
        return build_model(config, data.input_shape, data.num_classes), tuple(data.input_shape)


def _model(config: RunConfig) -> torch.nn.Module:
    return _built(config)[0]


# measured cuts by (model structure, input shape, stages): one measurement per model in this process, so the
# start, the flip checks and a campaign's flip plan (workbench.campaigns.studies.campaign) agree on where each tensor
# lives
_measured_cuts: dict[tuple[str, tuple[int, ...], int], list[int]] = {}


def _cuts(config: RunConfig, model: torch.nn.Module, input_shape: tuple[int, ...]) -> list[int]:
    from workbench.workloads.models import block_costs, cuts_of, split_stages, stages_from_cuts

    if config.stage_cuts is not None:
        stages_from_cuts(model, config.stage_cuts)  # in range of the model, each stage holding parameters
        return list(config.stage_cuts)
    key = (repr(model), input_shape, config.pipeline_stages)
    if key not in _measured_cuts:
        split_stages(model, config.pipeline_stages)  # too few layers: refused before the measurement
        costs = block_costs(model, input_shape)
        _measured_cuts[key] = cuts_of(split_stages(model, config.pipeline_stages, costs=costs))
    return list(_measured_cuts[key])


def stage_cuts(config: RunConfig) -> list[int] | None:
    """Where a pipeline or hybrid run's model is cut into stages (None for other modes): ``config.stage_cuts``
    when given (checked against the model), else a cut balanced by measured forward+backward time of each
    top-level module (:func:`workbench.workloads.models.block_costs`), measured once per model in this process."""
    if not config.mode.staged:
        return None
    model, input_shape = _built(config)
    return _cuts(config, model, input_shape)


def _held_model(config: RunConfig, rank: int | None) -> torch.nn.Module:
    """The run's model, or the pipeline stage ``rank`` holds."""
    from workbench.workloads.models import stage_module, stages_from_cuts

    model, input_shape = _built(config)
    if rank is not None and config.mode.staged:
        stages = stages_from_cuts(model, _cuts(config, model, input_shape))
        model = stage_module(model, stages[config.stage_of(rank)])
    return model


def model_tensors(config: RunConfig, rank: int | None = None) -> tuple[dict[str, torch.Tensor], set[str]]:
    """(parameters by name, module names) of the run's model, or of the pipeline stage ``rank`` holds."""
    model = _held_model(config, rank)
    return dict(model.named_parameters()), {name for name, _ in model.named_modules() if name}


def buffer_tensors(config: RunConfig, rank: int | None = None) -> dict[str, torch.Tensor]:
    """Floating-point buffers by name (batch norm's running statistics) of the model, or of ``rank``'s stage."""
    return {name: b for name, b in _held_model(config, rank).named_buffers() if b.is_floating_point()}


def check_model(config: RunConfig) -> RunConfig:
    """Pipeline and hybrid runs: the model must split into the requested stages; apoptosis: the model must have
    layers it can shrink (ConfigError otherwise). Returns the config with ``stage_cuts`` filled (pipeline and
    hybrid: :func:`stage_cuts`, measured here once so every rank cuts the model the same way)."""
    cuts = stage_cuts(config)
    if cuts is not None and config.stage_cuts is None:
        config = copy.copy(config)  # validated already: no second __post_init__ (it re-verifies a resume file)
        config.stage_cuts = cuts
    if config.apoptosis is not None:
        from workbench.workloads.apoptosis.rule import require_pairs

        require_pairs(_model(config), name=f"--model {config.model}")
    return config
