"""Per-bit sensitivity of a checkpoint: flip one bit of a random element, resume training, classify.

A trial resumes in this process on one replica. That is the same computation as the data-parallel run: the
gradient of a step is that of the global batch whatever the number of ranks (up to float summation order), and
the batch sequence depends only on (seed, step). A pipeline (or hybrid) checkpoint resumes as GPipe computes:
the batch in the run's micro-batches, gradients summed (batch norm normalises each micro-batch on its own).
So hundreds of trials take seconds, where a multi-process resume per trial would pay the ranks' start-up each
time.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from workbench.base import checkpoint as ckpt
from workbench.config.run import RunConfig
from workbench.faults.bitflip import apply_masks, bit_field
from workbench.faults.outcomes import classify_values, outcome_shares  # noqa: F401 - the study's figures
from workbench.rank.optim import make_optimizer
from workbench.results.trials import SENSITIVITY_FILE, load_trials, save_trials  # noqa: F401 - its files
from workbench.workloads.apoptosis.rule import resize_to
from workbench.workloads.data import BatchSequence, load_dataset
from workbench.workloads.models import build_model


class LocalResume:
    """Resume a checkpoint of a run in-process and train ``steps`` more steps; returns (accuracy, losses)."""

    def __init__(self, path: str | os.PathLike, config: RunConfig | None = None) -> None:
        self.base = ckpt.load(path, check=False)
        self.config = config or RunConfig.from_dict({**self.base.config, "resume": None, "faults": []})
        self.data = load_dataset(self.config)
        self.batches = BatchSequence(len(self.data.y_train), self.config.batch_size, self.config.seed)
        # a pipeline's checkpoint resumes as a pipeline computes: micro-batch by micro-batch
        self.micro_batches = self.config.micro_batches if self.config.mode.staged else 1
        torch.set_num_threads(1)

    def run(self, steps: int, model_state: dict[str, torch.Tensor] | None = None) -> tuple[float, list[float]]:
        cfg = self.config
        model = build_model(cfg, self.data.input_shape, self.data.num_classes)
        state = model_state or self.base.model
        resize_to(model, {k: v.shape for k, v in state.items()})  # a checkpoint of a model shrunk by apoptosis
        model.load_state_dict(state)
        params = dict(model.named_parameters())
        optimizer = make_optimizer(cfg.optimizer, list(params.values()), cfg.lr, cfg.momentum)  # the ranks' own
        for name, state in self.base.optimizer.items():
            if name in params and state:
                optimizer.state[params[name]] = {k: v.clone() for k, v in state.items()}
        losses = []
        with np.errstate(all="ignore"):
            for step in range(self.base.step, self.base.step + steps):
                idx = torch.from_numpy(self.batches(step))
                optimizer.zero_grad(set_to_none=True)
                x, y = self.data.train_batch(idx, step)
                loss = 0.0
                for xs, ys in zip(x.chunk(self.micro_batches), y.chunk(self.micro_batches)):
                    part = F.cross_entropy(model(xs), ys, reduction="sum") / len(y)
                    part.backward()  # GPipe: the gradient summed over micro-batches (batch norm per micro-batch)
                    loss += part.item()
                optimizer.step()
                losses.append(loss)
            model.eval()
            with torch.no_grad():
                accuracy = (model(self.data.x_test).argmax(1) == self.data.y_test).float().mean().item()
        if not all(math.isfinite(v) for v in losses):
            accuracy = float("nan")
        return accuracy, losses


def bit_sensitivity(path: str | os.PathLike, bits: Iterable[int] = range(32), trials: int = 3, steps: int = 30,
                    datasets: Iterable[str] | None = None, tolerance: float = 0.01, seed: int = 0) -> Any:
    """For each bit, ``trials`` flips of that bit in a random element of the checkpoint's weights (default
    every ``model/*weight``), each resumed for ``steps`` steps and classified against the unflipped resume.
    Returns a DataFrame: bit, field, trial, dataset, index, old, new, outcome, accuracy."""
    import pandas as pd

    resume = LocalResume(path)
    golden_accuracy, _ = resume.run(steps)
    names = list(datasets) if datasets is not None else [n for n in resume.base.model if n.endswith("weight")]
    rng = np.random.default_rng(seed)
    rows = []
    for bit in bits:
        for trial in range(trials):
            name = names[int(rng.integers(len(names)))]
            state = {k: v.clone() for k, v in resume.base.model.items()}
            tensor = state[name].contiguous()
            state[name] = tensor
            flip = apply_masks(tensor, [int(rng.integers(tensor.numel()))], [1 << bit], name)[0]
            accuracy, losses = resume.run(steps, state)
            rows.append({"bit": bit, "field": bit_field(tensor.dtype, bit), "trial": trial, "dataset": name,
                         "index": flip.index, "old": flip.old, "new": flip.new, "accuracy": accuracy,
                         "outcome": classify_values(accuracy, golden_accuracy, losses, True, tolerance)})
    frame = pd.DataFrame(rows)
    frame.attrs["golden_accuracy"] = golden_accuracy
    return frame
