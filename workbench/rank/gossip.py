"""GossipGraD (from MaTEx-Caffe's ``mpi_gossip_params_cpu7``): O(1) gossip SGD instead of allreduce.

Each step a member exchanges its parameters and optimizer history with one partner (``r XOR 2^h``, ``h = t mod
log2(p)``, relabelled by a seeded rotation after each cycle) over a two-member link, non-blocking, trains on its
own batch and averages with the partner (``θ ← (θ' − θ_t) + ½(θ_t + θ_partner)``); the ring shuffle passes batches
to the right neighbour. Two messages per rank per step whatever ``p``. On a failure (``shrink``) survivors keep
their replicas and take the most advanced step; a replacement (``regrow``) gets the most advanced member's state;
sizes that are not a power of two gossip on the smallest cube that holds them. Details: docs/internals.md and
docs/parallel-modes.md.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F

from workbench import strategies
from workbench.base.fallbacks import taken
from workbench.rank import state as st
from workbench.rank import transfer
from workbench.rank.base import BaseTrainer
from workbench.rank.channel import cpu_time
from workbench.rank.comm import Comm, CommError, GenerationChanged
from workbench.rank.gradient_exchange import ring_allreduce_traffic
from workbench.workloads.data import LocalPartition, sample_figures

ORDER_SEED = 0x905519  # partner orders depend on the run's seed and this constant only


class GossipSchedule:
    """Partners of every member at every step: a hypercube over ``2^k >= size`` slots, relabelled after every
    cycle of ``k`` steps by the next of ``2^k`` seeded orders (the first is the identity)."""

    def __init__(self, size: int, seed: int) -> None:
        self.size = size
        self.k = max(1, (size - 1).bit_length())
        slots = 1 << self.k
        rng = np.random.default_rng((seed, ORDER_SEED))
        self.orders = [np.arange(slots)] + [rng.permutation(slots) for _ in range(slots - 1)]

    @property
    def cycle_steps(self) -> int:
        """Steps until the partner orders repeat: every partner a member will ever have appears within them."""
        return self.k * len(self.orders)

    def partner(self, step: int, position: int) -> int | None:
        """Position of ``position``'s partner at ``step``, or None when its cube partner slot is empty."""
        cycle, h = divmod(step, self.k)
        order = self.orders[cycle % len(self.orders)]  # order[position] = the member's slot on the cube
        slot = int(order[position]) ^ (1 << h)
        partner = int(np.flatnonzero(order[: self.size] == slot)[0]) if slot in order[: self.size] else None
        return partner


def gossip_average(current: torch.Tensor, sent: torch.Tensor, pair_sum: torch.Tensor) -> torch.Tensor:
    """``(current − sent) + ½ pair_sum``: the pairwise average of the step-start states (their sum comes from an
    allreduce over the two partners, bitwise the same on both) plus this rank's local update."""
    return (current - sent) + 0.5 * pair_sum


def diffusion(comm: Comm, schedule: GossipSchedule, vector: torch.Tensor, after_step: int,
              partners: list[int | None] | None = None) -> tuple[dict[str, Any], torch.Tensor]:
    """How far ``vector`` (this replica's state) diffuses in ``ceil(log2 p)`` gossip rounds without updates: the
    replicas' relative spread before and after the rounds (each ``v <- (v + v_partner) / 2`` over the same pair
    links as training), and the diffused copy (the consensus state). The rounds' partners: ``partners``, this
    rank's in each round as training exchanged them (:meth:`GossipTrainer.trained_cycle`), else the schedule's
    next cycle after ``after_step``. With p a power of two the rounds reach the mean exactly; a skipped round leaves
    the replicas apart. A measurement on a copy: the model stays."""
    before = relative_spread(comm, vector)
    vector = vector.clone()
    replayed = partners is not None
    if partners is None:
        start = -(-after_step // schedule.k) * schedule.k  # the first step of a cycle: k rounds of one labelling
        partners = [schedule.partner(step, comm.rank) for step in range(start, start + schedule.k)]
    for partner in partners:
        if partner is not None:
            comm.wait(comm.link(partner).group.allreduce([vector]))
            vector *= 0.5
    return {"rounds": len(partners), "before": before, "after": relative_spread(comm, vector),
            "partners": "trained" if replayed else "schedule"}, vector


def relative_spread(comm: Comm, vector: torch.Tensor) -> float:
    """Mean over replicas of ``|v_i - mean| / |mean|``: 0 when every replica holds the same state."""
    mean = comm.allreduce_now(vector.clone()) / comm.size
    own = (torch.linalg.vector_norm(vector - mean) / torch.linalg.vector_norm(mean).clamp_min(1e-30)).reshape(1)
    return comm.allreduce_now(own).item() / comm.size


class PairExchange:
    """The exchange of one flat state vector (parameters and history) with a partner.

    ``start`` sends what the vector is now and begins the pair's allreduce (non-blocking); ``finish`` waits and
    applies :func:`gossip_average` to whatever the vector has become meanwhile (the local update). ``blocking``
    is the synchronous variant: exchange now, then ``θ ← ½(θ + θ_partner)``. ``read``/``write`` give and take the
    flat vector.
    """

    def __init__(self, comm: Comm, read: Callable[[], torch.Tensor], write: Callable[[torch.Tensor], None]) -> None:
        self.comm = comm
        self.read = read
        self.write = write
        self.sent: torch.Tensor | None = None
        self.summed: torch.Tensor | None = None
        self.work: dist.Work | None = None

    def start(self, partner: int) -> tuple[int, int]:
        """Begin the exchange; returns the (messages, bytes) this rank sends for it."""
        self.sent = self.read()
        self.summed = self.sent.clone()
        self.work = self.comm.link(partner).group.allreduce([self.summed])
        return ring_allreduce_traffic([self.sent.numel() * self.sent.element_size()], 2)

    def finish(self) -> None:
        self.comm.wait(self.work)
        self.write(gossip_average(self.read(), self.sent, self.summed))
        self.sent = self.summed = self.work = None

    def blocking(self, partner: int) -> tuple[int, int]:
        mine = self.read()
        summed = mine.clone()
        self.comm.wait(self.comm.link(partner).group.allreduce([summed]))
        self.write(0.5 * summed)
        return ring_allreduce_traffic([mine.numel() * mine.element_size()], 2)


class GossipTrainer(BaseTrainer):
    def __init__(self, config: Any, channel: Any, store: dist.Store, checkpoint_dir: Any) -> None:
        super().__init__(config, channel, store, checkpoint_dir)
        self._own_optimizer()
        st.init_history(self.optimizer)
        self.exchange = PairExchange(self.comm, self._flat, self._unflat)
        self.schedule: GossipSchedule | None = None
        self.exchanged: deque[tuple[int, int | None]] = deque()  # (step, partner) this generation, recent steps
        self.partition: LocalPartition | None = None

    # -- state --------------------------------------------------------------------------------------------------
    def _gossiped(self) -> list[torch.Tensor]:
        """What partners average: parameters, batch norm's running statistics, the optimizer's history."""
        return ([p.data for p in self.params] + [b for _, b in st.float_buffers(self.model)]
                + st.history(self.optimizer, self.params))

    def _flat(self) -> torch.Tensor:
        return torch.cat([t.detach().reshape(-1) for t in self._gossiped()])

    @torch.no_grad()
    def _unflat(self, flat: torch.Tensor) -> None:
        offset = 0
        for tensor in self._gossiped():
            tensor.copy_(flat[offset: offset + tensor.numel()].view_as(tensor))
            offset += tensor.numel()

    def _take_memory_snapshot(self) -> dict[str, Any]:
        return {"step": self.step, "named": [(n, t.detach().clone()) for n, t in self._named_state()]}

    @torch.no_grad()
    def _restore_snapshot(self, snapshot: dict[str, Any]) -> None:
        own = dict(self._named_state())
        for name, saved in snapshot["named"]:
            own[name].copy_(saved)
        self.step = int(snapshot["step"])

    def _settle(self, source: int | None, score: int, newcomers_only: bool) -> int:
        """Agree (one small allreduce) and move the source's state to the members that need it; returns the
        source's step. ``newcomers_only``: gossip replicas differ by design, so only members without state
        (score 0) receive; otherwise every member whose state differs from the source's."""
        named = self._named_state()
        agreement = transfer.agree(self.comm, score, self.step, transfer.digest(named), -1, source)
        receivers = [r for r, row in enumerate(agreement.rows) if row[0] == 0 and r != agreement.source] \
            if newcomers_only else None
        is_source = self.comm.rank == agreement.source
        header, received = transfer.move(self.comm, agreement, named if is_source else None,
                                         {"step": self.step} if is_source else None, self._place, receivers)
        self.bytes_in = received
        return agreement.rows[agreement.source][1] if header is None else int(header["meta"]["step"])

    def checkpoint_state(self) -> tuple[dict[str, torch.Tensor], dict]:
        return self._local_state()

    # -- generations --------------------------------------------------------------------------------------------
    def join(self, a: dict[str, Any]) -> None:
        started, started_cpu = time.monotonic(), cpu_time()
        recovery = a.get("recovery")
        recovering = strategies.recovered_by(recovery)  # the strategy that recovers this failure
        self.injector.set(self._set_faults(a))
        self.comm.join(a)
        source = a["source"]
        self.bytes_in = 0
        if a.get("resume") or (recovering and recovering.memory_snapshot):
            # the named source restores (a checkpoint, or reinit's snapshot), then members that differ receive it
            if self.comm.rank == source:
                if not a.get("resume"):
                    if self.memory_snapshot is not None:
                        self._restore_snapshot(self.memory_snapshot)
                else:
                    self._load_resumed(a["resume"])
            self.step = self._settle(source, 1, newcomers_only=False)
        elif source is None:
            # survivors keep their own replicas; a replacement takes the most advanced member's
            self.step = self._settle(None, self.step + 1 if self.trained else 0, newcomers_only=True)
        self.schedule = GossipSchedule(self.comm.size, self.config.seed)
        self.exchanged = deque(maxlen=2 * self.schedule.k)  # a new membership: its partners only
        peers = {self.schedule.partner(t, self.comm.rank) for t in range(self.schedule.cycle_steps)}
        if self.config.shuffle == "ring":
            peers |= {(self.comm.rank + 1) % self.comm.size, (self.comm.rank - 1) % self.comm.size}
        self.comm.prepare_links([q for q in peers if q is not None])  # out of the steps' timings
        self.partition = LocalPartition(len(self.data.y_train), self.comm.rank, self.comm.size, self.local_batch,
                                        self.config.seed, self.comm.gen)
        self._report_joined(started, started_cpu, self.bytes_in, recovery,
                            bool(recovering and recovering.retries_failed_step))
        self.trained = True
        self._first_snapshot()

    def _load_resumed(self, path: str) -> None:
        from workbench.base import checkpoint as ckpt

        restored = ckpt.load(path, check=self.config.resume_verify)
        self.model.load_state_dict(restored.model)
        st.load_named_optimizer_state(self.optimizer, self.named, restored.optimizer)
        st.init_history(self.optimizer)
        self.step = restored.step

    @property
    def local_batch(self) -> int:
        return max(1, self.global_batch(self.step) // self.comm.size)  # linear: batch_size / base after resizes

    # -- one step -----------------------------------------------------------------------------------------------
    def train_step(self) -> None:
        step, started = self._begin_step()
        partner = self.schedule.partner(step, self.comm.rank)
        self.exchanged.append((step, partner))  # what this step exchanges: the diffusion measurement replays it
        batch = self.partition.next_batch()
        messages, sent_bytes = 0, 0
        pending: list[dist.Work] = []
        overlapped = partner is not None and not self.config.gossip_sync
        if overlapped:
            messages, sent_bytes = self.exchange.start(partner)
        shuffle_in = None
        if self.config.shuffle == "ring" and self.comm.size > 1:
            right, left = (self.comm.rank + 1) % self.comm.size, (self.comm.rank - 1) % self.comm.size
            shuffle_out = torch.from_numpy(batch.astype(np.int64))
            shuffle_in = torch.empty_like(shuffle_out)
            # with two ranks both go over one link: post them in order of their root on both ends
            send_first = self.comm.rank < left
            if not send_first:
                pending.append(self.comm.recv_async(shuffle_in, left))
            pending.append(self.comm.send(shuffle_out, right))
            if send_first:
                pending.append(self.comm.recv_async(shuffle_in, left))
            messages, sent_bytes = messages + 1, sent_bytes + shuffle_out.numel() * 8
        self._fault_point()  # a planned fault lands with this step's exchange under way

        indices = torch.from_numpy(batch)
        x, y = self.data.train_batch(indices, step)
        self.model.train()
        self.optimizer.zero_grad(set_to_none=False)
        out = self.model(x)
        loss_sum = F.cross_entropy(out, y, reduction="sum")
        (loss_sum / len(y)).backward()
        self.optimizer.step()
        # (loss sum, correct, then sample_figures: samples and their ids' checksum) of this replica's own batch
        stats = torch.tensor([loss_sum.item(), (out.detach().argmax(1) == y).sum().item(), *sample_figures(batch)])
        self.step = step + 1  # the local update is in: a failed exchange below only loses the average
        self.inflight = None

        if overlapped:
            self.exchange.finish()
        elif partner is not None:
            m, b = self.exchange.blocking(partner)
            messages, sent_bytes = messages + m, sent_bytes + b
        for work in pending:
            self.comm.wait(work)
        if shuffle_in is not None:
            self.partition.replace(shuffle_in.numpy())
        else:
            self.partition.skip()
        self.traffic = (messages, sent_bytes)
        self._commit(step, stats, started)

    def _before_fault(self) -> None:
        pass  # the exchange is posted; the partner finds it broken

    def _done_figures(self) -> dict[str, Any]:
        """The diffusion measurement (:func:`diffusion`, over the partners of the last cycle trained) of the final
        replicas and the test accuracy of their consensus (the diffused state: what ``ceil(log2 p)`` rounds make of
        the replicas, their mean for p a power of two), sent with ``done``; none when a member is lost meanwhile (a
        measurement after the last step must not fail a finished run: said, ``diffusion_unmeasured``). The replica
        keeps its own state."""
        own = self._flat()  # a copy of the state; diffusion works on a copy of it in turn
        partners = self.trained_cycle()
        if partners is None:
            taken("diffusion_from_schedule", f"fewer than a partner cycle ({self.schedule.k} steps) trained since "
                  f"the last membership change: the diffusion rounds follow the schedule, not partners training "
                  f"exchanged")
        try:
            figures, consensus = diffusion(self.comm, self.schedule, own, self.step, partners)
        except (CommError, GenerationChanged) as exc:
            taken("diffusion_unmeasured", f"a member was lost while the replicas' diffusion was measured after the "
                  f"last step ({type(exc).__name__}): the summary's diffusion is None")
            return {}
        self._unflat(consensus)
        figures["test_acc"] = self.evaluate()["test_acc"]
        self._unflat(own)
        return {"diffusion": figures}

    def trained_cycle(self) -> list[int | None] | None:
        """This rank's partners in the last complete partner cycle it trained (``k`` steps of one labelling), as
        its steps exchanged them (None: skipped), or None when this generation trained no complete cycle."""
        k = self.schedule.k
        start = (self.step // k - 1) * k
        done = dict(self.exchanged)
        if start < 0 or any(step not in done for step in range(start, start + k)):
            return None
        return [done[step] for step in range(start, start + k)]

    def _commit(self, step: int, stats: torch.Tensor, started: float) -> None:
        extra: dict[str, Any] = {}
        if self.step % self.config.consensus_every == 0 or self.step == self.config.steps:
            measured = time.perf_counter()
            distance, stats = self.consensus(stats)
            extra["consensus_distance"] = distance
            started += time.perf_counter() - measured  # a measurement, not part of the step
        evaluation = self.evaluate() if self.comm.rank == 0 and self._evaluation_due() else None
        self._report_step(step, stats, stats[2:], started, extra=extra, evaluation=evaluation)
        self._periodic_snapshot()

    def consensus(self, stats: torch.Tensor) -> tuple[float, torch.Tensor]:
        """Mean L2 distance of the replicas' parameters to their mean, and the stats summed over all replicas."""
        flat = torch.cat([p.detach().reshape(-1) for p in self.params])
        total = self.comm.allreduce_now(flat.clone())
        distance = torch.linalg.vector_norm(flat - total / self.comm.size).reshape(1)
        summed = self.comm.allreduce_now(torch.cat([stats, distance]))
        return summed[-1].item() / self.comm.size, summed[:-1]
