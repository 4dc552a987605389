"""What the peers' rank processes share with ours: the control channel, data, model, step reports, planned faults.

A peer rank trains on the same data as our data-parallel ranks (the global batch of step s is
``BatchSequence(step s)``) but the way its system's users shard it: rank r of the initial world always takes
share r (torchft's ``DistributedSampler`` by replica group, torchrun's ``DistributedSampler`` by rank), so while a
replica is missing its share is not trained (torchft) or the world is restarted (torchrun).
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import numpy as np
import torch

from workbench.base import protocol
from workbench.config import lr_schedule
from workbench.config.run import FaultSpec, RunConfig
from workbench.faults import kinds
from workbench.rank.channel import Channel
from workbench.rank.readings import evaluate
from workbench.workloads.data import BatchSequence, load_dataset, sample_checksum, shard
from workbench.workloads.models import build_model


class PeerRank:
    def __init__(self, config: RunConfig, channel: Channel) -> None:
        torch.manual_seed(config.seed)
        self.config = config
        self.channel = channel
        self.data = load_dataset(config)
        self.batches = BatchSequence(len(self.data.y_train), config.batch_size, config.seed)
        self.model = build_model(config, self.data.input_shape, self.data.num_classes)
        self.step_faults: dict[int, FaultSpec] = {}
        self.ids: np.ndarray | None = None  # the sample ids of the batch last drawn (``batch``)

    def wait_generation(self) -> dict[str, Any]:
        while self.channel.latest_generation is None:
            self.channel.wake.wait(0.5)
        assignment = self.channel.latest_generation
        self.step_faults = {f.step: f for f in map(FaultSpec.parse, assignment.get("faults", []))
                            if kinds.of(f).peers}  # the kinds a peer's rank fires itself (a signal)
        return assignment

    def batch(self, step: int, label: int) -> tuple[torch.Tensor, torch.Tensor]:
        self.ids = shard(self.batches(step), label, self.config.world_size)
        return self.data.train_batch(self.ids, step)

    def schedule_lr(self, optimizer: Any, step: int) -> None:
        """The optimizer takes ``lr_schedule``'s rate for ``step`` (as our ranks do; peers have no resize rule)."""
        if self.config.lr_schedule != "constant":
            factor = lr_schedule.factor(self.config.lr_schedule, step, self.config.steps)
            lr_schedule.set_lr([optimizer], self.config.lr * factor)

    def fault_point(self, step: int) -> None:
        """A planned kill/hang of this step fires here: after the gradient exchange, before the update."""
        fault = self.step_faults.pop(step, None)
        if fault is not None:
            self.channel.send(protocol.message("fault", kind=fault.kind, step=step, t=time.time()))
            os.kill(os.getpid(), getattr(signal, kinds.of(fault).signal))

    def report(self, step: int, gen: int, loss: torch.Tensor, out: torch.Tensor, y: torch.Tensor, started: float,
               **extra: Any) -> None:
        # this replica's own batch (``samples``) and the checksum of its ids (``batch``: the batch it trained)
        figures = {"loss": loss.item(), "train_acc": (out.argmax(1) == y).float().mean().item(), "samples": len(y),
                   "sample_checksum": sample_checksum(self.ids), "step_time": time.perf_counter() - started,
                   "t": time.time(), **extra}
        if (step + 1) % self.config.eval_interval == 0 or step + 1 == self.channel.end(self.config.steps):
            figures.update(evaluate(self.model, self.data))
        self.channel.send(protocol.message("step", step=step, gen=gen, **figures))

