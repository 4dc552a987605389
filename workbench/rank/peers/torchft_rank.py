"""A torchft 0.2 replica group of one process, as torchft's users write it (``python -m
workbench.rank.peers.torchft_rank --control HOST:PORT --id N``, spawned by the supervisor for ``--strategy
torchft``).

Every step is a torchft transaction (``torchft.Manager``, ``DistributedDataParallel`` and ``Optimizer`` over the
supervisor's lighthouse); a late replica heals from a peer. We report committed steps (``step``), discarded ones
(``discarded``) and quorum changes (``quorum``). Nothing of torchft is patched: its errors end the replica and the
run's outcome says so. Details: docs/internals.md.
"""

from __future__ import annotations

import logging
import os
import time
from datetime import timedelta
from typing import Any

import torch.distributed as dist
import torch.nn.functional as F

from workbench.base import protocol
from workbench.base.entry import OneLineParser
from workbench.base.errors import ConfigError
from workbench.config.run import config_from_wire
from workbench.rank.channel import Channel
from workbench.rank.gradient_exchange import make_optimizer
from workbench.rank.join import parse_address
from workbench.rank.main import serve, start_rank_process
from workbench.rank.peers.common import PeerRank
from workbench.rank.readings import fingerprint


class TorchftReplica(PeerRank):
    def run(self, lighthouse: str) -> None:
        import torchft

        self.channel.send(protocol.message("ready"))
        assignment = self.wait_generation()
        label = assignment["members"][assignment["rank"]]
        store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
        optimizer = make_optimizer(self.config.optimizer, list(self.model.parameters()), self.config.lr,
                                   self.config.momentum)

        def state_dict() -> dict[str, Any]:
            return {"model": self.model.state_dict(), "optim": optimizer.state_dict()}

        def load_state_dict(state: dict[str, Any]) -> None:
            self.model.load_state_dict(state["model"])
            optimizer.load_state_dict(state["optim"])

        timeout = timedelta(seconds=self.config.op_timeout)
        manager = torchft.Manager(
            pg=torchft.ProcessGroupGloo(timeout=timeout), min_replica_size=1, load_state_dict=load_state_dict,
            state_dict=state_dict, replica_id=f"workbench_{label}", store_addr="127.0.0.1",
            store_port=store.port, rank=0, world_size=1, lighthouse_addr=lighthouse, hostname="127.0.0.1",
            timeout=timeout, quorum_timeout=timeout, connect_timeout=timeout)
        ddp = torchft.DistributedDataParallel(manager, self.model)
        wrapped = torchft.Optimizer(manager, optimizer)
        quorum_id = None
        while manager.current_step() < self.channel.end(self.config.steps):  # fewer once run.finish asked
            step, started = manager.current_step(), time.perf_counter()
            x, y = self.batch(step, label)
            wrapped.zero_grad()
            out = ddp(x)
            loss = F.cross_entropy(out, y)
            loss.backward()
            participants = manager.num_participants()  # waits for this step's quorum
            if manager.current_step() >= self.channel.end(self.config.steps):
                break  # a quorum without the peers that finished (or a heal past the end): end where they did
            if manager._quorum_id != quorum_id:  # read only: a new quorum means torchft saw membership change
                quorum_id = manager._quorum_id
                self.channel.send(protocol.message("quorum", step=step, participants=participants,
                                                   quorum_id=quorum_id, t=time.time()))
            self.fault_point(step)
            self.schedule_lr(optimizer, step)
            wrapped.step()
            gen = self.channel.latest_generation["gen"]
            if manager.current_step() > step:  # committed; a healing replica jumped to its peers' step
                self.report(manager.current_step() - 1, gen, loss, out, y, started, participants=participants)
            else:
                error = manager.errored()
                self.channel.send(protocol.message(
                    "discarded", step=step, t=time.time(),
                    error=None if error is None else str(error.original_exception)[:200]))
        self.channel.send(protocol.message("done", step=manager.current_step(), fingerprint=fingerprint(self.model),
                                           group=0))
        manager.shutdown(wait=False)


def main(argv: list[str] | None = None) -> None:
    parser = OneLineParser(prog="python -m workbench.rank.peers.torchft_rank")
    parser.add_argument("--control", required=True)
    parser.add_argument("--id", type=int, required=True)
    args = parser.parse_args(argv)
    try:
        control = parse_address(args.control, "--control")
    except ConfigError as exc:
        parser.error(str(exc))
    start_rank_process()
    logging.basicConfig(level=logging.WARNING)
    os.environ.setdefault("RUST_LOG", "warn")  # torchft's Rust side logs ~6 INFO lines a step otherwise
    channel = Channel(*control, args.id)
    serve(channel, lambda start: TorchftReplica(config_from_wire(start["config"]), channel).run(
        start["lighthouse"]), "error")  # a torchft error on a survivor is that peer's outcome

if __name__ == "__main__":
    main()
