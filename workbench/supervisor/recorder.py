"""Recorder: what a run leaves behind — per-step metrics, events, per-failure recovery figures (``detection_s``,
``settle_s``, ``join_s``, ``resume_s``, ``regrow_s``, ``steps_redone``, ``samples_lost``, ``bytes_moved``,
``world_size_after``: defined in docs/concepts.md and docs/internals.md) — and the
:class:`~workbench.results.run_result.RunResult` built from them. Fed by the supervisor's thread only; widgets read
``metrics``/``events``/``status`` (appends are atomic in CPython).
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from workbench.base import fallbacks, machine
from workbench.config.run import RunConfig
from workbench.faults import events, kinds
from workbench.results import clock
from workbench.results import summary as summaries
from workbench.results.run_result import RunResult, model_size
from workbench.supervisor.membership import Generation, Lost

EventCallback = Callable[[str, dict[str, Any]], None]
PEER_STEPS = 4096  # ulfm: the members' latest step reports kept to tell the failed world's steps from the resumed


@dataclass
class Failure:
    rank: int
    step: int
    cause: str
    fault_time: float  # wall clock of the fault (announced by the rank, or sent by the supervisor)
    detect_time: float | None
    committed: int  # steps committed by the failed generation (reports that arrive late included; at least the
    # failed step's own number: members commit a step together, and the last report may die with the world)
    lost_share: int  # samples of the global batch that were the dead rank's share at that step
    world_size_after: int = 0
    replacement: int | None = None  # spawn id of the process taking the dead rank's place (regrow, reinit)
    recovery_gen: int | None = None
    resume_time: float | None = None  # the first step committed by the recovery generation
    resume_step: int | None = None  # where the recovery generation resumed
    settle_time: float | None = None  # the last member of the recovery generation settled its state
    entered_time: float | None = None  # the last member of the recovery generation entered it (began its join)
    regrow_time: float | None = None  # when that replacement joined: the world is back to its size
    regrow_gen: int | None = None  # the generation it joined
    steps_redone: int = 0
    samples_lost: int = 0
    teardown: float | None = None  # CPU s the dead rank spent from its fault message to its end (clock.teardown_s)
    bytes_moved: int = 0  # state received by members in the recovery generation and by the replacement
    peer_seen: bool = False  # a peer's own detection (torchft quorum, torchrun restart) replaced detect_time
    discarded: set[int] = field(default_factory=set)  # torchft: steps the survivors did not commit

    @property
    def detection(self) -> float:
        """Fault to detection, s (0 while undetected)."""
        return self.detect_time - self.fault_time if self.detect_time is not None else 0.0

    def figures(self, strategy: str) -> dict[str, Any]:
        return {
            "rank": self.rank, "step": self.step, "cause": self.cause, "strategy": strategy,
            "detection_s": round(self.detect_time - self.fault_time, 4) if self.detect_time is not None else None,
            "resume_s": None if self.resume_time is None else round(self.resume_time - self.fault_time, 4),
            "settle_s": None if self.settle_time is None else round(self.settle_time - self.fault_time, 4),
            "join_s": None if self.settle_time is None or self.entered_time is None
            else round(max(self.settle_time - self.entered_time, 0.0), 4),
            "regrow_s": None if self.regrow_time is None else round(self.regrow_time - self.fault_time, 4),
            "steps_redone": self.steps_redone, "samples_lost": self.samples_lost,
            "world_size_after": self.world_size_after, "bytes_moved": self.bytes_moved,
        }

    def resumed_at(self, step: int) -> None:
        """The recovery generation resumed at ``step``: the committed steps past it are redone."""
        self.resume_step = step
        self.steps_redone = max(0, self.committed - step)


class Recorder:
    def __init__(self, config: RunConfig, on_event: EventCallback | None = None) -> None:
        self.config = config
        self.on_event = on_event
        self.t0 = time.time()
        self.metrics: list[dict[str, Any]] = []
        self.events: list[dict[str, Any]] = []
        self.failures: list[Failure] = []
        self.peer_marks: list[tuple[str, float]] = []  # ulfm: when survivors saw a failure, when they had shrunk
        self.peer_steps: deque[tuple[float, int]] = deque(maxlen=PEER_STEPS)  # ulfm: (t, step) of every member's step
        self.train_start: float | None = None
        self.committed = 0  # steps committed by the run (rank 0 of the current generation)
        self.gen = -1
        self.stepped_gen = -1  # the generation of the last step recorded (a late report of an older one is not)
        self.world_size = 0
        self.scale: Any = None  # resize_rule linear: the supervisor's config.resize_rule.Scale (the global batch)
        self.last_checkpoint: dict[str, Any] | None = None
        self.final_checkpoint: str | None = None
        self.status: dict[str, Any] = {"state": "starting", "generation": -1, "world_size": 0, "step": 0}
        stages = config.pipeline_stages if config.mode.staged else None
        self.rank_time = clock.RankTime(bubble=(config.micro_batches + stages - 1) / config.micro_batches
                                        if stages else 1.0, say=self.fallback)
        self._fallbacks: deque[tuple[float, str, str]] = deque()  # said by any thread, recorded by this one
        fallbacks.listen(self)  # until the result: what this process falls back on while the run goes on
        for what, detail in fallbacks.claim():  # taken while this run was prepared (in this thread)
            self.fallback(what, detail)

    def event(self, kind: str | events.EventKind, step: int, detail: str, rank: int = -1, **fields: Any) -> None:
        """An event row of a kind declared in :mod:`workbench.faults.events`; ``fields``: its declared fields
        beside the text (a join's ``gen``, ``bytes_in``, ``gpu_wait_s``); anything else raises ``EventError``."""
        self._flush_fallbacks()
        self._event(time.time(), kind, step, detail, rank, **fields)

    def _event(self, t: float, kind: str | events.EventKind, step: int, detail: str, rank: int = -1,
               **fields: Any) -> None:
        event = events.row(t - self.t0, kind, step, detail, rank, **fields)
        self.events.append(event)
        if self.on_event:
            self.on_event("event", event)

    def count(self, kind: str | events.EventKind) -> int:
        """How many events of the declared ``kind`` the run has recorded."""
        return events.count(self.events, kind)

    def fallback(self, what: str, detail: str) -> None:
        """A fallback taken in this process (:func:`workbench.base.fallbacks.taken`, any thread): a ``fallback``
        event with its ``what``, recorded by the supervisor's thread at its next event, step or the result."""
        self._fallbacks.append((time.time(), what, detail))

    def _flush_fallbacks(self) -> None:
        while self._fallbacks:
            t, what, detail = self._fallbacks.popleft()
            self._event(t, events.FALLBACK, self.committed, detail, what=what)

    # -- membership -------------------------------------------------------------------------------------------
    def lost(self, decision: Lost, step: int, fault_time: float, peer: bool, teardown: float | None = None) -> Failure:
        """A member failed: open its failure record (``peer``: the peer's own detection will be the one;
        ``teardown``: :func:`workbench.results.clock.teardown_s`)."""
        batch, size = self.config.batch_size if self.scale is None else self.scale.global_batch(step), decision.size
        share = batch // size + (1 if decision.position < batch % size else 0)
        failure = Failure(decision.label, step, decision.cause, fault_time, None if peer else time.time(),
                          committed=max(self.committed, step), lost_share=share,
                          world_size_after=decision.world_size_after,
                          replacement=decision.replacement, teardown=None if peer else teardown)
        self.failures.append(failure)
        self.event(events.FAILURE, step, f"rank {decision.label} {decision.cause}", rank=decision.label,
                   cause=decision.cause, world_after=decision.world_size_after)
        self.peer_mark()  # the survivors may have reported their detection before the supervisor saw the death
        return failure

    def peer_mark(self, kind: str | None = None, t: float = 0.0) -> None:
        """A peer that recovers without a generation (ulfm) says when a survivor's MPI call failed (``detect``)
        and when the survivors had shrunk (``settle``); both are matched to the failures the supervisor saw, in
        whichever order the messages came: a failure's detection is the first mark after its fault."""
        if kind is not None:
            self.peer_marks.append((kind, t))
        for failure in self.failures:
            if failure.detect_time is None:
                seen = [t for k, t in self.peer_marks if k == "detect" and t >= failure.fault_time]
                if seen:
                    failure.detect_time, failure.peer_seen = min(seen), True
            if failure.peer_seen and failure.settle_time is None:
                settled = [t for k, t in self.peer_marks if k == "settle" and t >= failure.detect_time]
                failure.settle_time = min(settled) if settled else None
            self._peer_resumed(failure)

    def peer_step(self, m: dict[str, Any]) -> None:
        """A member of a peer that recovers without a generation (ulfm) committed step ``m["step"]`` at ``m["t"]``:
        every member's reports, the reporter's and the others', say what the failed world had committed (a
        survivor may have committed a step whose figures died with the reporter) and where the survivors
        resumed."""
        self.peer_steps.append((m["t"], m["step"]))
        for failure in self.failures:
            self._peer_resumed(failure)

    def _peer_resumed(self, failure: Failure) -> None:
        """Once the survivors have shrunk (``settle``): the steps members reported before that are the failed
        world's, the first reported after it is where they resumed; a step committed before and reported again
        after is redone (a survivor that resumed early)."""
        if failure.resume_step is not None or failure.recovery_gen is not None or failure.settle_time is None:
            return
        after = [(t, step) for t, step in self.peer_steps if t >= failure.settle_time]
        if not after:
            return
        before = [step + 1 for t, step in self.peer_steps if t < failure.settle_time]
        failure.committed = max([failure.committed, *before])
        t, step = min(after)
        failure.resume_time = failure.resume_time or t
        failure.resumed_at(step)

    def generation(self, decision: Generation) -> None:
        self.gen, self.world_size = decision.gen, len(decision.members)
        if decision.resume and self.metrics:  # a restarted world reads its checkpoint: charged at the disk's speed
            self.rank_time.reads_from(decision.gen, decision.resume)
        if decision.recovery:
            for failure in self.failures:
                if failure.recovery_gen is None:
                    failure.recovery_gen = decision.gen
        self.status.update(generation=decision.gen, world_size=len(decision.members),
                           members=list(decision.members))
        size = len(decision.members)
        if self.config.mode.hypercube and size & (size - 1):
            cube = 1 << (size - 1).bit_length()
            self.event(events.GOSSIP, self.committed, f"{size} members gossip on a {cube}-slot hypercube: a member "
                       "whose partner slot is empty skips that round's average (the replicas' mean is kept)",
                       members=size, slots=cube)
        self.event(events.GENERATION, self.committed, f"generation {decision.gen}: ranks {list(decision.members)}"
                   + (f" ({decision.recovery})" if decision.recovery else ""), gen=decision.gen,
                   members=list(decision.members), recovery=decision.recovery)

    def joined(self, spawn_id: int, label: int | None, m: dict[str, Any]) -> None:
        calling = [f for f in self.failures if f.recovery_gen == m["gen"]]
        if self.metrics:  # a generation change while training: its rank-time (the first one precedes training)
            wait, hop = clock.detection(calling)
            self.rank_time.on_joined(spawn_id, m, wait, min((f.fault_time for f in calling), default=None), hop)
        else:
            self.rank_time.last[spawn_id] = m.get("cpu", 0.0)
        for failure in self.failures:
            if failure.replacement == spawn_id and failure.regrow_time is None:
                failure.regrow_time, failure.regrow_gen = time.time(), m["gen"]
                failure.bytes_moved += m.get("bytes_in", 0)
            elif failure.recovery_gen == m["gen"]:
                failure.bytes_moved += m.get("bytes_in", 0)
            if failure.recovery_gen == m["gen"]:
                failure.settle_time = time.time()
                entered = failure.settle_time - float(m.get("sync_s") or 0.0)
                failure.entered_time = max(failure.entered_time or entered, entered)
        if m["gen"] != self.gen:
            return
        if "recovery" in m:
            self._recovery(m)
        moved = f", {m['bytes_in'] / 2**20:.1f} MiB received" if m.get("bytes_in") else ""
        gpu = {}
        if m.get("gpu_wait_s") is not None:  # a GPU rank took its GPU for this generation
            moved += f"; took its GPU after {m['gpu_wait_s']:.3f} s waiting for dead ranks' memory"
            gpu = {"gpu_wait_s": m["gpu_wait_s"]}
        self.event(events.JOINED, m["step"], f"generation {m['gen']}: state synced in {m['sync_s']:.3f} s{moved}",
                   rank=label if label is not None else -1, gen=m["gen"], sync_s=m["sync_s"],
                   bytes_in=m.get("bytes_in", 0), **gpu)

    def _recovery(self, m: dict[str, Any]) -> None:
        """Rank 0 of a recovery generation says where the state resumed and whether it finished the failed step."""
        for failure in self.failures:
            if failure.recovery_gen == m["gen"] or (failure.recovery_gen is not None and failure.recovery_gen < m["gen"]
                                                   and failure.resume_time is None):
                failure.resumed_at(m["resume_step"])
                failure.samples_lost = failure.lost_share if m.get("retried") else 0
        detail = f"resumed at step {m['resume_step']}" + (", failed step finished by the survivors"
                                                           if m.get("retried") else "")
        self.event(events.RECOVERED, m["resume_step"], f"{m['recovery']}: {detail}", recovery=m["recovery"],
                   action=None, retried=bool(m.get("retried")))

    # -- steps ------------------------------------------------------------------------------------------------
    def step(self, m: dict[str, Any]) -> None:
        self._flush_fallbacks()
        if self.train_start is None:
            self.train_start = time.time() - m["step_time"]
        for failure in self.failures:
            if failure.resume_time is None and (failure.recovery_gen is None or m["gen"] < failure.recovery_gen) \
                    and not self.peer_steps:  # ulfm's members' steps say it (peer_step): this may be a retried one
                # a step of the failed generation reported after the death was seen (a gossip survivor finishing
                # the step it shared with the dead rank, a report still in flight): the run had committed it
                failure.committed = max(failure.committed, m["step"] + 1)
                if failure.resume_step is not None:
                    failure.resumed_at(failure.resume_step)
            if failure.resume_time is None and failure.recovery_gen is not None and m["gen"] >= failure.recovery_gen:
                failure.resume_time = m["t"]
            elif failure.resume_time is None and failure.recovery_gen is None and failure.settle_time is not None \
                    and m["t"] >= failure.settle_time:  # ulfm: the first step committed after the shrink
                failure.resume_time = m["t"]
        if m["gen"] < self.stepped_gen:  # a newer generation has stepped: a report this late is not the run's row
            return
        self.stepped_gen, self.committed = m["gen"], m["step"] + 1
        row = {"step": m["step"], "time": m["t"] - self.t0, "loss": m["loss"], "train_acc": m["train_acc"],
               "samples": m["samples"], "world_size": self.world_size, "generation": self.gen,
               "step_time": m["step_time"]}
        for key in ("sample_checksum", "test_acc", "test_loss", "val_acc", "messages", "bytes_sent",
                    "consensus_distance", "parameters", "hidden_units", "lr", "global_batch"):
            row[key] = m.get(key, float("nan"))
        self.rank_time.on_row(m["gen"], row)
        self.metrics.append(row)
        self.status.update(step=m["step"] + 1)
        if self.on_event:
            self.on_event("step", row)

    def checkpoint(self, m: dict[str, Any]) -> bool:
        """Record a complete checkpoint; True for a periodic one (where a restarted world resumes)."""
        if Path(m["path"]).name == "final.h5":
            self.final_checkpoint = m["path"]
            return False
        self.last_checkpoint = m
        self.rank_time.measure_disk(Path(m["path"]).parent)  # once per machine, in the background
        self.event(events.CHECKPOINT, m["step"], f"{m['path']} (stall {m['stall_s'] * 1e3:.1f} ms, "
                   f"write {m['write_s'] * 1e3:.1f} ms)", path=m["path"], stall_s=m["stall_s"], write_s=m["write_s"])
        return True

    def rank_message(self, label: int | None, m: dict[str, Any]) -> None:
        """Events ranks report that only need recording (detected, apoptosis, fallback)."""
        kind = m["type"]
        if kind == "fallback":  # taken in a rank's process (workbench.rank.channel forwards it): this run's
            self.fallback(m["what"], f"rank {label}: {m['detail']}")
        elif kind == "detected":
            self.event(events.DETECTED, m["step"], f"{m['detector']}: {m['detail']}", detector=m["detector"],
                       action=m["action"])
            self.event(events.RECOVERED, m["to_step"], f"soft error: {m['action']} (resumed at step {m['to_step']})",
                       recovery=None, action=m["action"], retried=False)
        elif kind == "apoptosis":
            for layer, removed in m["removed"].items():
                before, after = m["widths"][layer]
                self.event(events.APOPTOSIS, m["step"], f"{layer}: {removed} units removed ({before} -> {after}), "
                           f"tau {m['tau']:.4g}; model now {m['hidden_units']} hidden units, "
                           f"{m['parameters']} parameters", layer=layer, removed=removed, before=before, after=after,
                           tau=m["tau"], hidden_units=m["hidden_units"], parameters=m["parameters"])

    def flip(self, label: int | None, m: dict[str, Any], source: str) -> None:
        """A rank flipped a bit (its ``flip`` report) of a fault from ``source`` (:data:`events.SOURCES`); ``old``
        and ``new`` are the exact values (the text's repr too: replayable)."""
        self.event(events.FLIP, m["step"], f"{m['target']} {m['tensor']}[{m['index']}] bit {m['bit']}: "
                   f"{m['old']!r} -> {m['new']!r}", rank=label, source=source, target=m["target"],
                   tensor=m["tensor"], index=m["index"], bit=m["bit"], old=m["old"], new=m["new"])

    def rank_error(self, label: int | None, step: int, m: dict[str, Any]) -> str:
        """A rank's ``error``: an event, and the reason the run fails. An error with a ``reason`` of its own (a
        checkpoint that could not be written) is that reason: the run failed on its outputs, not on a rank."""
        self.event(events.ERROR, step, m["message"], rank=label if label is not None else -1, reason=m.get("reason"))
        return m.get("reason") or f"rank {label} raised an error at step {step}: {m['message']}"

    # -- the result -------------------------------------------------------------------------------------------
    def result(self, outcome: str, reason: str, world_size_final: int, replicas_identical: bool | None,
               keep_checkpoint: bool, members: dict[str, Any], provenance: dict[str, Any],
               steps_finished: int = 0) -> RunResult:
        """The run's result: its summary built (:func:`workbench.results.summary.build`) from the figures
        recorded here and the supervisor's of its ``members`` (``detector_s``, ``diffusion``, ``stragglers``);
        ``steps_finished``: the step the members' final state is at (a last report may have died with its rank)."""
        metrics = self.metrics
        self.rank_time.finish()
        rank_train_s = self.rank_time.timeline(metrics)
        failures = [f.figures(self.config.strategy) for f in self.failures]
        for failure, record in zip(failures, self.failures):
            failure.update(self.rank_time.failure(failure, record, metrics))
        cores = machine.usable_cores()
        fallbacks.forget(self)
        self._flush_fallbacks()  # the last: what the bookkeeping above fell back on too
        accuracies = [r["test_acc"] for r in metrics if not math.isnan(r["test_acc"])]
        recorded = {
            "outcome": outcome,
            "reason": reason,
            "final_test_accuracy": accuracies[-1] if accuracies else None,
            "steps_completed": max([steps_finished, *(r["step"] + 1 for r in metrics)]),
            "world_size_initial": self.config.world_size,
            "world_size_final": world_size_final,
            "generations": self.gen + 1,
            "strategy": self.config.strategy,
            "parallelism": self.config.parallelism,
            "replicas_identical": replicas_identical if outcome == "completed" else None,
            "wall_s": round(time.time() - self.t0, 3),
            "train_s": round(metrics[-1]["time"] - metrics[0]["time"] + metrics[0]["step_time"], 3)
            if metrics else 0.0,
            "overhead_s": None,
            "rank_train_s": round(rank_train_s, 3),
            "rank_overhead_s": None,
            "cores": cores,
            "oversubscribed": self.config.world_size > cores,
            "disk_mibs": self.rank_time.disk[0] if self.rank_time.disk else None,
            "net_mibs": self.rank_time.net[0] if self.rank_time.net else None,
            "latency_us": self.rank_time.latency[0] if self.rank_time.latency else None,
            "speed_sources": self.rank_time.sources(),
            "fallbacks": list(dict.fromkeys(e["what"] for e in events.of(self.events, events.FALLBACK))),
            "steps_redone_total": sum(f["steps_redone"] for f in failures),
            "samples_lost_total": sum(f["samples_lost"] for f in failures),
            "checkpoints": events.count(self.events, events.CHECKPOINT),
            "flips": events.count(self.events, kinds.FLIP.name),
            "detections": events.count(self.events, events.DETECTED),
            "final_checkpoint": self.final_checkpoint if keep_checkpoint else None,
            "failures": failures,
            "result_path": None,
            **model_size(metrics),
        }
        return RunResult(self.config.to_dict(), metrics, self.events, failures,
                         summaries.build(recorded, members, provenance), provenance=provenance)
