"""Data-parallel gradient exchange: bucketed asynchronous allreduce overlapped with the backward pass, and an
update applied per bucket as each bucket's allreduce completes.

Why not ``torch.nn.parallel.DistributedDataParallel`` with a comm hook: DDP binds its reducer to one process
group for its lifetime, and destroying a group while a DDP model that uses it is alive aborts the process
(DESIGN §3). Here the group is whatever the current generation's is, and a failed exchange can be undone or
retried bucket by bucket (rollback vs forward recovery need exactly this).

Protocol of one step:
  1. ``begin(stats)``: grads cleared; ``stats`` (loss sum, correct, count of this rank's shard) ride in the first
     bucket, so the global loss costs no extra collective.
  2. backward: a post-accumulate-grad hook per parameter; when all grads of a bucket are in, the bucket is
     flattened and its allreduce started. Buckets start in a fixed order on every rank (gloo requires the same
     collective order everywhere), gradients are summed: the loss is ``sum / global_batch`` on each rank, so the
     sum is the exact gradient of the global batch whatever the world size.
  3. ``finish()``: wait for each bucket in order, copy back, and step that bucket's optimizer at once.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.distributed as dist
from torch import nn

from workbench.rank.comm import Comm

STATS_SLOTS = 3  # loss sum, correct predictions, samples


@dataclass
class Bucket:
    index: int
    names: list[str]
    params: list[nn.Parameter]
    optimizer: torch.optim.Optimizer
    buffer: torch.Tensor
    pending: int = 0
    work: dist.Work | None = None
    launched: bool = False
    views: list[torch.Tensor] = field(default_factory=list)


def make_optimizer(kind: str, params: list[nn.Parameter], lr: float, momentum: float) -> torch.optim.Optimizer:
    if kind == "adam":
        return torch.optim.Adam(params, lr=lr)
    return torch.optim.SGD(params, lr=lr, momentum=momentum)


class DataParallel:
    def __init__(self, model: nn.Module, comm: Comm, optimizer: str, lr: float, momentum: float,
                 bucket_cap_mb: float) -> None:
        self.model = model
        self.comm = comm
        named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        cap = max(1, int(bucket_cap_mb * 2**20 / 4))
        groups: list[list[tuple[str, nn.Parameter]]] = [[]]
        for name, param in reversed(named):  # backward produces the last layers' grads first
            if groups[-1] and sum(p.numel() for _, p in groups[-1]) + param.numel() > cap:
                groups.append([])
            groups[-1].append((name, param))
        self.buckets: list[Bucket] = []
        self._bucket_of: dict[nn.Parameter, Bucket] = {}
        for i, group in enumerate(groups):
            params = [p for _, p in group]
            numel = sum(p.numel() for p in params) + (STATS_SLOTS if i == 0 else 0)
            bucket = Bucket(i, [n for n, _ in group], params, make_optimizer(optimizer, params, lr, momentum),
                            torch.zeros(numel))
            offset = 0
            for p in params:
                # gradients live in the bucket (DDP's gradient_as_bucket_view): autograd accumulates into the
                # view in place, the allreduce sums the bucket in place, the optimizer reads the result: no copies
                view = bucket.buffer[offset: offset + p.numel()].view_as(p)
                bucket.views.append(view)
                p.grad = view
                offset += p.numel()
            self.buckets.append(bucket)
            for p in params:
                self._bucket_of[p] = bucket
                p.register_post_accumulate_grad_hook(self._grad_ready)
        self._next_launch = 0
        self.before_last_launch: Callable[[], None] | None = None  # fault injection point

    # -- one step ---------------------------------------------------------------------------------------------
    def begin(self, stats: torch.Tensor) -> None:
        for bucket in self.buckets:
            bucket.buffer.zero_()
            bucket.pending = len(bucket.params)
            bucket.work = None
            bucket.launched = False
        self.buckets[0].buffer[-STATS_SLOTS:] = stats
        self._next_launch = 0

    def _grad_ready(self, param: nn.Parameter) -> None:
        bucket = self._bucket_of[param]
        bucket.pending -= 1
        if bucket.pending == 0:
            self._launch_ready()

    def _launch_ready(self, force: bool = False) -> None:
        while self._next_launch < len(self.buckets):
            bucket = self.buckets[self._next_launch]
            if bucket.pending > 0 and not force:
                return
            if bucket.index == len(self.buckets) - 1 and self.before_last_launch is not None:
                self.before_last_launch()
            for p, view in zip(bucket.params, bucket.views):
                if p.grad is not view:  # someone replaced the gradient tensor: bring it back into the bucket
                    view.copy_(p.grad if p.grad is not None else torch.zeros_like(view))
                    p.grad = view
            bucket.work = self.comm.allreduce(bucket.buffer)
            bucket.launched = True
            self._next_launch += 1

    def wait_launched(self) -> None:
        """Wait for every bucket started so far (used by the fault point: die after those completed)."""
        for bucket in self.buckets:
            if bucket.launched and bucket.work is not None:
                self.comm.wait(bucket.work)

    def finish(self) -> torch.Tensor:
        """Complete the exchange and apply the update bucket by bucket; returns the global stats."""
        self._launch_ready(force=True)
        for bucket in self.buckets:
            self.comm.wait(bucket.work)
            bucket.optimizer.step()
        return self.buckets[0].buffer[-STATS_SLOTS:].clone()

    # -- state ------------------------------------------------------------------------------------------------
    def optimizer_states(self) -> list[dict]:
        return [b.optimizer.state_dict() for b in self.buckets]

    def load_optimizer_states(self, states: list[dict]) -> None:
        for bucket, state in zip(self.buckets, states):
            bucket.optimizer.load_state_dict(state)
