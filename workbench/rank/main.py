"""Entry point of a rank process and its training loop. The supervisor spawns ``python -m workbench.rank
--control HOST:PORT --id N``; a rank started elsewhere joins with ``--store HOST:PORT [--rank-hint K]``.

Life of a rank: connect to the supervisor's control channel, receive the run configuration, build data and
model, say ``ready``, then train in whatever generation the supervisor assigns. On every generation the rank
joins its process group, settles the step in flight as the recovery strategy says (:mod:`.recovery`) and takes
the source's state (step, parameters, optimizer state) by broadcast, so every replica is identical after any
change of membership. The process always ends with ``os._exit``.
"""

from __future__ import annotations

import argparse
import copy
import ctypes
import hashlib
import os
import signal
import sys
import threading
import time
import traceback
from datetime import timedelta
from pathlib import Path
from typing import Any, NoReturn

import torch
import torch.distributed as dist
import torch.nn.functional as F

from workbench import apoptosis as apo
from workbench import checkpoint as ckpt
from workbench.config import FaultSpec, RunConfig
from workbench.data import BatchSequence, load_dataset, shard
from workbench.models import build_model
from workbench.protocol import CONTROL_KEY
from workbench.rank import state as st
from workbench.rank.channel import Channel
from workbench.rank.comm import Comm, GenerationChanged
from workbench.rank.data_parallel import ALARM_SLOTS, STATS_SLOTS, DataParallel, _clone_state, make_optimizer
from workbench.rank.recovery import InFlight, most_advanced
from workbench.rank.soft_errors import Detected, Detectors, Injector

FINAL_CHECKPOINT = "final.h5"  # the trained model of every completed run, beside the periodic checkpoints


def _die_with_parent() -> None:
    """Linux: SIGKILL this process when the thread that started it ends (supervisor gone, kernel restarted)."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass  # not Linux: the control channel's end still stops the rank


@torch.no_grad()
def evaluate(model: torch.nn.Module, data: Any) -> dict[str, float]:
    """Test loss and accuracy of a whole model (ours and the peers')."""
    training = model.training
    model.eval()
    out = model(data.x_test)
    model.train(training)
    return {"test_loss": F.cross_entropy(out, data.y_test).item(),
            "test_acc": (out.argmax(1) == data.y_test).float().mean().item()}


def start_rank_process() -> None:
    """What every rank process does first (ours and the peers'): die with its parent; a launcher that stops it
    (torchrun stops a node's workers when one fails, a batch system cancels a job) makes it a dead rank like any
    other, for the strategy to handle, not an error of the run; one thread (gloo on CPU)."""
    _die_with_parent()
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


def fingerprint(model: torch.nn.Module) -> str:
    """Hash of every parameter's bytes: data-parallel replicas must agree bit for bit."""
    digest = hashlib.sha256()
    for name, param in model.named_parameters():
        digest.update(name.encode())
        digest.update(param.detach().contiguous().numpy().tobytes())
    return digest.hexdigest()[:16]


class BaseTrainer:
    """What every parallel mode shares: data, the generation loop, planned faults, step reports, checkpoints.

    A mode implements ``join`` (settle a new generation), ``train_step``, and the state accessors used by
    checkpoints and bit flips (``checkpoint_state``, ``optimizer_state_of``); ``evaluate`` is overridden where the
    model is spread over ranks (then every member takes part).
    """

    def __init__(self, config: RunConfig, channel: Channel, store: dist.Store, checkpoint_dir: Path) -> None:
        self.config = config
        self.channel = channel
        self.checkpoint_dir = checkpoint_dir
        self.data = load_dataset(config)
        self.batches = BatchSequence(len(self.data.y_train), config.batch_size, config.seed)
        self.model = build_model(config, self.data.input_shape, self.data.num_classes)
        self.comm = Comm(store, channel, config.op_timeout)
        self.step = 0
        self.trained = False  # holds a real training state (not a fresh replacement)
        self.inflight: InFlight | None = None
        self.step_faults: dict[int, FaultSpec] = {}
        self.random_steps: set[int] = set()
        self.memory_snapshot: bytes | None = None  # reinit: the last global snapshot
        self._writer: threading.Thread | None = None
        self.traffic = (0, 0)  # messages and bytes this rank sent in the last step (counted, see README)

    def _set_faults(self, a: dict[str, Any]) -> list[FaultSpec]:
        faults = [FaultSpec.parse(f) for f in a.get("faults", [])]
        self.step_faults = {f.step: f for f in faults if f.kind in ("kill", "hang")}
        self.random_steps = set(a.get("random_steps", []))
        return faults

    # -- faults -------------------------------------------------------------------------------------------------
    def _fault_point(self) -> None:
        """Planned kill/hang of this step fires here, at the mode's mid-step point."""
        fault = self.step_faults.pop(self.inflight.step, None)
        if fault is None:
            return
        self._before_fault()
        self.channel.send({"type": "fault", "kind": fault.kind, "step": self.inflight.step, "t": time.time(),
                           "random": self.inflight.step in self.random_steps})
        os.kill(os.getpid(), signal.SIGKILL if fault.kind == "kill" else signal.SIGSTOP)

    def _before_fault(self) -> None:
        """Let the communication this step already started complete everywhere: the fault lands mid-exchange."""

    def _report_flip(self, fault: FaultSpec, flip: Any, step: int) -> None:
        self.channel.send({"type": "flip", "step": step, "target": fault.target, "tensor": flip.target,
                           "index": flip.index, "bit": flip.bits[0] if flip.bits else -1, "old": flip.old,
                           "new": flip.new, "planned": fault.step, "t": time.time()})

    def _take_live_faults(self) -> None:
        if self.channel.live_faults:
            live, self.channel.live_faults[:] = list(self.channel.live_faults), []
            self.injector.pending += [FaultSpec.parse(f) for f in live]

    def _begin_step(self) -> tuple[int, float]:
        """Mark the step in flight and fire the flips due at its start; returns (step, start time)."""
        self.inflight = InFlight(self.step, self.comm.rank, self.comm.size)
        self._take_live_faults()
        self.injector.at_step_start(self.step, self.optimizer_state_of)
        return self.step, time.perf_counter()

    # -- one optimizer over this rank's parameters (gossip replicas, pipeline stages) ------------------------------
    def _own_optimizer(self) -> None:
        self.named = [(n, p) for n, p in self.model.named_parameters() if p.requires_grad]
        self.params = [p for _, p in self.named]
        self.optimizer = make_optimizer(self.config.optimizer, self.params, self.config.lr, self.config.momentum)

    def optimizer_state_of(self, name: str) -> dict[str, torch.Tensor]:
        return self.optimizer.state.get(dict(self.named)[name], {})

    def _local_state(self) -> tuple[dict[str, torch.Tensor], dict[str, dict[str, torch.Tensor]]]:
        """(model state, optimizer state per parameter name) of what this rank holds, cloned."""
        return ({k: v.detach().clone() for k, v in self.model.state_dict().items()},
                st.named_optimizer_state(self.optimizer, self.named))

    def _replica_snapshot(self) -> None:
        """Every ``checkpoint_every`` steps of a replicated mode: reinit keeps this replica's state in memory,
        checkpoint_restart has rank 0 write its replica to HDF5."""
        every = self.config.checkpoint_every
        if every and self.step % every == 0:
            if self.config.strategy == "reinit":
                self.memory_snapshot = self._state_bytes()
            elif self.config.strategy == "checkpoint_restart" and self.comm.rank == 0:
                self._write_checkpoint()

    def _state_bytes(self) -> bytes:
        raise NotImplementedError

    # -- reports ------------------------------------------------------------------------------------------------
    def _report_step(self, step: int, stats: torch.Tensor, started: float, extra: dict[str, Any] | None = None,
                     evaluation: dict[str, float] | None = None) -> None:
        """Rank 0 of the generation reports the step's global figures (stats: loss sum, correct, samples)."""
        report: dict[str, Any] = {"type": "step", "step": step, "gen": self.comm.gen}
        if self.comm.rank == 0:
            samples = max(stats[2].item(), 1.0)
            report.update(loss=stats[0].item() / samples, train_acc=stats[1].item() / samples, samples=int(samples),
                          step_time=time.perf_counter() - started, t=time.time(), messages=self.traffic[0],
                          bytes_sent=self.traffic[1], **(extra or {}))
            if evaluation:
                report.update(evaluation)
        self.channel.send(report)

    def _evaluation_due(self) -> bool:
        return self.step % self.config.eval_interval == 0 or self.step == self.config.steps

    def evaluate(self) -> dict[str, float]:
        return evaluate(self.model, self.data)

    # -- checkpoints --------------------------------------------------------------------------------------------
    def checkpoint_state(self) -> tuple[dict[str, torch.Tensor], dict[str, dict[str, torch.Tensor]]]:
        """(model state, optimizer state per parameter name) of the whole model, cloned; collective where the
        model is spread over ranks (every member calls it)."""
        raise NotImplementedError

    def _write_checkpoint(self, name: str | None = None,
                          state: tuple[dict[str, torch.Tensor], dict] | None = None) -> None:
        """Snapshot in memory (the only stall), write HDF5 on a background thread, then tell the supervisor."""
        started = time.perf_counter()
        if self._writer is not None:
            self._writer.join()  # one write at a time; the previous one is normally long done
        model_state, optimizer_state = state if state is not None else self.checkpoint_state()
        snapshot = ckpt.Checkpoint(self.step, model_state, optimizer_state, torch.get_rng_state(), self.config.seed,
                                   self.config.to_dict(), self.extra_state())
        stall = time.perf_counter() - started
        path = self.checkpoint_dir / (name or ckpt.checkpoint_name(self.step))

        def write() -> None:
            began = time.perf_counter()
            ckpt.save(path, snapshot)
            self.channel.send({"type": "checkpoint", "step": snapshot.step, "path": str(path), "stall_s": stall,
                               "write_s": time.perf_counter() - began})

        self._writer = threading.Thread(target=write, name="wb-checkpoint", daemon=True)
        self._writer.start()

    def extra_state(self) -> dict[str, torch.Tensor]:
        """Training state beyond model and optimizer that a checkpoint keeps (the apoptosis rule's)."""
        return {}

    def _final_checkpoint(self) -> None:
        if self.comm.rank == 0:
            self._write_checkpoint(FINAL_CHECKPOINT)

    # -- the loop -----------------------------------------------------------------------------------------------
    def join(self, a: dict[str, Any]) -> None:
        raise NotImplementedError

    def train_step(self) -> None:
        raise NotImplementedError

    def run(self) -> None:
        self.channel.send({"type": "ready"})
        assignment = self._wait_assignment()
        while True:
            try:
                if self.comm.gen != assignment["gen"]:
                    self.join(assignment)
                while self.step < self.config.steps:
                    self.comm.check()
                    try:
                        self.train_step()
                    except Detected as detected:
                        self._recover_soft(detected)
                self._final_checkpoint()
                break
            except GenerationChanged:
                assignment = self.channel.latest_generation
        if self._writer is not None:
            self._writer.join()
        self.channel.send({"type": "done", "step": self.step, "fingerprint": fingerprint(self.model),
                           "group": self.replica_group()})

    def replica_group(self) -> int:
        """Members with the same group hold replicas of the same parameters (a pipeline stage's replicas)."""
        return 0

    def _recover_soft(self, detected: Detected) -> None:
        raise NotImplementedError

    def _wait_assignment(self) -> dict[str, Any]:
        while self.channel.latest_generation is None:  # a warm spare may wait here for the whole run
            self.channel.wake.wait(0.5)
        return self.channel.latest_generation


class Trainer(BaseTrainer):
    """Data parallel: every rank a full replica, bucketed allreduce of the gradients (:mod:`.data_parallel`)."""

    def __init__(self, config: RunConfig, channel: Channel, store: dist.Store, checkpoint_dir: Path) -> None:
        super().__init__(config, channel, store, checkpoint_dir)
        self.rule = config.apoptosis_rule
        self.pairs = apo.require_pairs(self.model) if self.rule is not None else apo.find_pairs(self.model)
        if self.rule is not None:
            # dying units leave subnormal floats in activations, gradients and momentum, which slow every CPU op
            # that touches them 3-5x (measured); flushed to zero they are what they mean: nothing
            torch.set_flush_denormal(True)
        self.apoptosis = self._fresh_rule()
        self._build_dp()
        self.injector = Injector(self.model, self._report_flip)
        self.detectors = Detectors(config, self.model)
        self._detections: set[tuple[int, str]] = set()  # (step, detector) of every alarm seen
        self.verified: dict[str, Any] | None = None  # last verified in-memory snapshot (soft-error recovery)

    def _build_dp(self) -> None:
        """Gradient buckets, hooks and optimizers for the model's current parameters (again after every change of
        shapes: the parameters are new objects then)."""
        config, strategy = self.config, self.config.strategy
        self.dp = DataParallel(self.model, self.comm, config.optimizer, config.lr, config.momentum,
                               config.bucket_cap_mb, update_per_bucket=strategy != "shrink",
                               keep_local=strategy in ("shrink", "forward"), snapshot_buckets=strategy == "rollback")
        self.dp.before_last_launch = self._fault_point
        self.dp.on_launch = self._on_launch
        self.dp.on_reduced = self._on_reduced
        self.size = {"parameters": apo.parameter_count(self.model),
                     "hidden_units": apo.hidden_units(self.model, self.pairs)}

    # -- apoptosis ------------------------------------------------------------------------------------------------
    def _fresh_rule(self) -> apo.Apoptosis | None:
        if self.rule is None:
            return None
        return apo.Apoptosis(self.rule, {p.layer: p.units(self.model) for p in self.pairs})

    def _adopt_shapes(self, model_state: dict[str, torch.Tensor]) -> None:
        """Make the model match the shapes of a state about to be loaded (a full-size fresh or replacement rank
        receiving a shrunk state, a rollback to before a removal) and rebuild the exchange if anything changed."""
        if apo.resize_to(self.model, {k: v.shape for k, v in model_state.items()}):
            self._build_dp()
            self.injector.refresh()
            self.detectors.refresh()

    def _load_rule(self, state: dict[str, torch.Tensor] | None) -> None:
        if self.rule is None:
            return
        self.apoptosis = self._fresh_rule()  # widths of the current shapes (a state that predates the rule)
        if state:
            self.apoptosis.load_state_dict(state)

    def extra_state(self) -> dict[str, torch.Tensor]:
        return self.apoptosis.state_dict() if self.apoptosis is not None else {}

    def _apoptosis_step(self, evaluation: dict[str, float] | None) -> None:
        """At an evaluation: rank 0 (which holds the test accuracy) observes the replicated parameters' unit
        norms and decides; the rule's state and the removal flags are broadcast, so every rank removes the same
        units at the same step, then rebuilds its buckets and optimizers for the new shapes. A generation change
        during the broadcast is harmless: the new generation adopts its source's model, shapes and rule state."""
        if self.comm.rank == 0:
            removals = self.apoptosis.observe(apo.unit_norms(self.model, self.pairs), evaluation["test_acc"])
            packed = self.apoptosis.pack(removals)
        else:
            packed = torch.zeros(self.apoptosis.packed_size(), dtype=torch.float64)
        if self.comm.size > 1:
            self.comm.broadcast(packed, 0)
        removals = self.apoptosis.unpack(packed)
        removals = {layer: gone for layer, gone in removals.items() if len(gone)}
        if not removals:
            return
        widths = {p.layer: p.units(self.model) for p in self.pairs}
        optimizer_state = apo.shrink(self.model, self.pairs, removals, self.dp.named_optimizer_state())
        self.apoptosis.forget(removals)
        self._build_dp()
        self.dp.load_named_optimizer_state(optimizer_state)
        self.injector.refresh()
        self.detectors.refresh()
        if self.comm.rank == 0:
            self.channel.send({"type": "apoptosis", "step": self.step - 1, "tau": self.apoptosis.tau,
                               "removed": {layer: len(gone) for layer, gone in removals.items()},
                               "widths": {layer: [widths[layer], widths[layer] - len(gone)]
                                          for layer, gone in removals.items()}, **self.size})

    # -- generations --------------------------------------------------------------------------------------------
    def join(self, a: dict[str, Any]) -> None:
        started = time.monotonic()
        recovery = a.get("recovery")
        self.injector.set(self._set_faults(a))
        self.comm.join(a)
        if recovery == "rollback" and self.inflight is not None:
            self.dp.restore_applied()
        source = a["source"]
        if source is None:
            applied = self.dp.applied if self.inflight is not None and self.inflight.step == self.step else 0
            score = self.step * (len(self.dp.buckets) + 1) + applied if self.trained else -1.0
            source = most_advanced(self.comm, score)
        payload = self._source_state(a) if self.comm.rank == source else None
        state = self._load_state_bytes(self.comm.broadcast_bytes(payload, source))
        report: dict[str, Any] = {"type": "joined", "gen": self.comm.gen, "step": self.step,
                                  "sync_s": time.monotonic() - started}
        if recovery and self.comm.rank == 0:
            report.update(recovery=recovery, resume_step=self.step, retried=False)
        if recovery in ("shrink", "forward") and state["inflight"] is not None:
            # the failed step: finish its exchange among the members with the gradients they kept
            mine = self.inflight is not None and self.inflight.step == self.step
            stats = self.dp.retry(state["inflight"]["applied"], have_local=mine)
            if recovery and self.comm.rank == 0:
                report["retried"] = True
            self.channel.send(report)
            self._commit(self.step, stats, started=time.perf_counter())
        else:
            self.channel.send(report)
        self.inflight = None
        self.trained = True
        if self.detectors.active:
            self.verified = self._snapshot()  # replicas are identical right after a sync

    def _source_state(self, a: dict[str, Any]) -> bytes:
        if a.get("recovery") == "reinit" and self.memory_snapshot is not None:
            return self.memory_snapshot
        if a.get("resume"):
            restored = ckpt.load(a["resume"], check=self.config.resume_verify)
            self._adopt_shapes(restored.model)  # a checkpoint of a shrunk model: its shapes first
            self.model.load_state_dict(restored.model)
            self.dp.load_named_optimizer_state(restored.optimizer)
            self._load_rule(restored.apoptosis)
            self.step = restored.step
            self.inflight = None
        return self._state_bytes()

    def _state_bytes(self) -> bytes:
        inflight = None
        if self.inflight is not None and self.inflight.step == self.step:
            inflight = {"step": self.step, "applied": self.dp.applied}
        return st.to_bytes({"step": self.step, "model": self.model.state_dict(), "optim": self.dp.optimizer_states(),
                            "inflight": inflight, "apoptosis": self.extra_state()})

    def _snapshot(self) -> dict[str, Any]:
        """In-memory copy of the training state (tensors cloned, nothing serialised)."""
        return {"step": self.step, "model": {k: v.detach().clone() for k, v in self.model.state_dict().items()},
                "optim": [_clone_state(b.optimizer) for b in self.dp.buckets], "apoptosis": self.extra_state()}

    def _restore(self, snapshot: dict[str, Any]) -> None:
        self.step = snapshot["step"]
        self._adopt_shapes(snapshot["model"])  # the snapshot may predate a removal
        self.model.load_state_dict(snapshot["model"])
        # the optimizer adopts the tensors it is given: hand it copies, the snapshot may serve again
        self.dp.load_optimizer_states(copy.deepcopy(snapshot["optim"]))
        self._load_rule(snapshot.get("apoptosis"))

    def _load_state_bytes(self, payload: bytes) -> dict[str, Any]:
        state = st.from_bytes(payload)
        self.step = int(state["step"])
        self._adopt_shapes(state["model"])  # e.g. a full-size replacement receiving a shrunk model
        self.model.load_state_dict(state["model"])
        self.dp.load_optimizer_states(state["optim"])
        self._load_rule(state.get("apoptosis"))
        return state

    def _before_fault(self) -> None:
        self.dp.wait_launched()

    # -- soft errors --------------------------------------------------------------------------------------------
    def _on_launch(self, bucket: Any) -> None:
        self.injector.into_bucket("grad", self.inflight.step, bucket.names, bucket.views)

    def _on_reduced(self, bucket: Any) -> None:
        step = self.inflight.step
        if self.detectors.active:
            if bucket.index == 0:
                self.detectors.check_alarms(bucket.buffer[-ALARM_SLOTS:], step)
            gradients = bucket.buffer[:-STATS_SLOTS] if bucket.index == 0 else bucket.buffer
            self.detectors.check_reduced(gradients, bucket.names, step)
        self.injector.into_bucket("grad_local", step, bucket.names, bucket.views)

    def _recover_soft(self, detected: Detected) -> None:
        """Every rank saw the same alarm: return to the last verified snapshot."""
        self.dp.drain()
        at = self.inflight.step if self.inflight is not None else self.step
        self.inflight = None
        self._restore(self.verified)
        action = "rollback"
        if (at, detected.detector) in self._detections:
            self.detectors.suppressed.add(at)
            action = "rollback; the alarm repeats on replay (deterministic, not transient): the step is let through"
        self._detections.add((at, detected.detector))
        if self.comm.rank == 0:
            self.channel.send({"type": "detected", "step": at, "detector": detected.detector,
                               "detail": detected.detail, "action": action, "to_step": self.step})

    def _verify_replicas(self) -> None:
        """Fingerprint check every ``detect_every`` steps; a verified state becomes the snapshot to return to."""
        if "fingerprint" in self.detectors.on and self.comm.size > 1:
            mine = torch.tensor([self.detectors.fingerprint()], dtype=torch.int64)
            everyone = [torch.zeros(1, dtype=torch.int64) for _ in range(self.comm.size)]
            self.comm.wait(self.comm.group.allgather([everyone], [mine]))
            values = [int(t.item()) for t in everyone]
            if len(set(values)) > 1:
                majority, count = max(((v, values.count(v)) for v in set(values)), key=lambda vc: vc[1])
                odd = [r for r, v in enumerate(values) if v != majority]
                if count * 2 > len(values):
                    source = values.index(majority)
                    payload = self._state_bytes() if self.comm.rank == source else None
                    self._load_state_bytes(self.comm.broadcast_bytes(payload, source))
                    action = f"re-broadcast from rank {source} of the agreeing majority"
                else:
                    self._restore(self.verified)
                    action = "rollback"
                if self.comm.rank == 0:
                    self.channel.send({"type": "detected", "step": self.step - 1, "detector": "fingerprint",
                                       "detail": f"replicas at generation ranks {odd} differ", "action": action,
                                       "to_step": self.step})
                return
        self.verified = self._snapshot()

    # -- training -----------------------------------------------------------------------------------------------
    def train_step(self) -> None:
        step, started = self._begin_step()
        indices = torch.from_numpy(shard(self.batches(step), self.comm.rank, self.comm.size))
        x, y = self.data.x_train[indices], self.data.y_train[indices]
        self.model.train()
        out = self.model(x)
        loss_sum = F.cross_entropy(out, y, reduction="sum")
        correct = (out.detach().argmax(1) == y).sum()
        alarms = self.detectors.local_alarms(loss_sum.item() / len(y)) if self.detectors.active else [0.0, 0.0]
        self.dp.begin(torch.tensor([loss_sum.item(), correct.item(), float(len(y)), *alarms]))
        (loss_sum / self.config.batch_size).backward()
        stats = self.dp.finish()
        self.inflight = None
        self._commit(step, stats, started)

    def _commit(self, step: int, stats: torch.Tensor, started: float) -> None:
        self.step = step + 1
        if self.rule is not None:
            # the pressure of our apoptosis reading, on replicated parameters: every replica applies the same
            pressure = self.rule.pressure_due(step, self.config.steps)
            if pressure > 0:
                apo.group_lasso_(self.model, self.pairs, pressure, self.config.lr, self.rule.gamma)
        self.traffic = self.dp.traffic()
        evaluation = self.evaluate() if self.comm.rank == 0 and self._evaluation_due() else None
        self._report_step(step, stats, started, extra=dict(self.size), evaluation=evaluation)
        if self.rule is not None and self._evaluation_due() and self.step < self.config.steps:
            self._apoptosis_step(evaluation)  # never at the last evaluation: the final accuracy is the model's
        if self.detectors.active and self.step % self.detectors.every == 0:
            self._verify_replicas()
        self._replica_snapshot()

    def checkpoint_state(self) -> tuple[dict[str, torch.Tensor], dict[str, dict[str, torch.Tensor]]]:
        return {k: v.detach().clone() for k, v in self.model.state_dict().items()}, self.dp.named_optimizer_state()

    def optimizer_state_of(self, name: str) -> dict[str, torch.Tensor]:
        return self.dp.optimizer_state_of(name)


def trainer_class(config: RunConfig) -> type[BaseTrainer]:
    if config.parallelism == "gossip":
        from workbench.rank.gossip import GossipTrainer

        return GossipTrainer
    if config.parallelism in ("pipeline", "hybrid"):
        from workbench.rank.pipeline import PipelineTrainer

        return PipelineTrainer
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
        trainer_class(config)(config, channel, joined_store, Path(start["checkpoint_dir"])).run()

    serve(channel, train)
