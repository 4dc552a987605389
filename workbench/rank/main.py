"""Entry point of a rank process. The supervisor starts ``python -m workbench.rank --control HOST:PORT --id N``
(or its rank template forks a process that calls :func:`main` with those arguments); a rank started elsewhere
joins with ``--store HOST:PORT [--rank-hint K]``.

Life of a rank: connect to the supervisor's control channel, receive the run configuration, build data and
model, say ``ready``, then train in whatever generation the supervisor assigns (:mod:`.base`, and the trainer of
the run's parallel mode). The process always ends with ``os._exit``.
"""

from __future__ import annotations

import importlib
import os
import signal
import sys
import traceback
from datetime import timedelta
from pathlib import Path
from typing import Any, NoReturn

import torch
import torch.distributed as dist

from workbench.base import protocol
from workbench.base.entry import OneLineParser
from workbench.base.errors import ConfigError
from workbench.base.h5files import OutputError
from workbench.base.processes import die_with_parent
from workbench.config.run import RunConfig, config_from_wire
from workbench.rank.base import BaseTrainer
from workbench.rank.channel import Channel, cpu_time
from workbench.rank.join import Joined, join_or_exit, parse_address


def start_rank_process() -> None:
    """What every rank process does first (ours and the peers'): die with its parent; a launcher that stops it
    (torchrun stops a node's workers when one fails, a batch system cancels a job) makes it a dead rank like any
    other, for the strategy to handle, not an error of the run (a SIGHUP too, unless ignored: ``nohup``); one thread
    (gloo on CPU)."""
    die_with_parent()
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        if sig != signal.SIGHUP or signal.getsignal(sig) != signal.SIG_IGN:
            signal.signal(sig, lambda signum, frame: os._exit(128 + signum))
    torch.set_num_threads(1)


def serve(channel: Channel, body: Any, error_kind: str = "error") -> NoReturn:
    """Run ``body(start message)`` and end the process with ``os._exit``; an exception is reported in one line
    as ``error_kind`` (``error`` fails the run; ``peer_error`` is only an event: the peer handles it). An output
    that cannot be written (a checkpoint on a full disk: :class:`~workbench.base.h5files.OutputError`) always fails
    the run, with that as its ``reason``: no peer recovers a full disk."""
    code = 0
    try:
        body(channel.recv(timeout=120.0))
    except BaseException as exc:  # noqa: BLE001 - every failure is reported in one line, then the process ends
        code = 1
        detail = "".join(traceback.format_exception_only(type(exc), exc)).strip()
        output = isinstance(exc, OutputError)
        reason = str(exc) if output else None
        if isinstance(exc, getattr(torch, "OutOfMemoryError", ())):  # a GPU's memory: one line, the run's reason
            reason = detail = f"GPU out of memory on {torch.cuda.current_device()}: {str(exc).splitlines()[0][:160]}"
        channel.send(protocol.message("error" if output or reason else error_kind, message=detail, reason=reason,
                                      traceback=traceback.format_exc(limit=8)))
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def trainer_class(config: RunConfig) -> type[BaseTrainer]:
    """The trainer of the run's parallel mode: its object names it (``module:Class``), imported here, in the rank
    process."""
    module, _, name = config.mode.trainer.partition(":")
    return getattr(importlib.import_module(module), name)


def join_from_store(address: str, rank_hint: int | None, timeout: float,
                     joined: Joined | None = None) -> tuple[Channel, None]:
    """A rank started outside the supervisor (another host, torchrun, by hand): the store at ``address`` names
    the control server (key ``workbench/control``, :mod:`.join`); the supervisor gives this process a free rank
    slot. Errors are one line and exit 2. The rank's torch store is opened from the start message (``train``)."""
    joined = joined or join_or_exit(address, timeout, rank_hint)
    try:
        channel = Channel(joined.control_host, joined.control_port, None, connect_timeout=joined.timeout,
                          rank_hint=joined.rank_hint)
    except OSError as exc:
        print(f"workbench: error: the run at {address} named its control server {joined.control_host}:"
              f"{joined.control_port}, which did not answer ({exc.strerror or type(exc).__name__})",
              file=sys.stderr, flush=True)
        os._exit(2)
    return channel, None


def main(argv: list[str] | None = None, joined: Joined | None = None) -> None:
    """``joined``: the run already found by the caller (``workbench rank`` waits for it before importing torch)."""
    parser = OneLineParser(prog="python -m workbench.rank")
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--control", help="HOST:PORT of the supervisor's control channel (spawned ranks)")
    where.add_argument("--store", help="HOST:PORT of a run's store: join a run started elsewhere")
    parser.add_argument("--id", type=int, help="spawn id given by the supervisor (with --control)")
    parser.add_argument("--rank-hint", help="with --store: the rank number to take")
    parser.add_argument("--connect-timeout", default="60", help="with --store: seconds to wait for it (> 0)")
    args = parser.parse_args(argv)
    if args.control and args.id is None:
        parser.error("--control needs --id")
    if args.control:
        try:
            control = parse_address(args.control, "--control")
        except ConfigError as exc:
            parser.error(str(exc))
    if args.store and joined is None:  # before the signal handlers of a rank: Ctrl-C ends the wait in one line
        joined = join_or_exit(args.store, args.connect_timeout, args.rank_hint)
    start_rank_process()
    if args.store:
        channel, _ = join_from_store(args.store, None, 0.0, joined)
    else:
        channel = Channel(*control, args.id)

    def train(start: dict[str, Any]) -> None:
        config = config_from_wire(start["config"])  # checked by the supervisor
        store_host, _, store_port = start["store"].rpartition(":")
        store = dist.TCPStore(store_host, int(store_port), is_master=False,
                              timeout=timedelta(seconds=config.startup_timeout))
        for name in config.notice_signals:  # a preemption notice, not a death (Slurm's --signal, a drain)
            signal.signal(getattr(signal, name), lambda signum, frame: channel.notice(signum, config.preempt_grace))
        trainer = trainer_class(config)(config, channel, store, Path(start["checkpoint_dir"]))
        trainer.provenance = start.get("provenance") or {}  # the run's, kept in its checkpoints
        if config.speed_probe and trainer.provenance.get("probe_us"):  # the rank clock at the reference speed
            cpu_time.scale_to(float(trainer.provenance["probe_us"]))
        trainer.run()

    serve(channel, train)
