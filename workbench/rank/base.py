"""What every parallel mode's trainer shares (:class:`BaseTrainer`): data, the generation loop, planned faults,
step reports, checkpoints, a GPU rank's device, and the rank's side of the learning-rate rule of a resize
(:mod:`workbench.config.resize_rule`).

A mode (:mod:`.replicated` data parallel, :mod:`.pipeline`, :mod:`.gossip`) implements ``join`` (settle a new
generation), ``train_step`` and the state accessors used by checkpoints and bit flips.
"""

from __future__ import annotations

import os
import signal
import threading
import time
import traceback
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from workbench import strategies
from workbench.base import checkpoint as ckpt
from workbench.base import protocol
from workbench.base.h5files import OutputError
from workbench.config import devices, lr_schedule, resize_rule
from workbench.config.run import FaultSpec, RunConfig
from workbench.faults import kinds
from workbench.rank import staging
from workbench.rank import state as st
from workbench.rank.channel import Channel, cpu_time
from workbench.rank.comm import Comm, CommError, GenerationChanged
from workbench.rank.optim import make_optimizer
from workbench.rank.readings import evaluate, fingerprint
from workbench.rank.recovery import InFlight
from workbench.rank.soft_errors import Detected, Injector
from workbench.rank.throttle import Throttle
from workbench.workloads.data import BatchSequence, checksum_of, load_dataset
from workbench.workloads.models import build_model

FINAL_CHECKPOINT = "final.h5"  # the trained model of every completed run, beside the periodic checkpoints


class BaseTrainer:
    """What every parallel mode shares: data, the generation loop, planned faults, step reports, checkpoints, and
    the learning-rate rule of a resize.

    A mode implements ``join`` (settle a new generation), ``train_step``, and the state accessors used by
    checkpoints and bit flips (``checkpoint_state``, ``optimizer_state_of``); ``evaluate`` is overridden where the
    model is spread over ranks (then every member takes part).
    """

    provenance: dict[str, Any] = {}  # the run's (results.provenance), from the start message; in checkpoints
    scale: resize_rule.Scale | None = None  # resize_rule linear: the run's resizes so far (None: keep)

    def __init__(self, config: RunConfig, channel: Channel, store: dist.Store, checkpoint_dir: Path) -> None:
        self.config = config
        if config.flushes_denormals:
            # dying units leave subnormal floats in activations, gradients and momentum, which slow every CPU op
            # that touches them 3-5x (measured); flushed to zero they are what they mean: nothing. An apoptosis
            # campaign sets it for its arms without apoptosis too (flush_denormal)
            torch.set_flush_denormal(True)
        # what this run's ranks keep and do (workbench/strategies/registry.py)
        self.strategy = strategies.get(config.strategy)
        self.channel = channel
        self.checkpoint_dir = checkpoint_dir
        # a GPU rank builds on the CPU and takes its GPU when first put in a generation (_take_gpu): a warm spare
        # holds no GPU memory until it is used
        self.device = torch.device("cpu")
        self._gpu_wait: float | None = None  # seconds the rank waited for dead ranks' GPU memory (first joined)
        self.data = load_dataset(config)
        self.batches = BatchSequence(len(self.data.y_train), config.batch_size, config.seed)
        self.model = build_model(config, self.data.input_shape, self.data.num_classes).to(self.device)
        self.comm = Comm(store, channel, config.op_timeout)
        self.step = 0
        self.trained = False  # holds a real training state (not a fresh replacement)
        self.detector_s = 0.0  # time this rank spent in the soft-error detectors' checks (and their recoveries)
        self.inflight: InFlight | None = None
        self.step_faults: dict[int, FaultSpec] = {}
        self.random_steps: set[int] = set()
        self.throttle = Throttle()  # a slow rank's (slow faults, run.slow)
        self.injector = Injector(self.model, self._report_flip)  # bit flips (a pipeline stage: its own module's)
        self.memory_snapshot: Any = None  # reinit: the last global snapshot
        self._writer: staging.Writer | None = None  # the checkpoint writer thread, from the first checkpoint on
        self._staged: staging.Staged | None = None  # a checkpoint's copy under way (see _write_checkpoint)
        self._staging_cache: dict[str, torch.Tensor] = {}  # the writer's copy buffers, kept between checkpoints
        self.traffic = (0, 0)  # messages and bytes this rank sent in the last step (docs/parallel-modes.md, Traffic)

    def _set_faults(self, a: dict[str, Any]) -> list[FaultSpec]:
        faults = [FaultSpec.parse(f) for f in a.get("faults", [])]
        self.step_faults = {f.step: f for f in faults if kinds.of(f).fires is kinds.Fires.RANK}
        self.random_steps = set(a.get("random_steps", []))
        self.throttle.plan(faults)
        return faults

    # -- faults -------------------------------------------------------------------------------------------------
    def _fault_point(self) -> None:
        """Planned kill/hang/stall of this step fires here, at the mode's mid-step point; a slow rank burns its
        extra time here too (before its last exchange: the others wait for it)."""
        self.throttle.burn()
        fault = self.step_faults.pop(self.inflight.step, None)
        if fault is None:
            return
        kind = kinds.of(fault)
        if kind.notice or kind.hold is not None:  # a notice (this step finishes; the supervisor stops everyone
            # after it) or a fault the step survives (a delay holds the rank's messages back, then goes on)
            self.channel.send(protocol.message("fault", kind=kind.name, step=self.inflight.step, t=time.time()))
            if kind.hold is not None:
                kind.hold(fault)
            return
        try:
            self._before_fault()
        except (GenerationChanged, CommError):
            pass  # another member's planned fault changed the world first: this one fires all the same
        if self._writer is not None:
            # a checkpoint write under way finishes first: a planned experiment's restart point must not depend
            # on how fast the disk was (live kills land wherever they land, inside writes included)
            self._writer.join()
        self.channel.send(protocol.message("fault", kind=fault.kind, step=self.inflight.step, t=time.time(),
                                           random=self.inflight.step in self.random_steps,
                                           process_cpu=time.process_time()))
        if kind.blocks:
            # the training thread blocks for good while the heartbeat goes on: the supervisor's progress watchdog
            # kills this process (and a rank whose supervisor is gone exits with its connection)
            threading.Event().wait()
        os.kill(os.getpid(), getattr(signal, kind.signal))

    def _before_fault(self) -> None:
        """Let the communication this step already started complete everywhere: the fault lands mid-exchange."""

    def _report_flip(self, fault: FaultSpec, flip: Any, step: int) -> None:
        self.channel.send(protocol.message("flip", step=step, target=fault.target, tensor=flip.target,
                                           index=flip.index, bit=flip.bits[0] if flip.bits else -1, old=flip.old,
                                           new=flip.new, planned=fault.step, t=time.time()))

    def _take_live_faults(self) -> None:
        if self.channel.live_faults:
            live, self.channel.live_faults[:] = list(self.channel.live_faults), []
            faults = [FaultSpec.parse(f) for f in live]
            for fault in (f for f in faults if kinds.of(f).fires is kinds.Fires.RANK):
                self.step_faults[self.step] = fault  # at this step's fault point (a stall, a delay)
            self.injector.pending += [f for f in faults if kinds.of(f).fires is kinds.Fires.INJECTOR]

    def _begin_step(self) -> tuple[int, float]:
        """Mark the step in flight and fire the flips due at its start; returns (step, start time)."""
        self.inflight = InFlight(self.step, self.comm.rank, self.comm.size)
        self._take_live_faults()
        live, self.channel.throttle = self.channel.throttle, None
        if live is not None:
            self.throttle.set_live(*live)
        self.throttle.begin(self.step)
        self.apply_lr()
        if self.injector.flips_state(self.step):
            self._checkpoint_copied()  # a flip writes the weights or the optimizer state in place
        self.injector.at_step_start(self.step, self.optimizer_state_of)
        return self.step, time.perf_counter()

    # -- one optimizer over this rank's parameters (gossip replicas, pipeline stages) ------------------------------
    def _own_optimizer(self) -> None:
        self.named = [(n, p) for n, p in self.model.named_parameters() if p.requires_grad]
        self.params = [p for _, p in self.named]
        self.optimizer = make_optimizer(self.config.optimizer, self.params, self.config.lr, self.config.momentum)

    def optimizer_state_of(self, name: str) -> dict[str, torch.Tensor]:
        return self.optimizer.state.get(dict(self.named)[name], {})

    def _named_state(self) -> list[tuple[str, torch.Tensor]]:
        """This rank's training state as named live tensors (what a generation change compares and moves): the
        model's state dict (buffers included) and the optimizer's per-parameter tensors."""
        named = [(f"model/{k}", v) for k, v in self.model.state_dict().items()]
        for name, param in self.named:
            state = self.optimizer.state.get(param, {})
            named += [(f"optim/{name}/{key}", v) for key, v in sorted(state.items()) if torch.is_tensor(v)]
        return named

    def _place(self, header: dict[str, Any]) -> dict[str, torch.Tensor]:
        """A receiver takes the source's state into its own tensors (these modes' shapes never change; the
        optimizer's history exists from step 0: ``state.init_history``)."""
        own = dict(self._named_state())
        for name, shape, dtype in header["tensors"]:
            tensor = own.get(name)
            if tensor is None or list(tensor.shape) != shape or str(tensor.dtype).removeprefix("torch.") != dtype:
                raise RuntimeError(f"state transfer: {name} {shape} {dtype} does not fit this rank's state")
        return own

    def _local_state(self) -> tuple[dict[str, torch.Tensor], dict[str, dict[str, torch.Tensor]]]:
        """(model state, optimizer state per parameter name) of what this rank holds, cloned."""
        return ({k: v.detach().clone() for k, v in self.model.state_dict().items()},
                st.named_optimizer_state(self.optimizer, self.named))

    def _periodic_snapshot(self) -> None:
        """Every ``checkpoint_every`` steps, what the strategy keeps: a snapshot in memory (reinit) or an HDF5
        checkpoint (checkpoint_restart)."""
        every = self.config.checkpoint_every
        if every and self.step % every == 0:
            if self.strategy.memory_snapshot:
                self.memory_snapshot = self._take_memory_snapshot()
            elif self.strategy.writes_checkpoints:
                self._checkpoint_now()

    def _first_snapshot(self) -> None:
        """After a join: the state every member holds is the first to return to, if there is none yet (the
        initial or resumed state; for a replacement, the snapshot the others have just restored)."""
        if self.strategy.memory_snapshot and self.memory_snapshot is None:
            self.memory_snapshot = self._take_memory_snapshot()

    def _checkpoint_now(self) -> None:
        """A replica's checkpoint: rank 0 writes its own state."""
        if self.comm.rank == 0:
            self._write_checkpoint()

    def _take_memory_snapshot(self) -> Any:
        """The strategy's snapshot in memory (copies of the tensors), restored in place by a join."""
        raise NotImplementedError

    # -- the learning-rate rule of a resize ------------------------------------------------------------------------
    # Under ``linear`` every generation message carries the run's history of resizes (``rule``), from which the
    # rank takes each step's global batch, learning rate (every parameter group; the momentum buffers stay) and
    # place in the sample stream. Under ``keep`` (``scale`` None) nothing here changes a thing: the global batch
    # is ``batch_size`` and the learning rate ``lr``.
    def adopt_rule(self, a: dict[str, Any]) -> None:
        """Generation ``a``'s history of resizes (the same in every member's message; newcomers get it here)."""
        scale = resize_rule.from_message(self.config, a.get("rule"))
        if scale is not None and (self.scale is None or scale.history != self.scale.history):
            self.scale = scale
            self.batches = self.batch_sequence()

    def batch_sequence(self) -> BatchSequence:
        """The global batches of every step (read by a sample cursor under ``linear``, once the run has resized)."""
        return BatchSequence(len(self.data.y_train), self.config.batch_size, self.config.seed,
                             self.scale.segments() if self.scale is not None else None)

    def global_batch(self, step: int) -> int:
        return self.config.batch_size if self.scale is None else self.scale.global_batch(step)

    def lr_at(self, step: int) -> float:
        """The resize rule's learning rate at ``step`` times the schedule's factor (``lr_schedule``)."""
        base = self.config.lr if self.scale is None else self.scale.lr_at(step)
        return base * lr_schedule.factor(self.config.lr_schedule, step, self.config.steps)

    def apply_lr(self) -> None:
        """Every parameter group of this rank's optimizers takes the learning rate of the step about to run."""
        if self.scale is None and self.config.lr_schedule == "constant":
            return
        lr_schedule.set_lr(self.optimizers(), self.lr_at(self.step))

    def optimizers(self) -> list[Any]:
        return [self.optimizer]

    def rule_report(self, step: int) -> dict[str, Any]:
        """A step report's ``lr`` (``linear`` or a schedule) and ``global_batch`` (``linear`` only)."""
        if self.scale is None:
            return {} if self.config.lr_schedule == "constant" else {"lr": self.lr_at(step)}
        return {"lr": self.lr_at(step), "global_batch": self.scale.global_batch(step)}

    def rule_record(self) -> dict[str, Any]:
        """What a checkpoint keeps of the rule (``linear`` only): the history (a restart takes it up), and for
        inspection the base, the units, lr and global batch at its step and the sample cursor before it."""
        if self.scale is None:
            return {}
        step = self.step
        record = {"rule": "linear", **self.scale.message(), "units": self.scale.units_at(step),
                  "lr": self.lr_at(step), "global_batch": self.scale.global_batch(step)}
        if not self.config.mode.partitions:  # a gossip rank reads its own partition, not the stream
            epoch, offset, _ = self.batches.cursor(step)
            record["cursor"] = {"epoch": epoch, "offset": offset, "samples": self.batches.samples(step)}
        return record

    # -- reports ------------------------------------------------------------------------------------------------
    def _report_step(self, step: int, stats: torch.Tensor, entered: torch.Tensor, started: float,
                     extra: dict[str, Any] | None = None, evaluation: dict[str, float] | None = None) -> None:
        """Rank 0 of the generation reports the step's global figures: loss and accuracy from ``stats`` (loss sum,
        correct, samples), ``samples`` and ``sample_checksum`` from ``entered`` (the summed ``sample_figures`` of
        the samples whose gradients entered the update; the checksum left out where it cannot be exact)."""
        report: dict[str, Any] = {"step": step, "gen": self.comm.gen, "sent": self.traffic[1], "msgs": self.traffic[0]}
        slow = self.throttle.end()
        if slow is not None:
            report["slow"] = slow  # the factor this rank was slowed by
        if self.comm.rank == 0:
            samples = max(stats[2].item(), 1.0)
            figures = entered.tolist()
            checksum = checksum_of(figures)
            report.update(loss=stats[0].item() / samples, train_acc=stats[1].item() / samples,
                          samples=int(round(figures[0])), step_time=time.perf_counter() - started, t=time.time(),
                          messages=self.traffic[0], bytes_sent=self.traffic[1], **(extra or {}),
                          **self.rule_report(step))
            if checksum is not None:
                report["sample_checksum"] = checksum
            if evaluation:
                report.update(evaluation)
        self.channel.send(protocol.message("step", **report))

    def _report_joined(self, started: float, started_cpu: float, received: int, recovery: str | None,
                       retried: bool) -> None:
        """The state of this generation is settled: ``joined`` (rank 0 of a recovery generation says how)."""
        self.apply_lr()  # the state is settled at self.step: a failed step finished now takes its learning rate
        fields: dict[str, Any] = {"sync_cpu": cpu_time() - started_cpu, "bytes_in": received}
        if self._gpu_wait is not None:  # the first join of a GPU rank: how long the dead ranks' memory held it
            fields["gpu_wait_s"], self._gpu_wait = self._gpu_wait, None
        if recovery and self.comm.rank == 0:
            fields.update(recovery=recovery, resume_step=self.step, retried=retried)
        self.channel.send(protocol.message("joined", gen=self.comm.gen, step=self.step,
                                           sync_s=time.monotonic() - started, **fields))

    def _evaluation_due(self) -> bool:
        return self.step % self.config.eval_interval == 0 or self.step == self.channel.end(self.config.steps)

    def evaluate(self) -> dict[str, float]:
        return evaluate(self.model, self.data)

    # -- checkpoints --------------------------------------------------------------------------------------------
    def checkpoint_state(self) -> tuple[dict[str, torch.Tensor], dict[str, dict[str, torch.Tensor]]]:
        """(model state, optimizer state per parameter name) of the whole model, cloned; collective where the
        model is spread over ranks (every member calls it)."""
        raise NotImplementedError

    def checkpoint_refs(self) -> tuple[dict[str, torch.Tensor], dict, staging.Staged] | None:
        """The whole model's checkpoint state as live tensors for the writer thread to copy (:mod:`.staging`);
        None where this mode clones it on the training thread instead (``checkpoint_state``)."""
        return None

    def _write_checkpoint(self, name: str | None = None,
                          state: tuple[dict[str, torch.Tensor], dict] | None = None) -> None:
        """Snapshot the state, write HDF5 on a background thread, then tell the supervisor. Where the mode hands
        over live tensors (``checkpoint_refs``) the writer copies them while the next step runs, and the first
        in-place change of each part waits for its copy (``_checkpoint_copied``); otherwise (or given ``state``)
        the snapshot is cloned here. ``stall_s`` is every wait of the training loop for it: the previous write if
        still running, taking the references (or the clone), and the waits for the copy. A write that fails, for
        whatever reason, ends the run (:meth:`_checkpoint_failed`; the other ranks are stopped with the run)."""
        started = time.perf_counter()
        if self._writer is not None:
            self._writer.join()  # one write at a time; the previous one is normally long done
        staged = None
        if state is not None:
            model_state, optimizer_state = state
        else:
            refs = self.checkpoint_refs()
            model_state, optimizer_state, staged = refs if refs is not None else (*self.checkpoint_state(), None)
            if staged is not None and staged.nbytes <= staging.INLINE_BYTES:
                staged.copy(self._staging_cache)  # a small state: copied here, cheaper than waiting for a thread
                staged = None
        snapshot = ckpt.Checkpoint(self.step, model_state, optimizer_state, torch.get_rng_state(), self.config.seed,
                                   {}, self.extra_state(), self.provenance, self.rule_record())  # config: by the writer
        path = self.checkpoint_dir / (name or ckpt.checkpoint_name(self.step))
        cache, taken, handed_over = self._staging_cache, [0.0], threading.Event()

        def write() -> None:
            # first let the training thread go on: this thread would otherwise hold the interpreter lock until its
            # first blocking call or the switch interval (5 ms)
            handed_over.wait(60)
            if staged is not None:
                staged.copy(cache)
            snapshot.config = self.config.to_dict()  # fixed for the run
            began = time.perf_counter()
            ckpt.save(path, snapshot)  # what it raises: _checkpoint_failed
            stall = taken[0] + (staged.waited() if staged is not None else 0.0)
            self.channel.send(protocol.message("checkpoint", step=snapshot.step, path=str(path), stall_s=stall,
                                               write_s=time.perf_counter() - began))

        self._writer = self._writer or staging.Writer(on_error=self._checkpoint_failed)
        if staged is not None:
            staged.writer, self._staged = self._writer, staged
        self._writer.submit(write)
        taken[0] = time.perf_counter() - started
        handed_over.set()

    def _checkpoint_failed(self, exc: Exception) -> None:
        """Writer thread: a checkpoint that could not be written ends the run as such, not as a rank fault (an
        ``error`` with its ``reason``, then this process exits): a full disk, a read-only place
        (:class:`~workbench.base.h5files.OutputError`), or anything else (its traceback is in the rank's log)."""
        why = str(exc) if isinstance(exc, OutputError) else f"{type(exc).__name__}: {exc}"
        if not isinstance(exc, OutputError):
            traceback.print_exception(exc)  # where it failed, for the rank's log
        self.channel.send(protocol.message("error", message=why, reason=f"checkpoint not written: {why}"))
        os._exit(1)

    def _checkpoint_copied(self, part: int | None = None) -> None:
        """Before the training state changes in place: wait until the copy of a checkpoint under way has passed
        ``part`` (in the order of ``checkpoint_refs``; None: all of it). Free when no copy is under way."""
        staged = self._staged
        if staged is not None:
            staged.wait(part)
            if staged.done:
                self._staged = None

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
        """Train to the end, say ``done``, and stay until the supervisor stops this rank: a generation announced
        as it finished (a replacement admitted while another member was still in the last step) counts it in, and
        it joins that one too, the most advanced state, with no step left to train."""
        self.channel.send(protocol.message("ready"))
        assignment = self._wait_assignment()
        self._take_gpu(assignment)
        while True:
            try:
                if self.comm.gen != assignment["gen"]:
                    self.adopt_rule(assignment)
                    self.join(assignment)
                while self.step < self.channel.end(self.config.steps):  # fewer once run.finish asked
                    self.comm.check()
                    self._pause_if_due()
                    try:
                        self.train_step()
                    except Detected as detected:
                        self._recover_soft(detected)
                self._final_checkpoint()
            except GenerationChanged:
                assignment = self.channel.latest_generation
                continue
            if self._writer is not None:
                self._writer.join()
            self.channel.send(protocol.message("done", step=self.step, gen=self.comm.gen,
                                               fingerprint=fingerprint(self.model),
                                               group=self.replica_group(), detector_s=self.detector_s,
                                               **self._done_figures()))
            while not self.comm.newer_generation():  # the supervisor's stop (or its closed channel) ends this wait
                self.channel.wake.wait(0.5)
                self.channel.wake.clear()
            assignment = self.channel.latest_generation

    def _done_figures(self) -> dict[str, Any]:
        """Figures a mode measures once its steps are done, sent with ``done`` (none by default)."""
        return {}

    def _pause_if_due(self) -> None:
        """A step boundary the supervisor asked for (a resize, a preemption): write its checkpoint if asked, say
        ``paused`` and wait for the next generation (the supervisor announces one or stops this rank)."""
        pause = self.channel.pause
        if pause is None or pause["gen"] != self.comm.gen or self.step < pause["step"]:
            return
        self.channel.pause = None
        if pause["checkpoint"]:
            self._checkpoint_now()
        if self._writer is not None:
            self._writer.join()  # its ``checkpoint`` message goes out before ``paused``
        self.channel.send(protocol.message("paused", step=self.step, gen=self.comm.gen))
        while not self.comm.newer_generation():  # the supervisor's control connection bounds this wait
            self.channel.wake.wait(0.5)
            self.channel.wake.clear()
        raise GenerationChanged()

    def replica_group(self) -> int:
        """Members with the same group hold replicas of the same parameters (a pipeline stage's replicas)."""
        return 0

    def _recover_soft(self, detected: Detected) -> None:
        raise NotImplementedError

    def _take_gpu(self, assignment: dict[str, Any]) -> None:
        """A GPU rank's first generation: wait (bounded) until the driver has freed the memory of this run's dead
        ranks (``dead_pids``), then take the GPU and move the model there (``_on_device``)."""
        if self.config.device != "cuda":
            return
        self._gpu_wait = devices.wait_for_release(assignment.get("dead_pids") or [])
        self.device = devices.rank_device(self.config.device, getattr(self.channel, "worker_id", None))
        self._on_device()

    def _on_device(self) -> None:
        self.model.to(self.device)

    def _wait_assignment(self) -> dict[str, Any]:
        while self.channel.latest_generation is None:  # a warm spare may wait here for the whole run
            self.channel.wake.wait(0.5)
        return self.channel.latest_generation
