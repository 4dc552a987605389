"""An MPI process of a data-parallel run under ULFM (``--strategy ulfm``), as ULFM's users write it (the
MaTEx-Caffe flow of the EuroMPI'17 seed paper).

Started by ``mpirun --with-ft ulfm``; each process joins our control channel through the store (its slot is its
MPI rank) and trains with one in-place ``MPI_Allreduce`` per step. On ``MPI_ERR_PROC_FAILED`` the survivors
revoke, shrink and agree, align their states if their steps differ, and retry the failed step re-split over the
survivors: no step redone, no sample lost, no replacement. Details: docs/internals.md, docs/permanent-faults.md.
"""

from __future__ import annotations

import os
import pickle
import time
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from workbench.base import protocol
from workbench.base.entry import OneLineParser
from workbench.config.run import config_from_wire
from workbench.rank.main import join_from_store, serve, start_rank_process
from workbench.rank.optim import make_optimizer
from workbench.rank.peers.common import PeerRank
from workbench.rank.readings import evaluate, fingerprint
from workbench.workloads.data import SAMPLE_SLOTS, checksum_of, sample_figures, shard

STATS = 2 + SAMPLE_SLOTS  # loss sum, correct predictions, samples, the ids' checksum halves: last in the buffer


def _mpi() -> Any:
    from mpi4py import MPI  # initialises MPI: only inside a process mpirun started

    return MPI


class UlfmRank(PeerRank):
    def run(self) -> None:
        MPI = _mpi()
        config = self.config
        comm = MPI.COMM_WORLD.Dup()
        comm.Set_errhandler(MPI.ERRORS_RETURN)
        self.params = list(self.model.parameters())
        self.buffers = [b for b in self.model.buffers() if b.is_floating_point()]
        size = sum(t.numel() for t in self.params + self.buffers) + STATS
        self.flat = np.zeros(size, dtype=np.float32)  # one allreduce a step: gradients, buffers, statistics
        self.optimizer = make_optimizer(config.optimizer, self.params, config.lr, config.momentum)
        self.channel.send(protocol.message("ready"))
        gen = self.wait_generation()["gen"]
        self.channel.send(protocol.message("joined", gen=gen, step=0, sync_s=0.0))
        step = 0
        while step < self.channel.end(config.steps):  # fewer once run.finish asked
            started = time.perf_counter()
            try:
                totals = self._train_step(MPI, comm, step)
            except MPI.Exception as exc:
                comm, step = self._recover(MPI, comm, exc, step)
                continue
            self._report(comm, step, gen, totals, started)
            step += 1
        self.channel.send(protocol.message("done", step=step, fingerprint=fingerprint(self.model), group=0))
        MPI.Finalize()

    def _train_step(self, MPI: Any, comm: Any, step: int) -> np.ndarray:
        """Forward and backward on this member's share of the global batch, one allreduce, the update."""
        indices = shard(self.batches(step), comm.Get_rank(), comm.Get_size())
        x, y = self.data.train_batch(torch.from_numpy(indices), step)
        self.model.train()
        self.optimizer.zero_grad()
        out = self.model(x)
        loss_sum = F.cross_entropy(out, y, reduction="sum")
        (loss_sum / self.config.batch_size).backward()  # summed over members: the global batch's mean gradient
        flat = torch.from_numpy(self.flat)
        at = 0
        for source in [p.grad for p in self.params] + self.buffers:
            n = source.numel()
            flat[at:at + n].copy_(source.reshape(-1))
            at += n
        flat[at:] = torch.tensor([loss_sum.item(), (out.argmax(1) == y).sum().item(), *sample_figures(indices)])
        comm.Allreduce(MPI.IN_PLACE, self.flat, op=MPI.SUM)
        self.fault_point(step)  # a planned kill fires after the exchange, before the update (as for every peer)
        at = 0
        with torch.no_grad():
            for p in self.params:
                p.grad.copy_(flat[at:at + p.numel()].view_as(p))
                at += p.numel()
            for b in self.buffers:  # batch norm's running statistics: the members' average
                b.copy_(flat[at:at + b.numel()].view_as(b) / comm.Get_size())
                at += b.numel()
        self.schedule_lr(self.optimizer, step)
        self.optimizer.step()
        return self.flat[-STATS:].copy()

    def _report(self, comm: Any, step: int, gen: int, totals: np.ndarray, started: float) -> None:
        if comm.Get_rank() != 0:
            self.channel.send(protocol.message("step", step=step, gen=gen, t=time.time()))
            return
        loss_sum, correct, samples = (float(v) for v in totals[:3])
        figures = {"loss": loss_sum / samples, "train_acc": correct / samples, "samples": int(samples),
                   "step_time": time.perf_counter() - started, "t": time.time(), "world_size": comm.Get_size()}
        checksum = checksum_of(totals[2:].tolist())
        if checksum is not None:
            figures["sample_checksum"] = checksum
        if (step + 1) % self.config.eval_interval == 0 or step + 1 == self.channel.end(self.config.steps):
            figures.update(evaluate(self.model, self.data))
        self.channel.send(protocol.message("step", step=step, gen=gen, **figures))

    def _recover(self, MPI: Any, comm: Any, exc: Any, step: int) -> tuple[Any, int]:
        """Revoke, shrink, agree; then the survivors take the most advanced one's state (module docstring)."""
        self.channel.send(protocol.message("ulfm", event="failure", step=step, error=exc.Get_error_string(),
                                           t=time.time()))
        for _ in range(self.config.world_size):
            t0 = time.perf_counter()
            comm.Revoke()
            t1 = time.perf_counter()
            try:
                shrunk = comm.Shrink()
                t2 = time.perf_counter()
                shrunk.Set_errhandler(MPI.ERRORS_RETURN)
                shrunk.Agree(1)
                t3 = time.perf_counter()
                steps = shrunk.allgather(step)
                moved = self._adopt_most_advanced(shrunk, steps) if len(set(steps)) > 1 else 0
            except MPI.Exception:
                comm = locals().get("shrunk", comm)  # another process failed meanwhile: recover again
                continue
            if shrunk.Get_rank() == 0:
                self.channel.send(protocol.message(
                    "ulfm", event="shrunk", step=max(steps), size=shrunk.Get_size(), revoke_s=t1 - t0,
                    shrink_s=t2 - t1, agree_s=t3 - t2, bytes=moved, t=time.time()))
            return shrunk, max(steps)
        raise RuntimeError(f"ULFM recovery failed {self.config.world_size} times in a row at step {step}")

    def _adopt_most_advanced(self, comm: Any, steps: list[int]) -> int:
        """An allreduce completed on some survivors only: the first at the highest step sends its state."""
        source = steps.index(max(steps))
        mine = comm.Get_rank() == source
        payload = pickle.dumps({"model": self.model.state_dict(), "optim": self.optimizer.state_dict()}) if mine \
            else None
        payload = comm.bcast(payload, root=source)
        if not mine:
            state = pickle.loads(payload)
            self.model.load_state_dict(state["model"])
            self.optimizer.load_state_dict(state["optim"])
        return len(payload)


def main(argv: list[str] | None = None) -> None:
    parser = OneLineParser(prog="python -m workbench.rank.peers.ulfm_rank")
    parser.add_argument("--store", required=True, help="HOST:PORT of the run's store")
    args = parser.parse_args(argv)
    if not os.environ.get("OMPI_COMM_WORLD_RANK", "").isdigit():
        parser.error("a rank the run's mpirun starts: OMPI_COMM_WORLD_RANK (its rank number) is not set")
    start_rank_process()
    channel, _ = join_from_store(args.store, int(os.environ["OMPI_COMM_WORLD_RANK"]), 60.0)
    serve(channel, lambda start: UlfmRank(config_from_wire(start["config"]), channel).run(), "error")


if __name__ == "__main__":
    main()
