"""Entry point of a rank process (``python -m workbench.rank --control HOST:PORT --id N``) and its training loop.

Life of a rank: connect to the supervisor's control channel, receive the run configuration, build data and
model, then train. Whenever the supervisor announces a generation the rank joins its process group and takes
the state (step, parameters, optimizer state) broadcast by the generation's ``source`` rank, so every replica
is identical after any change of membership. The process always ends with ``os._exit``.
"""

from __future__ import annotations

import argparse
import ctypes
import hashlib
import io
import os
import signal
import sys
import time
import traceback
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

from workbench.config import FaultSpec, RunConfig
from workbench.data import BatchSequence, load_dataset, shard
from workbench.models import build_model
from workbench.rank.channel import Channel
from workbench.rank.comm import Comm, CommError, GenerationChanged
from workbench.rank.data_parallel import DataParallel


def _die_with_parent() -> None:
    """Linux: SIGKILL this process when the thread that started it ends (supervisor gone, kernel restarted)."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass  # not Linux: the control channel's end still stops the rank


def fingerprint(model: torch.nn.Module) -> str:
    """Hash of every parameter's bytes: data-parallel replicas must agree bit for bit."""
    digest = hashlib.sha256()
    for name, param in model.named_parameters():
        digest.update(name.encode())
        digest.update(param.detach().contiguous().numpy().tobytes())
    return digest.hexdigest()[:16]


class Trainer:
    def __init__(self, config: RunConfig, channel: Channel, store: dist.Store, faults: list[FaultSpec]) -> None:
        self.config = config
        self.channel = channel
        self.data = load_dataset(config)
        self.batches = BatchSequence(len(self.data.y_train), config.batch_size, config.seed)
        self.model = build_model(config, self.data.input_shape, self.data.num_classes)
        self.comm = Comm(store, channel, config.op_timeout)
        self.dp = DataParallel(self.model, self.comm, config.optimizer, config.lr, config.momentum,
                               config.bucket_cap_mb)
        self.step_faults = {f.step: f for f in faults if f.step is not None}
        self.step = 0
        self._current_step = -1
        self.dp.before_last_launch = self._fault_point

    # -- generations --------------------------------------------------------------------------------------------
    def join(self, assignment: dict[str, Any]) -> None:
        started = time.monotonic()
        self.comm.join(assignment)
        source = assignment["source"]
        payload = self._state_bytes() if self.comm.rank == source else None
        self._load_state_bytes(self.comm.broadcast_bytes(payload, source))
        self.channel.send({"type": "joined", "gen": self.comm.gen, "step": self.step,
                           "sync_s": time.monotonic() - started})

    def _state_bytes(self) -> bytes:
        buffer = io.BytesIO()
        torch.save({"step": self.step, "model": self.model.state_dict(), "optim": self.dp.optimizer_states()}, buffer)
        return buffer.getvalue()

    def _load_state_bytes(self, payload: bytes) -> None:
        state = torch.load(io.BytesIO(payload), weights_only=True)
        self.step = int(state["step"])
        self.model.load_state_dict(state["model"])
        self.dp.load_optimizer_states(state["optim"])

    # -- faults -------------------------------------------------------------------------------------------------
    def _fault_point(self) -> None:
        fault = self.step_faults.get(self._current_step)
        if fault is None:
            return
        del self.step_faults[self._current_step]
        self.dp.wait_launched()  # let the buckets already started complete everywhere: the fault lands mid-exchange
        self.channel.send({"type": "fault", "kind": fault.kind, "step": self._current_step, "t": time.time()})
        os.kill(os.getpid(), signal.SIGKILL if fault.kind == "kill" else signal.SIGSTOP)

    # -- training -----------------------------------------------------------------------------------------------
    def train_step(self) -> dict[str, Any]:
        step = self._current_step = self.step
        started = time.perf_counter()
        indices = torch.from_numpy(shard(self.batches(step), self.comm.rank, self.comm.size))
        x, y = self.data.x_train[indices], self.data.y_train[indices]
        self.model.train()
        out = self.model(x)
        loss_sum = F.cross_entropy(out, y, reduction="sum")
        correct = (out.detach().argmax(1) == y).sum()
        self.dp.begin(torch.stack([loss_sum.detach(), correct.float(), torch.tensor(float(len(y)))]))
        (loss_sum / self.config.batch_size).backward()
        stats = self.dp.finish()
        self.step = step + 1
        report: dict[str, Any] = {"type": "step", "step": step, "gen": self.comm.gen}
        if self.comm.rank == 0:
            report.update(loss=stats[0].item() / stats[2].item(), train_acc=stats[1].item() / stats[2].item(),
                          step_time=time.perf_counter() - started, t=time.time())
            if self.step % self.config.eval_interval == 0 or self.step == self.config.steps:
                report.update(self.evaluate())
        return report

    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        self.model.eval()
        out = self.model(self.data.x_test)
        loss = F.cross_entropy(out, self.data.y_test).item()
        accuracy = (out.argmax(1) == self.data.y_test).float().mean().item()
        return {"test_loss": loss, "test_acc": accuracy}

    def run(self) -> None:
        assignment = self._wait_assignment()
        while True:
            try:
                if self.comm.gen != assignment["gen"]:
                    self.join(assignment)
                while self.step < self.config.steps:
                    self.comm.check()
                    self.channel.send(self.train_step())
                break
            except GenerationChanged:
                assignment = self.channel.latest_generation
        self.channel.send({"type": "done", "step": self.step, "fingerprint": fingerprint(self.model)})

    def _wait_assignment(self) -> dict[str, Any]:
        deadline = time.monotonic() + self.config.startup_timeout
        while self.channel.latest_generation is None:
            if time.monotonic() > deadline:
                raise CommError("no generation was assigned in time")
            self.channel.wake.wait(0.1)
        return self.channel.latest_generation


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m workbench.rank")
    parser.add_argument("--control", required=True, help="HOST:PORT of the supervisor's control channel")
    parser.add_argument("--id", type=int, required=True, help="stable rank number")
    args = parser.parse_args(argv)
    _die_with_parent()
    torch.set_num_threads(1)
    host, _, port = args.control.rpartition(":")
    channel = Channel(host, int(port), args.id)
    code = 0
    try:
        start = channel.recv(timeout=120.0)
        config = RunConfig.from_dict(start["config"])
        store_host, _, store_port = start["store"].rpartition(":")
        store = dist.TCPStore(store_host, int(store_port), is_master=False,
                              timeout=timedelta(seconds=config.startup_timeout))
        faults = [FaultSpec.coerce(f) for f in start["faults"]]
        Trainer(config, channel, store, faults).run()
    except BaseException as exc:  # noqa: BLE001 - every failure is reported in one line, then the process ends
        code = 1
        detail = "".join(traceback.format_exception_only(type(exc), exc)).strip()
        channel.send({"type": "error", "message": detail, "traceback": traceback.format_exc(limit=8)})
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)

