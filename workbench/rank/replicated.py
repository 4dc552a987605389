"""Data-parallel training (:class:`Trainer`): every rank a full replica, bucketed allreduce of the gradients
(:mod:`.gradient_exchange`), the recovery strategies' settling of the step in flight (:mod:`.recovery`), soft-error
detection and recovery, and the apoptosis rule on replicated parameters.
"""

from __future__ import annotations

import copy
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

from workbench import strategies
from workbench.base import checkpoint as ckpt
from workbench.base import protocol
from workbench.config.run import RunConfig
from workbench.rank import staging, transfer
from workbench.rank.base import BaseTrainer
from workbench.rank.channel import Channel, cpu_time
from workbench.rank.gradient_exchange import GradientExchange, clone_state
from workbench.rank.soft_errors import ALARM_SLOTS, Detected, Detectors
from workbench.workloads.apoptosis import rule as apo
from workbench.workloads.data import shard

NO_ALARMS = [0.0] * ALARM_SLOTS


class Trainer(BaseTrainer):
    """Data parallel: every rank a full replica, bucketed allreduce of the gradients (:mod:`.gradient_exchange`)."""

    def __init__(self, config: RunConfig, channel: Channel, store: dist.Store, checkpoint_dir: Path) -> None:
        super().__init__(config, channel, store, checkpoint_dir)
        self.rule = config.apoptosis_rule
        self.pairs = apo.require_pairs(self.model) if self.rule is not None else apo.find_pairs(self.model)
        self.apoptosis = self._fresh_rule()
        self._build_dp()
        self.detectors = Detectors(config, self.model)
        self._detections: set[tuple[int, str]] = set()  # (step, detector) of every alarm seen
        self.verified: dict[str, Any] | None = None  # last verified in-memory snapshot (soft-error recovery)
        # with the guard on, a snapshot waits for the next step's alarms (they carry its weight check) to be verified
        self.tentative: dict[str, Any] | None = None

    def _build_dp(self) -> None:
        """Gradient buckets, hooks and optimizers for the model's current parameters (again after every change of
        shapes: the parameters are new objects then)."""
        config, strategy = self.config, self.strategy
        if getattr(self, "dp", None) is not None:
            self.dp.close()  # the old exchange's hooks would still fire on parameters that were kept
        self.dp = GradientExchange(self.model, self.comm, config.optimizer, config.lr, config.momentum,
                               config.bucket_cap_mb, update_per_bucket=strategy.update_per_bucket,
                               keep_local=strategy.keep_local, snapshot_buckets=strategy.snapshot_buckets,
                               buckets=config.buckets)
        self.dp.before_last_launch = self._fault_point
        self.dp.on_launch = self._on_launch
        self.dp.on_reduced = self._on_reduced
        self.dp.before_update = lambda bucket: self._checkpoint_copied(bucket.index)
        self.size = {"parameters": apo.parameter_count(self.model),
                     "hidden_units": apo.hidden_units(self.model, self.pairs)}

    # -- apoptosis ------------------------------------------------------------------------------------------------
    def _fresh_rule(self) -> apo.Apoptosis | None:
        if self.rule is None:
            return None
        return apo.Apoptosis(self.rule, {p.layer: p.units(self.model) for p in self.pairs})

    def _on_device(self) -> None:
        """The model moves to the rank's GPU (it was built on the CPU): the exchange is rebuilt there and the
        flips and detectors re-read its buffers (moving a module replaces them)."""
        self.model.to(self.device)
        self._build_dp()
        self.injector.refresh()
        self.detectors.refresh()

    def _adopt_shapes(self, shapes: dict[str, torch.Size]) -> None:
        """Make the model match the shapes (by state-dict name) of a state about to be loaded (a full-size fresh
        or replacement rank receiving a shrunk state, a rollback to before a removal) and rebuild the exchange if
        anything changed."""
        if apo.resize_to(self.model, shapes):
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

    def _fold_split(self, step: int) -> None:
        """With ``fold=1`` the validation split rejoins the training data once the rule's decisions are over. A
        function of the step, so a rank that joins late, resumes a checkpoint or rolls back follows, and every
        replica draws the same batches."""
        folded = self.rule.folded(step, self.config.steps, self.config.eval_interval)
        if self.data.fold_validation(folded):
            self.batches = self.batch_sequence()

    def _apoptosis_step(self, evaluation: dict[str, float] | None) -> None:
        """At an evaluation: rank 0 (which holds the validation accuracy) observes the replicated parameters' unit
        norms and decides; the rule's state and the removal flags are broadcast, so every rank removes the same
        units at the same step, then rebuilds its buckets and optimizers for the new shapes. A generation change
        during the broadcast is harmless: the new generation adopts its source's model, shapes and rule state."""
        if self.comm.rank == 0:
            removals = self.apoptosis.observe(apo.unit_norms(self.model, self.pairs), evaluation["val_acc"])
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
            self.channel.send(protocol.message(
                "apoptosis", step=self.step - 1, tau=self.apoptosis.tau,
                removed={layer: len(gone) for layer, gone in removals.items()},
                widths={layer: [widths[layer], widths[layer] - len(gone)] for layer, gone in removals.items()},
                **self.size))

    # -- generations --------------------------------------------------------------------------------------------
    def join(self, a: dict[str, Any]) -> None:
        """Settle generation ``a``: undo or keep the step in flight (:mod:`.recovery`), agree on a source and on
        who differs from it, move the state to those only (:mod:`.transfer`), finish the failed step if the
        strategy says so."""
        started, started_cpu = time.monotonic(), cpu_time()
        self._checkpoint_copied()  # a recovery may rewrite the state in place: a checkpoint's copy first
        recovery = a.get("recovery")
        recovering = strategies.recovered_by(recovery)  # the strategy that recovers this failure
        self.injector.set(self._set_faults(a))
        self.comm.join(a)
        self.dp.settle()  # a step cut short after bucket 0 was applied mid-backward: take its running statistics
        if recovering and recovering.snapshot_buckets and self.inflight is not None:
            self.dp.restore_applied()
        if recovering and recovering.memory_snapshot and self.memory_snapshot is not None:
            self._restore(self.memory_snapshot)  # every survivor returns to its own snapshot: the same one
            self.inflight = None
        if a.get("resume") and self.comm.rank == a["source"]:
            self._load_checkpoint(a["resume"])
        in_step = self.inflight is not None and self.inflight.step == self.step
        applied = self.dp.applied if in_step else -1
        score = self.step * (len(self.dp.buckets) + 1) + max(applied, 0) if self.trained else -1
        named = self._named_state()
        agreement = transfer.agree(self.comm, score, self.step, transfer.digest(named), applied, a["source"])
        source = self.comm.rank == agreement.source
        header, received = transfer.move(self.comm, agreement, named if source else None,
                                         self._state_meta() if source else None, self._place)
        if header is not None and not source:
            self._adopt_received(header["meta"])
        retry = bool(recovering and recovering.retries_failed_step) and agreement.applied >= 0
        self._report_joined(started, started_cpu, received, recovery, retry)  # settled: training resumes here
        if retry:
            # the failed step: finish its exchange among the members with the gradients they kept
            mine = self.inflight is not None and self.inflight.step == self.step
            stats = self.dp.retry(agreement.applied, have_local=mine)
            self._commit(self.step, stats, started=time.perf_counter())
        self.inflight = None
        self.trained = True
        self._first_snapshot()
        if self.detectors.active:
            self.detectors.forget_due_checks()
            self.verified, self.tentative = self._snapshot(), None  # replicas are identical right after a sync

    def _load_checkpoint(self, path: str) -> None:
        restored = ckpt.load(path, check=self.config.resume_verify)
        self._adopt_shapes({k: v.shape for k, v in restored.model.items()})  # a shrunk model's shapes first
        self.model.load_state_dict(restored.model)
        self.dp.load_named_optimizer_state(restored.optimizer)
        self._load_rule(restored.apoptosis)
        self.step = restored.step
        self.inflight = None

    # -- the training state as named tensors (what a generation change compares and moves) -----------------------
    def _named_state(self) -> list[tuple[str, torch.Tensor]]:
        named = [(f"model/{k}", v) for k, v in self.model.state_dict().items()]
        for name, state in self.dp.optimizer_slots():
            named += [(f"optim/{name}/{key}", v) for key, v in sorted(state.items()) if torch.is_tensor(v)]
        named += [(f"apoptosis/{k}", v) for k, v in sorted(self.extra_state().items())]
        return named

    def _state_meta(self) -> dict[str, Any]:
        scalars = {name: {key: v for key, v in state.items() if not torch.is_tensor(v)}
                   for name, state in self.dp.optimizer_slots()}
        return {"step": self.step, "optim_scalars": {k: v for k, v in scalars.items() if v}}

    def _place(self, header: dict[str, Any]) -> dict[str, torch.Tensor]:
        """Where a receiver takes each tensor of the source's state: its own tensor where shape and dtype fit
        (received in place), a new one where not (installed by ``_adopt_received``)."""
        specs = {name: (torch.Size(shape), transfer.dtype_of(dtype)) for name, shape, dtype in header["tensors"]}
        self._adopt_shapes({name[len("model/"):]: shape for name, (shape, _) in specs.items()
                            if name.startswith("model/")})  # e.g. a full-size replacement receiving a shrunk model
        own = dict(self._named_state())
        self._incoming = {name: own[name] if name in own and own[name].shape == shape and own[name].dtype == dtype
                          else torch.empty(shape, dtype=dtype, device=self.device)
                          for name, (shape, dtype) in specs.items()}
        return self._incoming

    def _adopt_received(self, meta: dict[str, Any]) -> None:
        incoming, self._incoming = self._incoming, {}
        self.step = int(meta["step"])
        model_state = self.model.state_dict()
        with torch.no_grad():
            for name, tensor in incoming.items():
                if name.startswith("model/") and model_state[name[6:]].data_ptr() != tensor.data_ptr():
                    model_state[name[6:]].copy_(tensor)
        slots = dict(self.dp.optimizer_slots())
        for name, state in slots.items():
            keys = {key for key in state if torch.is_tensor(state[key])}
            prefix = f"optim/{name}/"
            state.update({n[len(prefix):]: t for n, t in incoming.items() if n.startswith(prefix)})
            for key in keys - {n[len(prefix):] for n in incoming if n.startswith(prefix)}:
                del state[key]  # the source has no such history (e.g. it never stepped)
            state.update(meta["optim_scalars"].get(name, {}))
        rule = {n[len("apoptosis/"):]: t for n, t in incoming.items() if n.startswith("apoptosis/")}
        self._load_rule(rule or None)

    # -- in-memory snapshots (reinit, soft-error recovery) -------------------------------------------------------
    def _take_memory_snapshot(self) -> dict[str, Any]:
        return self._snapshot()

    def _snapshot(self) -> dict[str, Any]:
        """In-memory copy of the training state (tensors cloned, nothing serialised)."""
        return {"step": self.step, "model": {k: v.detach().clone() for k, v in self.model.state_dict().items()},
                "optim": [clone_state(b.optimizer) for b in self.dp.buckets], "apoptosis": self.extra_state()}

    def _restore(self, snapshot: dict[str, Any]) -> None:
        self._checkpoint_copied()  # the state is about to be overwritten in place
        self.step = snapshot["step"]
        self._adopt_shapes({k: v.shape for k, v in snapshot["model"].items()})  # it may predate a removal
        self.model.load_state_dict(snapshot["model"])
        # the optimizer adopts the tensors it is given: hand it copies, the snapshot may serve again
        self.dp.load_optimizer_states(copy.deepcopy(snapshot["optim"]))
        self._load_rule(snapshot.get("apoptosis"))

    def _before_fault(self) -> None:
        self.dp.wait_launched()

    # -- soft errors --------------------------------------------------------------------------------------------
    def _on_launch(self, bucket: Any) -> None:
        self.injector.into_bucket("grad", self.inflight.step, bucket.names, bucket.views)

    def _on_reduced(self, bucket: Any) -> None:
        step = self.inflight.step
        if self.detectors.active:
            self.detectors.note_reduced(self.dp.gradients(bucket), bucket.names)
        self.injector.into_bucket("grad_local", step, bucket.names, bucket.views)

    def _recover_soft(self, detected: Detected) -> None:
        """Every rank saw the same alarm: return to the last verified snapshot."""
        self.dp.drain()
        at = self.inflight.step if self.inflight is not None else self.step
        self.inflight = None
        self.tentative = None  # taken after the corruption, or not verified yet: never returned to
        self.detectors.forget_due_checks()
        self._restore(self.verified)
        action = "rollback"
        if (at, detected.detector) in self._detections:
            self.detectors.suppressed.add(at)
            action = "rollback; the alarm repeats on replay (deterministic, not transient): the step is let through"
        self._detections.add((at, detected.detector))
        if self.comm.rank == 0:
            self.channel.send(protocol.message("detected", step=at, detector=detected.detector,
                                               detail=detected.detail, action=action, to_step=self.step))

    def _verify_replicas(self) -> None:
        """Every ``detect_every`` steps: a snapshot of this state, verified (it becomes the one to return to) when
        the next step's alarm slots, which carry the guard's weight check and the replicas' fingerprints, come
        back clean (no extra collective)."""
        if "fingerprint" in self.detectors.on and self.comm.size > 1:
            if self.step >= self.channel.end(self.config.steps):
                self._resolve_divergence()  # no next step to carry it: compare now
            else:
                self.detectors.check_fingerprint_next()
        if "guard" in self.detectors.on:
            self.detectors.check_weights_next()
        if self.detectors.weights_due or self.detectors.fingerprint_due:
            self.tentative = self._snapshot()
        else:
            self.verified = self._snapshot()

    def _resolve_divergence(self) -> None:
        """Allgather the replicas' full fingerprints (their digests disagreed, or the run's last check is due) to
        find the odd replicas; a strict majority re-broadcasts its state to the others, without one everyone rolls
        back. Nothing happens when they all agree."""
        mine = torch.tensor([self.detectors.fingerprint()], dtype=torch.int64)
        everyone = [torch.zeros(1, dtype=torch.int64) for _ in range(self.comm.size)]
        self.comm.wait(self.comm.group.allgather([everyone], [mine]))
        values = [int(t.item()) for t in everyone]
        if len(set(values)) == 1:
            return  # they agree again (a replica that had not fingerprinted, e.g. across a rollback)
        majority, count = max(((v, values.count(v)) for v in set(values)), key=lambda vc: vc[1])
        odd = [r for r, v in enumerate(values) if v != majority]
        if count * 2 > len(values):
            source = values.index(majority)
            agreement = transfer.Agreement([[0, 0, v, 0] for v in values], source)
            named = self._named_state()
            header, _ = transfer.move(self.comm, agreement, named if self.comm.rank == source else None,
                                      self._state_meta() if self.comm.rank == source else None, self._place)
            if header is not None and self.comm.rank != source:
                self._adopt_received(header["meta"])
            action = f"re-broadcast from rank {source} of the agreeing majority"
        else:
            self._restore(self.verified)
            action = "rollback"
        if self.comm.rank == 0:
            self.channel.send(protocol.message("detected", step=self.step - 1, detector="fingerprint",
                                               detail=f"replicas at generation ranks {odd} differ", action=action,
                                               to_step=self.step))

    # -- training -----------------------------------------------------------------------------------------------
    def train_step(self) -> None:
        step, started = self._begin_step()
        if self.dp.snapshot_buckets:
            self.dp.save_running()
        if self.rule is not None:
            self._fold_split(step)
        ids = shard(self.batches(step), self.comm.rank, self.comm.size)
        x, y = self.data.train_batch(torch.from_numpy(ids), step)
        x, y = x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)  # CPU: no copy
        self.model.train()
        out = self.model(x)
        loss_sum = F.cross_entropy(out, y, reduction="sum")
        correct = (out.detach().argmax(1) == y).sum()
        loss_value = loss_sum.item()
        alarms = NO_ALARMS
        if self.detectors.active:
            began = time.thread_time()
            alarms = self.detectors.local_alarms(loss_value / len(y))
            self.detector_s += time.thread_time() - began
        self.dp.begin(torch.tensor([loss_value, correct.item(), float(len(y)), *alarms]), ids)
        (loss_sum / self.global_batch(step)).backward()
        stats = self.dp.finish()
        self.inflight = None
        self._commit(step, stats, started)

    def _commit(self, step: int, stats: torch.Tensor, started: float) -> None:
        if self.detectors.active:
            began = time.thread_time()
            try:  # before the step counts: an alarm rolls back to the verified snapshot
                self.detectors.settle(step, stats[-ALARM_SLOTS:], self.comm.size)
                if self.tentative is not None and not self.detectors.diverged:
                    self.verified, self.tentative = self.tentative, None
            finally:
                self.detector_s += time.thread_time() - began
        self.step = step + 1
        if self.rule is not None:
            # the pressure of our apoptosis reading, on replicated parameters: every replica applies the same
            pressure = self.rule.pressure_due(step, self.config.steps)
            if pressure > 0:
                apo.group_lasso_(self.model, self.pairs, pressure, self.lr_at(step), self.rule.gamma,
                                 bool(self.rule.relative))
        self.traffic = self.dp.traffic()
        evaluation = self.evaluate() if self.comm.rank == 0 and self._evaluation_due() else None
        self._report_step(step, stats, self.dp.sample_figures(), started, extra=dict(self.size),
                          evaluation=evaluation)
        if (self.rule is not None and self._evaluation_due()
                and self.rule.deciding(self.step, self.config.steps, self.config.eval_interval)):
            self._apoptosis_step(evaluation)  # never at the last evaluation: the final accuracy is the model's
        if self.detectors.diverged or (self.detectors.active and self.step % self.detectors.every == 0):
            began = time.thread_time()
            if self.detectors.diverged:
                self.detectors.diverged, self.tentative = False, None
                self._resolve_divergence()
            else:
                self._verify_replicas()
            self.detector_s += time.thread_time() - began
        self._periodic_snapshot()

    def checkpoint_state(self) -> tuple[dict[str, torch.Tensor], dict[str, dict[str, torch.Tensor]]]:
        return {k: v.detach().clone() for k, v in self.model.state_dict().items()}, self.dp.named_optimizer_state()

    def checkpoint_refs(self) -> tuple[dict[str, torch.Tensor], dict, staging.Staged]:
        # one part per bucket, in the order the buckets' updates are applied (each waits for its own part)
        return staging.stage_replica(self.model, [(b.names, b.params, b.optimizer) for b in self.dp.buckets])

    def optimizer_state_of(self, name: str) -> dict[str, torch.Tensor]:
        return self.dp.optimizer_state_of(name)

    def optimizers(self) -> list[Any]:
        return [bucket.optimizer for bucket in self.dp.buckets]
