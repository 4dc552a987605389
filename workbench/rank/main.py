"""Entry point of a rank process. The supervisor starts ``python -m workbench.rank --control HOST:PORT --id N``
(or its rank template forks a process that calls :func:`main` with those arguments); a rank started elsewhere
joins with ``--store HOST:PORT [--rank-hint K]``.

Life of a rank: connect to the supervisor's control channel, receive the run configuration, build data and
model, say ``ready``, then train in whatever generation the supervisor assigns (:mod:`.base`, and the trainer of
the run's parallel mode). The process always ends with ``os._exit``.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import traceback
from datetime import timedelta
from pathlib import Path
from typing import Any, NoReturn

import torch
import torch.distributed as dist

from workbench.config import RunConfig
from workbench.processes import die_with_parent
from workbench.protocol import CONTROL_KEY
from workbench.rank.base import BaseTrainer, evaluate, fingerprint  # noqa: F401 - the peers' ranks use them
from workbench.rank.channel import Channel


def start_rank_process() -> None:
    """What every rank process does first (ours and the peers'): die with its parent; a launcher that stops it
    (torchrun stops a node's workers when one fails, a batch system cancels a job) makes it a dead rank like any
    other, for the strategy to handle, not an error of the run; one thread (gloo on CPU)."""
    die_with_parent()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, frame: os._exit(128 + signum))
    torch.set_num_threads(1)


def serve(channel: Channel, body: Any, error_kind: str = "error") -> NoReturn:
    """Run ``body(start message)`` and end the process with ``os._exit``; an exception is reported in one line
    as ``error_kind`` (``error`` fails the run; ``peer_error`` is only an event: the peer handles it)."""
    code = 0
    try:
        body(channel.recv(timeout=120.0))
    except BaseException as exc:  # noqa: BLE001 - every failure is reported in one line, then the process ends
        code = 1
        detail = "".join(traceback.format_exception_only(type(exc), exc)).strip()
        channel.send({"type": error_kind, "message": detail, "traceback": traceback.format_exc(limit=8)})
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def trainer_class(config: RunConfig) -> type[BaseTrainer]:
    if config.parallelism == "gossip":
        from workbench.rank.gossip import GossipTrainer

        return GossipTrainer
    if config.parallelism in ("pipeline", "hybrid"):
        from workbench.rank.pipeline import PipelineTrainer

        return PipelineTrainer
    from workbench.rank.replicated import Trainer

    return Trainer


def _join_from_store(address: str, rank_hint: int | None, timeout: float) -> tuple[Channel, dist.TCPStore]:
    """A rank started outside the supervisor (another host, torchrun, by hand): the store at ``address`` names
    the control server (key ``workbench/control``); the supervisor gives this process a free rank slot."""
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise SystemExit(f"workbench rank: --store {address!r} is not HOST:PORT")
    try:
        store = dist.TCPStore(host, int(port), is_master=False, timeout=timedelta(seconds=timeout))
        control = store.get(CONTROL_KEY).decode()
    except (RuntimeError, OSError) as exc:  # torch's DistStoreError is a RuntimeError
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise SystemExit(f"workbench rank: no run's store answered at {address} within {timeout:g} s ({reason})"
                         ) from None
    control_host, _, control_port = control.rpartition(":")
    return Channel(control_host, int(control_port), None, rank_hint=rank_hint), store


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m workbench.rank")
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--control", help="HOST:PORT of the supervisor's control channel (spawned ranks)")
    where.add_argument("--store", help="HOST:PORT of a run's store: join a run started elsewhere")
    parser.add_argument("--id", type=int, help="spawn id given by the supervisor (with --control)")
    parser.add_argument("--rank-hint", type=int, help="with --store: the rank number to take")
    parser.add_argument("--connect-timeout", type=float, default=60.0, help="with --store: seconds to wait for it")
    args = parser.parse_args(argv)
    if args.control and args.id is None:
        parser.error("--control needs --id")
    start_rank_process()
    store = None
    if args.store:
        channel, store = _join_from_store(args.store, args.rank_hint, args.connect_timeout)
    else:
        host, _, port = args.control.rpartition(":")
        channel = Channel(host, int(port), args.id)

    def train(start: dict[str, Any]) -> None:
        config = RunConfig.from_dict(start["config"])
        joined_store = store
        if joined_store is None or start["store"] != args.store:
            store_host, _, store_port = start["store"].rpartition(":")
            joined_store = dist.TCPStore(store_host, int(store_port), is_master=False,
                                         timeout=timedelta(seconds=config.startup_timeout))
        trainer = trainer_class(config)(config, channel, joined_store, Path(start["checkpoint_dir"]))
        trainer.provenance = start.get("provenance") or {}  # the run's, kept in its checkpoints
        trainer.run()

    serve(channel, train)
