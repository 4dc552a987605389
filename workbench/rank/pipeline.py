"""Model-parallel pipeline (GPipe) and hybrid parallelism: stages of the model on different ranks.

The ``nn.Sequential`` is cut into ``S`` stages at ``config.stage_cuts``; rank ``k`` holds stage ``k // R`` (``R``
replicas per stage; hybrid splits the global batch into lanes over a stage's replicas). A step: all forwards
micro-batch by micro-batch, all backwards in reverse, then the stage's allreduce (hybrid), the statistics
allreduce that commits the step, and each stage's update. Failures: ``checkpoint_restart`` and ``reinit`` bring
the world back from a gathered checkpoint or snapshot; in hybrid a dead replica is shrunk away inside its stage
(``shrink``, ``regrow``) and the step redone by the survivors. Details: docs/internals.md and
docs/parallel-modes.md.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from workbench import strategies
from workbench.config.run import FaultSpec, RunConfig
from workbench.faults import kinds
from workbench.rank import state as st
from workbench.rank import transfer
from workbench.rank.base import BaseTrainer
from workbench.rank.channel import cpu_time
from workbench.rank.comm import Comm, CommError
from workbench.rank.gradient_exchange import ring_allreduce_traffic
from workbench.rank.soft_errors import Injector
from workbench.workloads.data import SAMPLE_SLOTS, sample_figures
from workbench.workloads.models import boundary_shapes, run_stages, stage_module


class Layout:
    """Who computes what in one generation: stage of each member, and the owner of each (stage, lane)."""

    def __init__(self, config: RunConfig, members: list[int], position: int, lanes: int | None = None) -> None:
        self.stages = config.pipeline_stages
        self.lanes = lanes or config.replicas  # a resized hybrid run: its generation says how many
        self.stage_members = [[p for p, label in enumerate(members) if config.stage_of(label) == s]
                              for s in range(self.stages)]
        empty = [s for s, m in enumerate(self.stage_members) if not m]
        if empty:
            raise CommError(f"stages {empty} have no member left in generation ranks {members}")
        self.position = position
        self.stage = config.stage_of(members[position])
        self.stage_rank = self.stage_members[self.stage].index(position)

    def owner(self, stage: int, lane: int) -> int:
        members = self.stage_members[stage]
        return members[lane % len(members)]

    @property
    def my_lanes(self) -> list[int]:
        return [lane for lane in range(self.lanes) if self.owner(self.stage, lane) == self.position]

    def peers(self) -> list[int]:
        """Members this one exchanges activations and gradients with in this generation."""
        peers = set()
        for lane in range(self.lanes):
            for s in range(self.stages - 1):
                a, b = self.owner(s, lane), self.owner(s + 1, lane)
                if self.position in (a, b):
                    peers.add(b if a == self.position else a)
        return sorted(peers)

    @property
    def first(self) -> bool:
        return self.stage == 0

    @property
    def last(self) -> bool:
        return self.stage == self.stages - 1


class StagePipeline:
    """The GPipe schedule of one stage member: forward and backward of its lanes' micro-batches."""

    def __init__(self, stage: nn.Module, layout: Layout, comm: Comm, in_shape: tuple[int, ...],
                 out_shape: tuple[int, ...]) -> None:
        self.stage = stage
        self.layout = layout
        self.comm = comm
        self.in_shape = in_shape
        self.out_shape = out_shape
        self.sends: list[tuple[dist.Work, torch.Tensor]] = []
        self.messages = 0
        self.bytes_sent = 0
        self.between_phases: Callable[[], None] | None = None  # planned faults fire here

    def _send(self, tensor: torch.Tensor, dst: int) -> None:
        tensor = tensor.contiguous()
        self.sends.append((self.comm.send(tensor, dst), tensor))  # the tensor lives until the send is done
        self.messages += 1
        self.bytes_sent += tensor.numel() * tensor.element_size()

    def wait_sends(self) -> None:
        for work, _ in self.sends:
            self.comm.wait(work)
        self.sends = []

    def forward_backward(self, x: torch.Tensor, y: torch.Tensor, micro: list[list[np.ndarray]],
                         loss_scale: float, ids: np.ndarray) -> torch.Tensor:
        """One step's forwards and backwards; ``micro[l][m]`` are the indices of lane l's micro-batch m into the
        batch, whose sample ids are ``ids``. Returns (loss sum, correct, samples, the id checksum's two halves) of
        what this member's last stage computed (zeros elsewhere): ``stats[2:]`` are its samples' ``sample_figures``."""
        layout, s = self.layout, self.layout.stage
        self.messages = self.bytes_sent = 0
        stats = torch.zeros(2 + SAMPLE_SLOTS)
        saved: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]] = {}
        lanes = layout.my_lanes
        micro_batches = len(micro[0])
        self.stage.train()
        for m in range(micro_batches):
            for lane in lanes:
                index = torch.from_numpy(micro[lane][m])
                if layout.first:
                    inputs = x[index]
                else:
                    inputs = torch.empty(len(index), *self.in_shape)
                    self.comm.recv(inputs, layout.owner(s - 1, lane))
                    inputs.requires_grad_(True)
                out = self.stage(inputs)
                if layout.last:
                    target = y[index]
                    loss = F.cross_entropy(out, target, reduction="sum")
                    stats += torch.tensor([loss.item(), (out.detach().argmax(1) == target).sum().item(),
                                           *sample_figures(ids[micro[lane][m]])])
                    out = loss
                else:
                    self._send(out.detach(), layout.owner(s + 1, lane))
                saved[(lane, m)] = (inputs, out)
        if self.between_phases is not None:
            self.between_phases()
        for m in reversed(range(micro_batches)):
            for lane in lanes:
                inputs, out = saved.pop((lane, m))
                if layout.last:
                    (out * loss_scale).backward()
                else:
                    grad = torch.empty_like(out)
                    self.comm.recv(grad, layout.owner(s + 1, lane))
                    out.backward(grad)
                if not layout.first:
                    self._send(inputs.grad, layout.owner(s - 1, lane))
        self.wait_sends()
        return stats

    @torch.no_grad()
    def evaluate(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Forward of the test set through lane 0's members; (loss sum, correct, samples) on its last stage."""
        layout, s = self.layout, self.layout.stage
        stats = torch.zeros(3)
        if layout.owner(s, 0) != layout.position:
            return stats
        self.stage.eval()
        inputs = x if layout.first else self.comm.recv(torch.empty(len(y), *self.in_shape), layout.owner(s - 1, 0))
        out = self.stage(inputs)
        if layout.last:
            stats += torch.tensor([F.cross_entropy(out, y, reduction="sum").item(),
                                   (out.argmax(1) == y).sum().item(), float(len(y))])
        else:
            self.comm.wait(self.comm.send(out.contiguous(), layout.owner(s + 1, 0)))
        return stats


class PipelineTrainer(BaseTrainer):
    def __init__(self, config: RunConfig, channel: Any, store: dist.Store, checkpoint_dir: Any) -> None:
        super().__init__(config, channel, store, checkpoint_dir)
        self.stage_names = run_stages(self.model, config)  # the same cut on every rank: config.stage_cuts
        self.shapes = boundary_shapes(self.model, self.stage_names, self.data.train_batch([0], 0)[0])
        self.full_model = self.model
        self.stage_index: int | None = None  # known once the first generation says which rank this is
        self.layout: Layout | None = None
        self.pipe: StagePipeline | None = None
        self.stage_comm: Comm | None = None
        self.pre_update: dict[str, Any] | None = None  # hybrid shrink: this step's state before its update
        self.keep_pre_update = config.mode.lanes and self.strategy.reaction is strategies.Reaction.REGROUP

    # -- the stage this process holds ---------------------------------------------------------------------------
    def _take_stage(self, stage: int) -> None:
        """Keep only ``stage``'s modules (a rank's stage never changes: stable rank numbers, stable stages)."""
        if self.stage_index == stage:
            return
        self.stage_index = stage
        self.model = stage_module(self.full_model, self.stage_names[stage])
        self.full_model = None
        self._own_optimizer()
        st.init_history(self.optimizer)  # the same tensors on every replica from step 0: a transfer fills them
        numel = sum(p.numel() for p in self.params)
        # hybrid: a stage's replicas also average batch norm's running statistics, riding after the gradients
        # with a contributor count (as in data parallel); each replica's forward saw other lanes
        self.running = st.RunningStats(self.model)
        self.grads = torch.zeros(numel + self.running.slots)  # one flat buffer: one allreduce per stage
        self.views, offset = [], 0
        for p in self.params:
            view = self.grads[offset: offset + p.numel()].view_as(p)
            p.grad = view
            self.views.append(view)
            offset += p.numel()
        self.injector = Injector(self.model, self._report_flip)

    def _stage_faults(self, faults: list[FaultSpec]) -> list[FaultSpec]:
        """An activation flip that names only its stage hits what that stage sends on (its last module)."""
        boundary = self.stage_names[self.stage_index][-1]
        flips = [f for f in faults if f.tensor is None and kinds.of(f).fires is kinds.Fires.INJECTOR]
        return [dataclasses.replace(f, tensor=boundary) if f in flips else f for f in faults]

    # -- state --------------------------------------------------------------------------------------------------
    def stage_state(self) -> dict[str, Any]:
        model, optim = self._local_state()
        return {"model": model, "optim": optim}

    def load_stage_state(self, state: dict[str, Any]) -> None:
        mine = self.model.state_dict().keys()
        self.model.load_state_dict({k: v for k, v in state["model"].items() if k in mine})
        st.load_named_optimizer_state(self.optimizer, self.named, state["optim"])

    def checkpoint_state(self, everyone: bool = False) -> tuple[dict[str, torch.Tensor], dict] | None:
        """The whole model, gathered as raw tensors (collective): each stage's first member sends its stage's
        state to rank 0, which writes checkpoints (others get None), or, ``everyone``, to every member (reinit's
        snapshot: any survivor can then restore any stage)."""
        named: dict[str, torch.Tensor] = {}
        for members in self.layout.stage_members:
            head = members[0]
            receivers = [r for r in range(self.comm.size) if r != head] if everyone else [0] if head else []
            mine = self.comm.rank == head
            got = transfer.send_named(self.comm, head, receivers, self._named_state() if mine else None)
            named.update({k: v.detach().clone() for k, v in got.items()} if mine else got or {})
        return st.unflatten_state(named) if everyone or self.comm.rank == 0 else None

    # -- generations --------------------------------------------------------------------------------------------
    def join(self, a: dict[str, Any]) -> None:
        started, started_cpu = time.monotonic(), cpu_time()
        recovery = a.get("recovery")
        self.bytes_in = 0
        self._take_stage(self.config.stage_of(a["members"][a["rank"]]))
        self.injector.set(self._stage_faults(self._set_faults(a)))
        self.comm.join(a)
        self.layout = Layout(self.config, a["members"], self.comm.rank, a.get("lanes"))
        members = self.layout.stage_members[self.layout.stage]
        self.stage_comm = self.comm.subgroup(f"stage{self.layout.stage}", self.layout.stage_rank, len(members))
        stage = self.layout.stage
        in_shape = self.shapes[stage - 1] if stage else tuple(self.data.input_shape)
        self.pipe = StagePipeline(self.model, self.layout, self.comm, in_shape, self.shapes[stage])
        self.pipe.between_phases = self._fault_point
        self.comm.prepare_links(self.layout.peers())
        if a.get("resume"):
            from workbench.base import checkpoint as ckpt

            restored = ckpt.load(a["resume"], check=self.config.resume_verify)
            self.load_stage_state({"model": restored.model, "optim": restored.optimizer})
            self.step = restored.step
        elif (recovering := strategies.recovered_by(recovery)) is not None and recovering.memory_snapshot:
            self._share_snapshot(a["source"])
            self.load_stage_state(self.memory_snapshot)
            self.step = int(self.memory_snapshot["step"])
        elif a["source"] is None:
            self._settle_replicas()
        self._first_snapshot()
        self._report_joined(started, started_cpu, self.bytes_in, recovery, False)
        self.inflight = None
        self.trained = True

    def _settle_replicas(self) -> None:
        """Hybrid shrink/regrow: bring every member to the last step all of them committed, then give each
        stage's replacements the state of a replica of that stage."""
        steps = torch.zeros(self.comm.size, dtype=torch.float64)
        steps[self.comm.rank] = self.step + 1.0 if self.trained else 0.0  # 0: a replacement without state
        self.comm.allreduce_now(steps)
        trained = steps > 0
        target = int(steps[trained].min().item()) - 1
        if self.trained and self.step > target:
            if self.pre_update is None or self.pre_update["step"] != target:
                raise CommError(f"rank at step {self.step} cannot return to step {target}: no pre-update copy")
            self.load_stage_state(self.pre_update)  # undo the failed step's update: the survivors redo it
        self.step = target
        members = self.layout.stage_members[self.layout.stage]
        holders = [i for i, position in enumerate(members) if trained[position]]
        if not holders:
            raise CommError(f"stage {self.layout.stage} has no replica with its layers left")
        if len(holders) < len(members):
            # raw tensor buffers from one replica to the stage's replacements only (transfer.move)
            rows = [[int(trained[position]), target, 0, 0] for position in members]
            receivers = [i for i, position in enumerate(members) if not trained[position]]
            source = self.stage_comm.rank == holders[0]
            _, self.bytes_in = transfer.move(self.stage_comm, transfer.Agreement(rows, holders[0]),
                                             self._named_state() if source else None, {} if source else None,
                                             self._place, receivers)

    # -- one step -----------------------------------------------------------------------------------------------
    def train_step(self) -> None:
        step, started = self._begin_step()
        running_before = self.running.copy() if self.keep_pre_update else None
        batch = self.batches(step)
        x, y = self.data.train_batch(batch, step)  # the global batch; micro-batches index into it
        lanes = np.array_split(np.arange(len(batch)), self.layout.lanes)
        micro = [np.array_split(lane, self.config.micro_batches) for lane in lanes]
        self.grads.zero_()
        stats = self.pipe.forward_backward(x, y, micro, 1.0 / self.global_batch(step), batch)
        for p, view in zip(self.params, self.views):
            if p.grad is not view:  # autograd replaced the gradient tensor: bring it back into the flat buffer
                view.copy_(p.grad)
                p.grad = view
        messages, sent = self.pipe.messages, self.pipe.bytes_sent
        self.injector.into_bucket("grad", step, [n for n, _ in self.named], self.views)
        self.running.pack(self._running_region())
        self.stage_comm.allreduce_now(self.grads)
        self.running.unpack(self._running_region())
        self.injector.into_bucket("grad_local", step, [n for n, _ in self.named], self.views)
        self.comm.allreduce_now(stats)  # every stage's gradient is complete: the step's commit point
        for m, b in (ring_allreduce_traffic([self.grads.numel() * 4], self.stage_comm.size),
                     ring_allreduce_traffic([stats.numel() * 4], self.comm.size)):
            messages, sent = messages + m, sent + b
        if self.keep_pre_update:
            self.pre_update = {"step": step, **self.stage_state()}
            # the redo runs the forward again: the running statistics go back to before this step's forward
            self.pre_update["model"].update(zip(self.running.names, running_before))
        self.optimizer.step()
        self.step = step + 1
        self.inflight = None
        self.traffic = (messages, sent)
        self._commit(step, stats, started)

    def _running_region(self) -> torch.Tensor:
        """Where the running statistics ride in the stage's allreduce: after the gradients."""
        return self.grads[self.grads.numel() - self.running.slots:]

    def _before_fault(self) -> None:
        self.pipe.wait_sends()  # the activations already sent arrive: the fault lands in the backward phase

    def _commit(self, step: int, stats: torch.Tensor, started: float) -> None:
        evaluation = self.evaluate() if self._evaluation_due() else None  # collective: every member takes part
        self._report_step(step, stats, stats[2:], started, evaluation=evaluation)
        self._periodic_snapshot()

    def _checkpoint_now(self) -> None:
        state = self.checkpoint_state()  # gathered from every stage
        if self.comm.rank == 0:
            self._write_checkpoint(state=state)

    def _take_memory_snapshot(self) -> Any:
        """Every member keeps the whole model's state, so any survivor can restore any stage."""
        model, optim = self.checkpoint_state(everyone=True)
        return {"step": self.step, "model": model, "optim": optim}

    def _share_snapshot(self, source: int) -> None:
        """reinit: the members agree on the snapshot's step (one small allreduce); only those without it (a
        replacement, or a member that missed the last one) receive the source's, as raw tensors."""
        snap = self.memory_snapshot
        agreement = transfer.agree(self.comm, int(snap is not None), snap["step"] if snap else -1, 0, -1, source)
        named = st.flatten_state(snap["model"], snap["optim"]) if self.comm.rank == source else None
        got = transfer.send_named(self.comm, source, agreement.receivers, named)
        if self.comm.rank in agreement.receivers:
            self.bytes_in = sum(t.numel() * t.element_size() for t in got.values())
            model, optim = st.unflatten_state(got)
            self.memory_snapshot = {"step": agreement.rows[source][1], "model": model, "optim": optim}

    def _final_checkpoint(self) -> None:
        state = self.checkpoint_state()
        if self.comm.rank == 0:
            self._write_checkpoint("final.h5", state=state)

    def evaluate(self) -> dict[str, float]:
        stats = self.comm.allreduce_now(self.pipe.evaluate(self.data.x_test, self.data.y_test))
        samples = max(stats[2].item(), 1.0)
        return {"test_loss": stats[0].item() / samples, "test_acc": stats[1].item() / samples}

    def replica_group(self) -> int:
        return self.stage_index or 0
