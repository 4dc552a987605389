"""Data-parallel gradient exchange: bucketed asynchronous allreduce overlapped with the backward pass, and an
update applied per bucket as each bucket's allreduce completes.

Not DDP with a comm hook: DDP binds its reducer to one process group for its lifetime, and destroying that group
while the model lives aborts the process; here the group is the current generation's, and a failed exchange can
be undone or retried bucket by bucket. A step: ``begin(stats, ids)``, backward (each full bucket's allreduce
starts, in the same order on every rank), then ``finish()``; statistics and batch norm's running statistics ride
in the first bucket, the samples' count and id checksum in the last (what entered every bucket). Rollback undoes
applied buckets; forward and shrink ``retry()`` among the survivors. Protocol and bucket layout: docs/internals.md.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from workbench.rank import state as st
from workbench.rank.comm import Comm
from workbench.rank.optim import Optimizer, make_optimizer
from workbench.rank.soft_errors import ALARM_SLOTS
from workbench.workloads.data import SAMPLE_SLOTS, sample_figures

STATS_SLOTS = 3 + ALARM_SLOTS  # loss sum, correct predictions, samples, then the detectors' alarm slots
# buckets per step when RunConfig.buckets is None: the fewest that make forward differ from shrink. Each further
# bucket's allreduce costs ~0.3-1 ms on 2 busy cores, hidden by no backward pass there: 4 buckets measured
# 1.26-1.30x plain DDP's step (mlp, cnn), 1.08x (lenet5); 2 buckets 0.92-1.00x (docs/permanent-faults.md)
DEFAULT_BUCKETS = 2
# how long a bucket applied on completion may still complete once a newer generation is announced (its sum holds
# every share when the dead member finished it; a rank slowed by load sees the announcement first)
_BUCKET_GRACE_S = 0.05


def bucket_layout(sizes: list[int], buckets: int | None, bucket_cap_mb: float) -> list[list[int]]:
    """Indices into ``sizes`` (parameter sizes in backward order) of each bucket: ``buckets`` (default
    ``DEFAULT_BUCKETS``) runs cut at parameter boundaries so that the largest is as small as it can be (balanced),
    then cut further where a run exceeds the cap (a single parameter over the cap is a bucket of its own); never
    more buckets than parameters."""
    if not sizes:
        return [[]]
    count = min(len(sizes), buckets or DEFAULT_BUCKETS)
    low, high = max(sizes), sum(sizes)  # binary search: the smallest largest run that `count` runs can reach
    while low < high:
        mid = (low + high) // 2
        low, high = (low, mid) if len(_runs(sizes, mid)) <= count else (mid + 1, high)
    groups = _runs(sizes, min(low, max(1, int(bucket_cap_mb * 2**20 / 4))))
    while len(groups) < count:  # a dominant parameter left fewer runs: halve the largest run that has several
        k = max((g for g in range(len(groups)) if len(groups[g]) > 1), key=lambda g: sum(sizes[i] for i in groups[g]))
        run = groups[k]
        cut = min(range(1, len(run)), key=lambda c: max(sum(sizes[i] for i in run[:c]), sum(sizes[i] for i in run[c:])))
        groups[k: k + 1] = [run[:cut], run[cut:]]
    return groups


def _runs(sizes: list[int], limit: int) -> list[list[int]]:
    """Greedy runs of consecutive parameters, each at most ``limit`` unless one parameter alone is larger."""
    groups: list[list[int]] = [[]]
    total = 0
    for i, size in enumerate(sizes):
        if groups[-1] and total + size > limit:
            groups.append([])
            total = 0
        groups[-1].append(i)
        total += size
    return groups


@dataclass
class Bucket:
    index: int
    names: list[str]
    params: list[nn.Parameter]
    optimizer: Optimizer
    buffer: torch.Tensor
    pending: int = 0
    work: dist.Work | None = None
    launched: bool = False
    views: list[torch.Tensor] = field(default_factory=list)
    local: torch.Tensor | None = None  # this rank's own gradient of the step, before the allreduce
    tail: int = 0  # slots after the gradients: running statistics and stats (first), sample figures (last)
    overlapped: bool = False  # this step's update was applied during the backward pass


class GradientExchange:
    def __init__(self, model: nn.Module, comm: Comm, optimizer: str, lr: float, momentum: float,
                 bucket_cap_mb: float, update_per_bucket: bool = True, keep_local: bool = False,
                 snapshot_buckets: bool = False, buckets: int | None = None) -> None:
        self.model = model
        self.comm = comm
        self.update_per_bucket = update_per_bucket
        self.keep_local = keep_local
        self.snapshot_buckets = snapshot_buckets
        self.applied = 0  # buckets whose update of the current step is applied
        self.overlapped = 0  # of those, applied while the backward pass went on
        self._running_due = False  # bucket 0 applied during the backward pass: its running statistics not yet taken
        self._deferred: Exception | None = None  # raised in a gradient hook: finish() raises it (_apply_completed)
        # batch norm's running statistics ride at the end of the first bucket, before the stats: averaged over the
        # members that contributed (a count slot), so replicas stay identical at no extra collective
        self.running = st.RunningStats(model)
        self.tail = STATS_SLOTS + self.running.slots
        self.running_before: list[torch.Tensor] | None = None  # rollback: the running statistics at step start
        named = [(n, p) for n, p in model.named_parameters() if p.requires_grad][::-1]  # backward: last layers first
        groups = [[named[i] for i in group]
                  for group in bucket_layout([p.numel() for _, p in named], buckets, bucket_cap_mb)]
        self.buckets: list[Bucket] = []
        self._bucket_of: dict[nn.Parameter, Bucket] = {}
        self._hooks: list[Any] = []  # removed by close(): a rebuilt exchange leaves no hook of this one behind
        for i, group in enumerate(groups):
            params = [p for _, p in group]
            # the last bucket's allreduce is the one launched after the fault point: it carries the samples'
            # count and checksum, so they say what entered every bucket (in bucket 0 too when it is the only one,
            # before the running statistics and the stats)
            tail = (self.tail if i == 0 else 0) + (SAMPLE_SLOTS if i == len(groups) - 1 else 0)
            numel = sum(p.numel() for p in params) + tail
            bucket = Bucket(i, [n for n, _ in group], params, make_optimizer(optimizer, params, lr, momentum),
                            torch.zeros(numel, device=params[0].device if params else None), tail=tail)
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
                self._hooks.append(p.register_post_accumulate_grad_hook(self._grad_ready))
        self._next_launch = 0
        self.before_last_launch: Callable[[], None] | None = None  # fault injection point
        self.on_launch: Callable[[Bucket], None] | None = None  # just before a bucket's allreduce (grad flips)
        self.on_reduced: Callable[[Bucket], None] | None = None  # after it, before the update (checks, grad_local)
        # before a bucket's update changes its parameters and optimizer state in place (a checkpoint's copy)
        self.before_update: Callable[[Bucket], None] | None = None

    def close(self) -> None:
        """Detach from the model's parameters (before an exchange is rebuilt for new shapes or a new device)."""
        for hook in self._hooks:
            hook.remove()
        self._hooks = []

    # -- one step ---------------------------------------------------------------------------------------------
    def begin(self, stats: torch.Tensor, ids: np.ndarray) -> None:
        """A step's exchange: ``stats`` (loss sum, correct, samples, alarm slots) into the first bucket, the
        count and checksum of ``ids`` (the samples this rank's gradient is of) into the last."""
        for bucket in self.buckets:
            bucket.buffer.zero_()
            bucket.pending = len(bucket.params)
            bucket.work = None
            bucket.launched = False
            bucket.local = None
            bucket.overlapped = False
        self.applied = self.overlapped = 0
        self._running_due = False
        self._deferred = None
        first = self.buckets[0].buffer
        first[-STATS_SLOTS:] = stats
        self.running.pack(first[-self.tail: -STATS_SLOTS])  # after the forward: this step's statistics
        self._samples_region()[:] = torch.tensor(sample_figures(ids))
        self._next_launch = 0

    def _samples_region(self) -> torch.Tensor:
        last = self.buckets[-1]
        start = last.buffer.numel() - last.tail
        return last.buffer[start: start + SAMPLE_SLOTS]

    def sample_figures(self) -> torch.Tensor:
        """The step's summed sample figures (count, the id checksum's two halves: workbench.workloads.data) as the
        last bucket's reduction carried them: the samples whose gradients entered every bucket of the update (a
        forward retry's survivors, not bucket 0's full batch applied before the fault)."""
        return self._samples_region().clone()

    def save_running(self) -> None:
        """Before the step's forward (rollback): the running statistics to return to if the step is undone."""
        if self.running.every:
            self.running_before = self.running.copy()

    def gradients(self, bucket: Bucket) -> torch.Tensor:
        """The gradient part of a bucket's buffer (the first bucket also carries running statistics and stats, the
        last the sample figures)."""
        return bucket.buffer[: bucket.buffer.numel() - bucket.tail] if bucket.tail else bucket.buffer

    def _grad_ready(self, param: nn.Parameter) -> None:
        bucket = self._bucket_of[param]
        bucket.pending -= 1
        if bucket.pending == 0:
            self._launch_ready()
        if self.update_per_bucket and self.applied < self._next_launch and self._deferred is None:
            self._apply_completed()

    def _apply_completed(self) -> None:
        """During the backward pass: apply, in launch order, every bucket whose allreduce has completed; stop at
        the first one still running (never blocks). An error of the soft-error hook (a detector's alarm) is kept
        for ``finish`` to raise once every bucket is launched: a member that raised here would skip launches its
        peers make (they may see the alarm only in ``finish``), and their collectives would no longer pair up."""
        while self.applied < self._next_launch:
            bucket = self.buckets[self.applied]
            if not bucket.work.is_completed():
                return
            self._wait(bucket)
            try:
                if self.on_reduced is not None:
                    self.on_reduced(bucket)
            except Exception as exc:  # noqa: BLE001 - raised again by finish()
                self._deferred = exc
                return
            bucket.overlapped = True
            self.overlapped += 1
            self._apply(bucket, in_backward=True)

    def _reduced(self, bucket: Bucket) -> None:
        """Wait for the bucket's allreduce, then the soft-error hook."""
        self._wait(bucket)
        if self.on_reduced is not None:
            self.on_reduced(bucket)

    def _wait(self, bucket: Bucket) -> None:
        """A completed allreduce is taken even if a newer generation was announced meanwhile (its sum holds every
        member's share); otherwise the comm's wait (which notices a new generation)."""
        if bucket.work.is_completed():
            try:
                bucket.work.wait()
            except RuntimeError:
                self.comm.wait(bucket.work)  # failed: the comm's handling (a new generation follows)
        else:  # an update applied per bucket takes a sum that completes just after a newer generation came
            self.comm.wait(bucket.work, grace=_BUCKET_GRACE_S if self.update_per_bucket else 0.0)

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
            if self.on_launch is not None:
                self.on_launch(bucket)
            if self.keep_local:
                bucket.local = bucket.buffer.clone()
            bucket.work = self.comm.allreduce(bucket.buffer)
            bucket.launched = True
            self._next_launch += 1

    def wait_launched(self) -> None:
        """Wait for every bucket started so far (used by the fault point: die after those completed)."""
        for bucket in self.buckets:
            if bucket.launched and bucket.work is not None:
                self.comm.wait(bucket.work)

    def finish(self) -> torch.Tensor:
        """Complete the exchange and apply the update; returns the global stats (loss sum, correct, samples)."""
        self._launch_ready(force=True)
        if self._deferred is not None:
            deferred, self._deferred = self._deferred, None
            raise deferred
        if self.update_per_bucket:
            self.settle()
            for bucket in self.buckets[self.applied:]:  # the ones not applied during the backward pass, in order
                self._reduced(bucket)
                self._apply(bucket)
        else:
            for bucket in self.buckets:
                self._reduced(bucket)
            for bucket in self.buckets:
                self._apply(bucket)
        return self.buckets[0].buffer[-STATS_SLOTS:].clone()

    def _apply(self, bucket: Bucket, in_backward: bool = False) -> None:
        if self.before_update is not None:
            self.before_update(bucket)
        bucket.optimizer.step(undoable=self.snapshot_buckets)
        if bucket.index == 0:
            if in_backward:
                self._running_due = True  # batch norm's backward may still read the running buffers
            else:
                self.running.unpack(bucket.buffer[-self.tail: -STATS_SLOTS])
        self.applied += 1

    def settle(self) -> None:
        """After the backward pass (or a failure that ended it): take bucket 0's running statistics if its update
        was applied during the pass. A recovery calls it before the members compare their states."""
        if self._running_due:
            self._running_due = False
            self.running.unpack(self.buckets[0].buffer[-self.tail: -STATS_SLOTS])

    def drain(self) -> None:
        """Wait for every allreduce still running (before the buckets are reused), whatever its outcome."""
        for bucket in self.buckets:
            if bucket.work is not None:
                try:
                    self.comm.wait(bucket.work)
                except Exception:  # noqa: BLE001 - only the wait matters here
                    pass

    def optimizer_slots(self) -> list[tuple[str, dict]]:
        """(parameter name, the optimizer's live state dict of that parameter) for every parameter, in order."""
        return [(name, bucket.optimizer.state[param]) for bucket in self.buckets
                for name, param in zip(bucket.names, bucket.params)]

    def optimizer_state_of(self, name: str) -> dict[str, torch.Tensor]:
        for bucket in self.buckets:
            if name in bucket.names:
                return bucket.optimizer.state.get(bucket.params[bucket.names.index(name)], {})
        raise KeyError(name)

    def restore_applied(self) -> int:
        """Undo the updates applied so far in this step (rollback); returns how many buckets were undone."""
        undone = self.applied
        with torch.no_grad():
            for bucket in self.buckets[: self.applied]:
                bucket.optimizer.undo()
            self._running_due = False
            if self.running_before is not None:  # the step's forward moved them, whatever was applied
                self.running.restore(self.running_before)
                self.running_before = None
        self.applied = 0
        return undone

    def retry(self, first: int, have_local: bool) -> torch.Tensor:
        """Finish a failed step in the current group: allreduce buckets ``first..`` again, each rank contributing
        its kept local gradient (zeros if it has none, e.g. a replacement rank), and apply them."""
        self.settle()
        for bucket in self.buckets[first:]:
            if have_local and bucket.local is not None:
                bucket.buffer.copy_(bucket.local)
            else:
                bucket.buffer.zero_()
            self.comm.wait(self.comm.allreduce(bucket.buffer))
        self.applied = first
        for bucket in self.buckets[first:]:
            self._apply(bucket)
        return self.buckets[0].buffer[-STATS_SLOTS:].clone()

    def traffic(self) -> tuple[int, int]:
        """Messages and bytes this rank sends in one step's exchange, counted on gloo's ring allreduce (each bucket:
        a reduce-scatter and an allgather, 2(p-1) messages of 1/p of the bucket each)."""
        return ring_allreduce_traffic([b.buffer.numel() * b.buffer.element_size() for b in self.buckets],
                                      self.comm.size)

    # -- state ------------------------------------------------------------------------------------------------
    def optimizer_states(self) -> list[dict]:
        return [b.optimizer.state_dict() for b in self.buckets]

    def load_optimizer_states(self, states: list[dict]) -> None:
        for bucket, state in zip(self.buckets, states):
            bucket.optimizer.load_state_dict(state)

    def named_optimizer_state(self) -> dict[str, dict[str, torch.Tensor]]:
        """Optimizer state per parameter name (checkpoint layout ``optimizer/<name>/<key>``), cloned."""
        named = {}
        for bucket in self.buckets:
            named.update(st.named_optimizer_state(bucket.optimizer, list(zip(bucket.names, bucket.params))))
        return named

    def load_named_optimizer_state(self, named: dict[str, dict[str, torch.Tensor]]) -> None:
        for bucket in self.buckets:
            st.load_named_optimizer_state(bucket.optimizer, list(zip(bucket.names, bucket.params)), named)


def ring_allreduce_traffic(bucket_bytes: list[int], size: int) -> tuple[int, int]:
    """(messages, bytes) one rank sends for ring allreduces of buckets of these sizes over ``size`` ranks."""
    if size <= 1:
        return 0, 0
    return 2 * (size - 1) * len(bucket_bytes), sum(2 * (size - 1) * -(-n // size) for n in bucket_bytes)


def clone_state(optimizer: Optimizer) -> dict:
    """A copy of the optimizer's state dict whose tensors do not change when the optimizer steps."""
    state = optimizer.state_dict()
    return {"state": {k: {n: (v.clone() if torch.is_tensor(v) else v) for n, v in s.items()}
                      for k, s in state["state"].items()},
            "param_groups": [dict(g) for g in state["param_groups"]]}
