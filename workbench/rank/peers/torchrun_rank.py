"""A worker of a torchrun-launched, restart-the-world run (``--strategy torchrun``), as torchrun's users write it.

Protocol (torch.distributed.elastic's): the supervisor starts one agent, ``python -m torch.distributed.run
--standalone --nproc-per-node W --max-restarts R --monitor-interval 0.1 -m workbench.rank.peers.torchrun_rank
--store ADDR:PORT``. Each worker joins our control channel through the store (its slot is ``$RANK``), initialises the
default process group from torchrun's environment, wraps the model in ``torch.nn.parallel.DistributedDataParallel``
and trains; rank 0 writes an HDF5 checkpoint every ``checkpoint_every`` steps (synchronously, atomically). When a
worker dies the agent stops all of them (SIGTERM) and starts the world again, up to ``--max-restarts`` times; the
new workers resume from the last checkpoint the supervisor names. Work since that checkpoint is redone.
"""

from __future__ import annotations

import os
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F

from workbench.base import checkpoint as ckpt
from workbench.base import protocol
from workbench.base.entry import OneLineParser
from workbench.config.run import config_from_wire
from workbench.rank import state as st
from workbench.rank.gradient_exchange import make_optimizer
from workbench.rank.main import join_from_store, serve, start_rank_process
from workbench.rank.peers.common import PeerRank
from workbench.rank.readings import fingerprint


class TorchrunWorker(PeerRank):
    provenance: dict = {}  # the run's (workbench.results.provenance), set from the start message; in checkpoints

    def run(self, checkpoint_dir: Path) -> None:
        config = self.config
        timeout = timedelta(seconds=config.op_timeout)
        # the agent's store outlives a restart of the world and keeps the last attempt's gloo addresses: a
        # restarted world reading them fails (Connection refused) or hangs (pytorch/pytorch#167288), so each
        # attempt rendezvouses under its own prefix, as users who hit that do
        agent_store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                                    timeout=timeout)
        attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
        dist.init_process_group("gloo", store=dist.PrefixStore(f"workbench/attempt{attempt}", agent_store),
                                rank=int(os.environ["RANK"]), world_size=int(os.environ["WORLD_SIZE"]),
                                timeout=timeout)
        rank = dist.get_rank()
        ddp = torch.nn.parallel.DistributedDataParallel(self.model, bucket_cap_mb=config.bucket_cap_mb)
        named = list(self.model.named_parameters())
        optimizer = make_optimizer(config.optimizer, [p for _, p in named], config.lr, config.momentum)
        self.channel.send(protocol.message("ready"))
        assignment = self.wait_generation()
        began, step = time.perf_counter(), 0
        if assignment.get("resume"):
            saved = ckpt.load(assignment["resume"])
            self.model.load_state_dict(saved.model)
            st.load_named_optimizer_state(optimizer, named, saved.optimizer)
            step = saved.step
        recovered = {}
        if rank == 0 and assignment.get("recovery"):
            recovered = {"recovery": assignment["recovery"], "resume_step": step, "retried": False}
        self.channel.send(protocol.message("joined", gen=assignment["gen"], step=step,
                                           sync_s=time.perf_counter() - began, **recovered))
        gen = assignment["gen"]
        while step < self.channel.end(config.steps):  # fewer once run.finish asked
            started = time.perf_counter()
            x, y = self.batch(step, rank)
            optimizer.zero_grad()
            out = ddp(x)
            loss = F.cross_entropy(out, y)
            loss.backward()
            self.fault_point(step)
            self.schedule_lr(optimizer, step)
            optimizer.step()
            if rank == 0:
                self.report(step, gen, loss, out, y, started)
            else:
                self.channel.send(protocol.message("step", step=step, gen=gen))
            step += 1
            if rank == 0 and config.checkpoint_every and step % config.checkpoint_every == 0:
                self._checkpoint(step, named, optimizer, checkpoint_dir)
        self.channel.send(protocol.message("done", step=step, fingerprint=fingerprint(self.model), group=0))

    def _checkpoint(self, step: int, named: list, optimizer: torch.optim.Optimizer, directory: Path) -> None:
        began = time.perf_counter()
        state = {k: v.detach().clone() for k, v in self.model.state_dict().items()}
        path = ckpt.save(directory / ckpt.checkpoint_name(step),
                         ckpt.Checkpoint(step, state, st.named_optimizer_state(optimizer, named),
                                         torch.get_rng_state(), self.config.seed, self.config.to_dict(),
                                         provenance=self.provenance))
        spent = time.perf_counter() - began
        self.channel.send(protocol.message("checkpoint", step=step, path=str(path), stall_s=spent, write_s=spent))


def main(argv: list[str] | None = None) -> None:
    parser = OneLineParser(prog="python -m workbench.rank.peers.torchrun_rank")
    parser.add_argument("--store", required=True, help="HOST:PORT of the run's store")
    args = parser.parse_args(argv)
    if not os.environ.get("RANK", "").isdigit():
        parser.error("a rank the run's torchrun starts: RANK (its rank number) is not set")
    start_rank_process()  # the agent stops the world with SIGTERM: each worker a dead rank
    channel, _ = join_from_store(args.store, int(os.environ["RANK"]), 60.0)
    def train(start: dict) -> None:
        worker = TorchrunWorker(config_from_wire(start["config"]), channel)
        worker.provenance = start.get("provenance") or {}  # the run's, kept in its checkpoints
        worker.run(Path(start["checkpoint_dir"]))

    serve(channel, train, "peer_error")  # a failed worker is the agent's to handle

if __name__ == "__main__":
    main()
