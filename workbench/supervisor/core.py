"""The supervisor: one run from start to result, on the monitor thread of a :class:`~workbench.launch.session.Run`.

It hosts the store the ranks' gloo groups rendezvous through (:mod:`.store`) and the control server every rank
reports to, and wires the rooms together: :mod:`.membership` decides, :mod:`.launcher` starts and stops
processes, :mod:`.control` carries messages, :mod:`.faultplan` holds the faults, :mod:`.recorder` keeps the
figures, :mod:`workbench.supervisor.peers.adapters` speaks for the peers; it takes live commands from any thread,
carries out step boundaries (:mod:`.boundary`) and answers slow ranks (:mod:`.stragglers`). Membership is a numbered
generation with an authoritative ``source``. A dead rank is seen by its closed connection and exit status, a frozen
one by missing heartbeats (then SIGKILLed); a supervisor error still ends in a result, every process gone.
"""

from __future__ import annotations

import queue
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

from workbench import strategies
from workbench.base import checkpoint as ckpt
from workbench.base import protocol
from workbench.base.errors import RunStartError
from workbench.base.h5files import OutputError
from workbench.base.hosts_file import Host, placement
from workbench.base.protocol import CONTROL, CONTROL_KEY, RANK
from workbench.config import devices, resize_rule
from workbench.config.resize_rule import units
from workbench.config.resizing import leaving
from workbench.config.run import RunConfig
from workbench.faults import events, kinds
from workbench.faults.kinds import FaultKind, Fires
from workbench.faults.spec import DEFAULT_GRACE_S, FaultSpec
from workbench.results import clock, outdir, provenance
from workbench.results.run_result import RunResult
from workbench.supervisor.boundary import MARGIN_STEPS, SETTLE_S, Boundary
from workbench.supervisor.control import ControlServer, Pending, open_store
from workbench.supervisor.faultplan import FaultPlan
from workbench.supervisor.launcher import Launcher, Worker, replicas_identical
from workbench.supervisor.membership import (
    Assign,
    Decision,
    End,
    Generation,
    Lost,
    Membership,
    Note,
    Restart,
    Retire,
    Start,
)
from workbench.supervisor.peers.adapters import adapter
from workbench.supervisor.recorder import EventCallback, Recorder
from workbench.supervisor.stragglers import Straggler, Stragglers
from workbench.supervisor.watchdog import Watchdog


class Supervisor:
    """Runs one training run to its end; ``run()`` is called on the monitor thread of a :class:`Run`, ``command()``
    from any thread."""

    def __init__(self, config: RunConfig, out_dir: Path | None, on_event: EventCallback | None = None) -> None:
        self.config = config
        self.out_dir = out_dir
        self.host = config.bind
        hosts = [Host.coerce(h, first=i == 0) for i, h in enumerate(config.hosts or [])]
        self.this_host = hosts[0] if hosts else None
        self.placement = placement(hosts)
        self.strategy = strategies.get(config.strategy)
        self.peer = adapter(self.strategy)  # a peer strategy's adapter (None for ours)
        self.recorder = Recorder(config, on_event)
        # what other threads see (the recorder's own list and dicts, appended and updated in place)
        self.metrics, self.events, self.status = self.recorder.metrics, self.recorder.events, self.recorder.status
        self.membership = Membership(
            self.strategy, config.world_size, regrow=config.regrow, warm_spares=config.warm_spares,
            resume=config.resume, stage_of=config.stage_of if config.mode.lanes else None,
            verify=partial(ckpt.unusable, elsewhere=bool(self.placement)) if config.resume_verify else None)
        self.plan = FaultPlan(config, start=ckpt.step_of(config.resume) if config.resume else 0)
        # where the faults a rank fires itself came from, which its report does not say: (rank, fault kind) -> the
        # sources of those sent to it to fire at its next step, oldest first; rank -> its last throttle's source
        self.sent: dict[tuple[int, str], list[str]] = {}
        self.slow_sources: dict[int, str] = {}
        self.watchdog = Watchdog(config.progress_timeout, config.heartbeat_timeout)
        self.stragglers = Stragglers(config.straggler_factor, config.straggler_window,
                                     enabled=config.straggler_response != "off")
        self.commands: queue.Queue[tuple[str, Any]] = queue.Queue()
        self.boundary: Boundary | None = None  # the step boundary under way (a preemption notice, a resize)
        self.finish_steps: int | None = None  # run.finish: the step count every rank ends at (None: config.steps)
        self.keep_stopped: Callable[[str], None] | None = None  # given the checkpoint a whole job stopped at
        self.lanes: int | None = None  # a resized hybrid run's lanes per stage (None: the configuration's replicas)
        self.scale: resize_rule.Scale | None = None  # resize_rule linear: the resizes so far (every generation says)
        self.control: ControlServer | None = None
        self.launcher: Launcher | None = None
        self.agent: subprocess.Popen | None = None  # torchrun's agent, mpirun
        self.lighthouse_address: str | None = None
        self._outcome: tuple[str, str] | None = None
        self._tmpdir: tempfile.TemporaryDirectory | None = None
        self.log_dir = (out_dir / "logs") if out_dir else None

    # -- views -------------------------------------------------------------------------------------------------------
    def worker(self, label: int) -> Worker | None:
        """The live process that currently holds rank number ``label``."""
        proc = self.membership.holder(label)
        return self.launcher.workers.get(proc.id) if proc is not None and self.launcher is not None else None

    @property
    def member_workers(self) -> list[Worker | None]:
        return [self.worker(label) for label in self.membership.members]

    @property
    def checkpoint_dir(self) -> Path:
        if self.out_dir is not None:
            return self.out_dir / "checkpoints"
        if self._tmpdir is None:
            self._tmpdir = outdir.scratch()
        return Path(self._tmpdir.name)

    # -- the run -----------------------------------------------------------------------------------------------------
    def run(self) -> RunResult:
        """Run to the end; the result carries the run's provenance (:mod:`workbench.results.provenance`)."""
        outcome, reason = "failed", "the run did not start"
        self.provenance = provenance.collect(self.config.seed, devices.describe(self.config), self.config.speed_probe)
        try:
            self._start()
            outcome, reason = self._loop()
        except RunStartError as exc:
            outcome, reason = "failed", str(exc)
        except BaseException as exc:  # noqa: BLE001 - a supervisor bug must still end in a result, ranks gone
            outcome, reason = "failed", f"supervisor error: {type(exc).__name__}: {exc}"
        finally:
            self._cleanup()
        self.status.update(state=outcome)
        for fault in self.plan.unfired(self._steps_finished()) if outcome == "completed" else []:
            self.recorder.event(events.FAULT_SKIPPED, fault.step, f"{fault} did not fire: rank {fault.rank} did not "
                                f"reach step {fault.step} (no member then, or the step was finished without it)",
                                rank=fault.rank, fault=fault.kind, source=events.PLANNED, reason=events.NOT_REACHED)
        self.recorder.event(events.END, -1, f"{outcome}: {reason}", outcome=outcome, reason=reason)
        workers = [w for w in self.member_workers if w is not None and (w.done or outcome != "completed")]
        members = {"detector_s": round(max((w.detector_s for w in workers), default=0.0), 4),
                   "diffusion": next((w.diffusion for w in workers if w.diffusion), None),  # gossip: the same
                   "stragglers": self.recorder.count("straggler")}
        result = self.recorder.result(outcome, reason, world_size_final=len(workers),  # completed: who finished
                                      steps_finished=self._steps_finished() if outcome == "completed" else 0,
                                      replicas_identical=replicas_identical(workers),
                                      keep_checkpoint=self.out_dir is not None, members=members,
                                      provenance=provenance.finish(self.provenance))
        result.rank_steps = self.stragglers.table()
        return result

    def _start(self) -> None:
        self.store, self._store_socket = open_store(self.host, self.config.store_port)
        listen = self._store_socket
        self.control = ControlServer(self.host, listen.family)
        self.store.set(CONTROL_KEY, self.control.address)
        self.store_address = f"{self.host}:{listen.getsockname()[1]}"
        if self.placement:
            hosts = list(dict.fromkeys(self.placement.values()))
            self.recorder.event(events.STORE, -1, f"store at {self.store_address}; ranks on " + ", ".join(
                f"{h.address} ({h.slots})" for h in hosts), address=self.store_address,
                hosts=[h.address for h in hosts])
        if self.log_dir:
            self.log_dir.mkdir(parents=True, exist_ok=True)
        rank_module = self.strategy.peer.rank_module if self.strategy.peer else "workbench.rank"
        self.launcher = Launcher(self.config.spawn, rank_module, self.log_dir, self.placement, self.this_host,
                                 self.config.startup_timeout,
                                 note=lambda detail, shared: self.recorder.event(events.TEMPLATE, -1, detail,
                                                                                 shared=shared))
        if self.peer is not None:
            self.lighthouse_address = self.peer.start_service(self.launcher, self.host, self.config.heartbeat_timeout)
        self.scale = self.recorder.scale = resize_rule.start(self.config)  # None under keep
        self._apply(self.membership.start())
        if self.peer is not None:
            self.agent = self.peer.start_agent(self.launcher, self.config, self.store_address, self.plan.planned(),
                                               self.recorder)

    def _loop(self) -> tuple[str, str]:
        while True:
            self._poll(0.05)
            self._run_commands()
            if self._outcome:
                return self._outcome
            self._watch()
            self._boundaries(time.monotonic())
            if self._outcome:
                return self._outcome
            if self.agent is not None and self.agent.poll() is not None and not self._all_done():
                return self.peer.agent_ended(self.agent.returncode, self.membership.started, self._log_hint)
            for fault in self.plan.due(None if self.recorder.train_start is None
                                       else time.time() - self.recorder.train_start):
                self._inject(fault.kind, fault.rank, source=events.PLANNED, fault=fault)
            if self._all_done():
                world = sum(w.done for w in self.member_workers)
                if self.finish_steps is not None:
                    return "completed", (f"finished at a step boundary as asked: {self._steps_finished()} of "
                                         f"{self.config.steps} steps done with world size {world}")
                return "completed", f"all {self.config.steps} steps done with world size {world}"

    def _watch(self) -> None:
        """Exit statuses, heartbeats and start-up deadlines of every process of the run."""
        now = time.monotonic()
        for w in list(self.launcher.workers.values()):
            if not w.alive or w.done:
                continue
            if w.proc is not None and w.proc.poll() is not None:
                for message in self.control.drain(w):  # its last messages ("done") may still be in the socket
                    self._handle(w, message)
                if not w.done and w.alive and not self._outcome:  # its error ended the run: not a fault
                    self._on_death(w, self.launcher.exit_cause(w))
            elif w.conn is not None and w.ready and now - w.last_heard > self.config.heartbeat_timeout:
                # judged once ready: a start-up loads code and data, which may hold the GIL; its deadline bounds it
                self.launcher.kill(w, self.control.send)
                self._on_death(w, f"froze (no heartbeat for {self.config.heartbeat_timeout:g} s)")
            elif not w.ready and now - w.started > self.config.startup_timeout:
                self.launcher.kill(w, self.control.send)  # never said hello, or never got ready (a stuck rendezvous)
                self._on_death(w, f"was not ready within {self.config.startup_timeout:g} s" + self._join_hint(w))
            if self._outcome:
                return
        m = self.membership
        pausing = self.boundary is not None and self.boundary.paused
        if m.started and not m.restarting and m.members == m.generation_members and not pausing:  # settled
            self._stalled(now)

    def _stalled(self, now: float) -> None:
        """Members alive but holding the run up (no step committed for the progress timeout): killed, and
        recovered from like a death; the stall dates from the last step committed."""
        members = [w for w in self.member_workers if w is not None and w.alive and not w.done]
        if len(members) < len(self.membership.members):
            return
        for id, idle in self.watchdog.check([w.spawn_id for w in members], self.membership.gen, now):
            w = self.launcher.workers[id]
            w.fault = w.fault or {"kind": "stall", "step": w.steps_done, "t": time.time() - idle}
            self.launcher.kill(w, self.control.send)
            self._on_death(w, f"stalled (alive, but no step committed for {self.watchdog.limit:.3g} s)")
            if self._outcome:
                return

    def _steps_finished(self) -> int:
        """The steps the run committed: its reports', or the members' final state where the last report died with
        a reporter cut short in that step (it took the finished state from another member in a join)."""
        return max([self.recorder.committed, *(w.steps_done for w in self.member_workers if w is not None and w.done)])

    def _all_done(self) -> bool:
        """Every member finished in the latest generation announced to it (a member that finished as a newer one
        was announced joins that one too: see ``_announce``)."""
        members = self.member_workers
        return bool(members) and not self.membership.restarting and None not in members and all(w.done for w in members)

    # -- decisions ---------------------------------------------------------------------------------------------------
    def _on_death(self, w: Worker, cause: str) -> None:
        w.alive = False
        if w.conn is not None:
            self.control.drop(w.conn)
        if not self.membership.started and w.proc is not None:
            cause += self._log_hint(f"spawn{w.spawn_id}.log")
        step = (w.fault or {}).get("step", self.launcher.death_step(w))
        self._apply(self.membership.died(w.spawn_id, cause, step=step))

    def _apply(self, decisions: list[Decision]) -> None:
        for d in decisions:
            if isinstance(d, Start):
                self._start_process(d)
            elif isinstance(d, Assign):
                self.launcher.workers[d.id].label = d.label
            elif isinstance(d, Retire):
                for id in d.ids:
                    (w := self.launcher.workers[id]).alive = False
                    if d.kill:
                        for m in [m for m in self.control.drain(w) if m.get("type") in ("step", "checkpoint")]:
                            self._handle(w, m)  # its last reports first: a restart must not lose a step or a write
                        self.control.forget(w.conn)
                        self.launcher.kill(w, self.control.send)
            elif isinstance(d, Restart):  # after Retire: a checkpoint its last reports named is where it resumes
                self._apply(self.membership.restart())
            elif isinstance(d, Lost):
                w = self.launcher.workers[d.id]
                fault, say = w.fault or {}, self.recorder.fallback  # a teardown not measured: said in this run
                self.recorder.lost(d, fault.get("step", w.steps_done), fault.get("t", time.time()),
                                   peer=self.peer is not None, teardown=clock.teardown_s(w.proc, fault, say))
            elif isinstance(d, Generation):
                self._announce(d)
            elif isinstance(d, Note):
                self.recorder.event(d.kind, self.recorder.committed if d.kind == events.RESTART.name else -1, d.detail,
                                    rank=d.rank, **d.fields)
            elif isinstance(d, End):
                self._outcome = (d.outcome, d.reason)

    def _start_process(self, d: Start) -> None:
        if d.slot:
            self.launcher.slot(d.id, d.label, self.peer.name)
            return
        w = self.launcher.start_rank(d.id, d.label, self.control.address)
        if w.remote and w.proc is None:
            self.recorder.event(events.WAITING, -1, f"rank {d.label} is to join from {w.host}: workbench rank --store "
                                f"{self.store_address} --rank-hint {d.label}", rank=d.label, host=w.host)

    def _announce(self, d: Generation) -> None:
        members = list(d.members)
        pause = self.planned_pause(members)  # the boundary under way outlives a failure
        for i, (label, w) in enumerate(zip(d.members, [self.launcher.workers[id] for id in d.holders])):
            # a member that finished stays until the run ends and joins this generation too (rank/base.py run):
            # its steps are done again once it has
            w.gen, w.done = d.gen, False
            self.control.send(w, protocol.message(
                "generation", gen=d.gen, members=members, rank=i, size=len(members), source=d.source,
                resume=d.resume, recovery=d.recovery, pause=pause, **({"lanes": self.lanes} if self.lanes else {}),
                **({"rule": self.scale.message()} if self.scale is not None else {}),
                **({"dead_pids": self._dead_pids()} if self.config.device == "cuda" else {}),
                **self.plan.for_member(label, members)))
        resize = [f for f in self.plan.resizes() if pause and f.step == pause["step"]]
        if resize and self.boundary is None:
            self._resize(resize[0].world, planned=resize[0])
        if self.finish_steps is not None:  # a member new since run.finish: it ends where the others do
            for w in [self.launcher.workers[id] for id in d.holders]:
                self.control.send(w, protocol.message("finish", steps=self.finish_steps))
        if d.gen == 0:
            self.status.update(state="running")
        self.recorder.generation(d)

    def _dead_pids(self) -> list[int]:
        """This machine's dead rank processes: a rank taking its GPU waits until the driver has freed their memory."""
        local = [w for w in self.launcher.workers.values() if w.proc is not None and not w.remote]
        alive = {w.proc.pid for w in local if w.alive}  # a pid the system gave again to a live rank is not dead
        return sorted({w.proc.pid for w in local if not w.alive} - alive)

    # -- messages ----------------------------------------------------------------------------------------------------
    def _poll(self, timeout: float) -> None:
        for what, who, payload in self.control.poll(timeout):
            if what == "hello":
                self._hello(who, payload)
            elif what == "message":
                if who.alive:
                    who.last_heard = time.monotonic()
                    self._handle(who, payload)
            elif what == "closed" and who.alive and not who.done and not self._outcome:  # ended: no fault
                if who.proc is not None:
                    try:
                        who.proc.wait(timeout=1.0)
                    except Exception:  # noqa: BLE001 - subprocess.TimeoutExpired: the cause stays "lost connection"
                        pass
                self._on_death(who, self.launcher.exit_cause(who))

    def _hello(self, pending: Pending, messages: list[dict[str, Any]]) -> None:
        hello = messages[0]
        if hello["id"] is None:  # a rank started elsewhere, joining through the store
            host = pending.conn.getpeername()[0]
            worker, refusal = self.launcher.joining_slot(hello.get("rank_hint"), host)
            if worker is None:
                self.control.refuse(pending, refusal)
                self.recorder.event(events.JOIN_REFUSED, -1, refusal, host=host)
                return
            if self.peer is not None and self.peer.agent:
                worker.pid = hello.get("pid")  # a process of this machine, started by the peer's launcher
                self.peer.slot_joined(self.recorder)
            else:
                worker.host = pending.conn.getpeername()[0]
        else:
            worker = self.launcher.workers.get(hello["id"])
        if worker is None or worker.conn is not None or not worker.alive:
            self.control.drop(pending.conn)
            return
        self.control.attach(worker, pending)
        worker.last_heard = time.monotonic()
        self.control.send(worker, protocol.message(
            "start", config=self.config.to_dict(), lighthouse=self.lighthouse_address, store=self.store_address,
            checkpoint_dir=str(self.checkpoint_dir), provenance=self.provenance))
        for message in messages[1:]:
            self._handle(worker, message)

    def _handle(self, w: Worker, m: dict[str, Any]) -> None:
        kind = CONTROL.received(m, RANK)
        if kind == "hb":
            self.watchdog.heartbeat(w.spawn_id, m, time.monotonic())
            return
        if kind == "step":
            self.watchdog.committed(w.spawn_id, m["gen"], time.monotonic())
            self.recorder.rank_time.on_step(w.spawn_id, m)
            members = self.membership.members
            if self.peer is not None:
                self.peer.step(self.recorder, w.spawn_id, w.label, bool(members) and w.label == min(members), m)
            if m["gen"] == self.membership.gen:
                w.steps_done = max(w.steps_done, m["step"] + 1)
            if "loss" in m and (self.peer is None or not self.peer.one_reporter or w.label == min(members)):
                self.recorder.step(m)  # one of a generation just replaced too: the recorder keeps it if it is late
            self._straggler_step(w, m)  # last: a straggler dropped here changes the generation
        elif kind == "ready":
            w.ready = True
            self.recorder.rank_time.on_ready(w.spawn_id, m)
            if w.remote and w.proc is None and w.pid is None:
                self.recorder.event(events.HOST, -1, f"rank {w.label} joined from {w.host}", rank=w.label, host=w.host)
            if not self._all_done():  # the last step is committed: nothing is left to join
                self._apply(self.membership.ready(w.spawn_id))
        elif kind == "joined":
            w.steps_done = m["step"]
            self.watchdog.joined(w.spawn_id, m["gen"], time.monotonic())
            self.recorder.joined(w.spawn_id, w.label, m)
        elif kind == "checkpoint":
            if self.recorder.checkpoint(m):
                self.membership.checkpoint(m["path"])
        elif kind == "fault":
            self._fault_fired(w, m)
        elif kind == "notice":
            self._notice(w, m["grace"], w.steps_done, events.SIGNAL, said=m["signal"])
        elif kind == "paused":
            self._on_paused(w, m)
        elif kind == "flip":
            planned = self.plan.flipped(w.label, m)
            self.recorder.flip(w.label, m, events.PLANNED if planned else self._sent_source(w.label, kinds.FLIP))
        elif kind in ("detected", "apoptosis", "fallback"):
            self.recorder.rank_message(w.label, m)
        elif self.peer is not None and kind in self.peer.handlers:
            self.peer.handlers[kind](self.recorder, w.spawn_id, w.label, m)
        elif kind == "peer_error":
            self.recorder.event(events.PEER_ERROR, w.steps_done, m["message"], rank=w.label, reason=m.get("reason"))
        elif kind == "done":
            # finished in an older generation than the latest announced to it: it joins that one (no step left)
            w.done = m.get("gen") is None or w.gen is None or m["gen"] >= w.gen
            if m.get("gen") is not None:  # a member's state is at this step (the last one's report may have died
                w.steps_done = max(w.steps_done, m["step"])  # with a reporter that took the state in a join)
            w.fingerprint, w.group, w.detector_s = m.get("fingerprint"), m.get("group", 0), m.get("detector_s", 0.0)
            w.diffusion = m.get("diffusion")
        elif kind == "error":
            self._outcome = ("failed", self.recorder.rank_error(w.label, w.steps_done, m))

    # -- live commands -----------------------------------------------------------------------------------------------
    def command(self, name: str, arg: Any = None) -> None:
        """Queue a command (stop, finish, kill, hang, stall, flip, preempt, resize) from any thread."""
        self.commands.put((name, arg))
        if self.control is not None:
            self.control.wake()

    def _run_commands(self) -> None:
        while True:
            try:
                name, arg = self.commands.get_nowait()
            except queue.Empty:
                return
            if name == "stop":
                self._stop(str(arg or "stopped by the user"))
            elif name == "notice":  # the whole job has notice (a signal to the run's process, a sweep point's)
                self._job_notice(float(arg))
            elif name == "finish":
                self._finish()
            else:  # a fault kind's live command: its object says where it fires (workbench/faults/kinds.py)
                self._live(kinds.get(name), arg)

    def _live(self, kind: FaultKind, arg: Any) -> None:
        if kind.fires is Fires.THROTTLE:  # (rank, factor, seconds): _slow
            self._slow(*arg, source=events.LIVE)
        elif kind.fires is Fires.BOUNDARY:
            self._resize(arg)
        elif kind.fires is Fires.INJECTOR:
            w = self.worker(arg.rank)
            if w is None or arg.rank not in self.membership.members:
                self.recorder.event(events.FAULT_SKIPPED, -1, f"{kind.name} on rank {arg.rank}: not alive",
                                    rank=arg.rank, fault=kind.name, source=events.LIVE, reason=events.NOT_ALIVE)
            else:
                self.sent.setdefault((arg.rank, kind.name), []).append(events.LIVE)
                self.control.send(w, protocol.message("faults_add", faults=[str(arg)]))
        elif isinstance(arg, FaultSpec):  # a notice with its grace
            self._inject(kind.name, arg.rank, source=events.LIVE, fault=arg)
        else:
            self._inject(kind.name, arg, source=events.LIVE)

    def _fault_fired(self, w: Worker, m: dict[str, Any]) -> None:
        """A rank fired a fault at its step and said so (``fault``): one of its plan's, or one the supervisor sent it
        to fire at its next step (live, or planned at a time)."""
        kind, fired = kinds.get(m["kind"]), self.plan.fired(w.label, m)
        if kind.notice:
            grace = next((f.grace for f in fired if f.grace is not None), DEFAULT_GRACE_S)
            self._notice(w, grace, m["step"], events.PLANNED, planned=True)
            return
        if kind.ends_rank:  # its death (if it dies) is this fault's; a delay goes on
            w.fault = m
        source = events.PLANNED if fired or m.get("random") else self._sent_source(w.label, kind)
        self.recorder.event(kind.name, m["step"], f"{source} fault fired", rank=w.label, source=source)

    def _sent_source(self, label: int | None, kind: FaultKind) -> str:
        """Where a fault that rank ``label`` fired at its next step came from: the oldest of that kind sent to it
        (live, or planned at a time); planned when none was (its plan's)."""
        sent = self.sent.get((label, kind.name))
        return sent.pop(0) if sent else events.PLANNED

    def _stop(self, reason: str) -> None:
        self._apply(self.membership.stop(reason))
        self._outcome = self._outcome or ("stopped", reason)

    def _finish(self) -> None:
        """End the run at a step boundary (``run.finish``): ``MARGIN_STEPS`` past the furthest step a member has
        committed; each member stops there (one already past it, at once) and says ``done`` with its
        fingerprint, so the run completes with fewer steps and its replicas are compared. Asked again: the
        first boundary holds."""
        if self.finish_steps is not None:
            return
        furthest = max([self.recorder.committed, *(w.steps_done for w in self.member_workers if w is not None)])
        self.finish_steps = min(self.config.steps, furthest + MARGIN_STEPS)
        self.recorder.event("finish", furthest, f"asked to finish: every rank ends after step "
                            f"{self.finish_steps - 1} ({self.finish_steps} of {self.config.steps} steps)",
                            steps=self.finish_steps)
        for w in self.member_workers:
            self.control.send(w, protocol.message("finish", steps=self.finish_steps))

    def _job_notice(self, grace: float) -> None:
        """Every member has ``grace`` seconds: the run stops at one boundary, which writes a checkpoint (a run that
        is not training yet, or a peer's, which has no notice path, stops at once)."""
        members = list(self.membership.members) if self.membership.started else []
        if not members or self.peer is not None:
            why = "before training started" if not members else f"({self.strategy.name} has no notice path)"
            self._stop(f"the job was preempted {why}")
            return
        for label in members:
            self._inject("preempt", label, source=events.JOB, fault=FaultSpec("preempt", label, time=0.0, grace=grace))

    def _inject(self, name: str, label: int | None, source: str, fault: FaultSpec | None = None) -> None:
        """A fault sent by the supervisor (``source``: live, planned at a time, the job's); its kind's object says
        how."""
        kind = kinds.get(name)
        if kind.fires is Fires.BOUNDARY:
            self._resize(fault.world, planned=fault)
            return
        if kind.fires is Fires.THROTTLE:  # a slow fault at a time: _slow_planned
            self._slow_planned(fault)
            return
        said = f"{source} ({fault})" if source == events.PLANNED else source  # a planned one names itself
        w = self.worker(label)
        if w is None or (w.proc is None and w.conn is None) or label not in self.membership.members:
            self.recorder.event(events.FAULT_SKIPPED, -1, f"{name} of rank {label}: not alive", rank=label, fault=name,
                                source=source, reason=events.NOT_ALIVE)
            return
        if kind.notice:
            grace = fault.grace if fault is not None and fault.grace is not None else DEFAULT_GRACE_S
            self._notice(w, grace, w.steps_done, source, said=said)
            return
        if kind.signal is None:  # the rank fires it itself at its next step and says so (stall, delay, a flip)
            sent = FaultSpec(name, label, step=-1) if fault is None else replace(fault, step=-1, time=None)
            self.sent.setdefault((label, name), []).append(source)
            self.control.send(w, protocol.message("faults_add", faults=[str(sent)]))
            return
        w.fault = {"kind": name, "step": w.steps_done, "t": time.time()}
        self.launcher.signal(w, kind.signal, self.control.send)
        self.recorder.event(name, w.steps_done, f"{said} fault", rank=label, source=source)

    # -- step boundaries: a preemption notice, a resize (.boundary) --------------------------------------------------
    def planned_pause(self, members: list[int]) -> dict[str, Any] | None:
        """The boundary a generation of ``members`` stops at (``pause`` of its message): the one under way, else the
        next planned one (a resize's step, or the step after a member's planned notice, with a checkpoint as
        :meth:`_saves` says) that lies inside the run."""
        b = self.boundary
        if b is not None:
            return {"step": b.step, "checkpoint": self._saves()}
        resizes = [f.step for f in self.plan.resizes()]
        notices = [f.step + 1 for f in self.plan.notices() if f.rank in members]
        steps = [s for s in resizes + notices if self.recorder.committed <= s < self.config.steps]
        if not steps:
            return None
        step = min(steps)
        return {"step": step, "checkpoint": step in notices}

    def _arm(self, step: int | None) -> Boundary | None:
        """The boundary under way, or a new one at ``step`` (None: a live one, ``MARGIN_STEPS`` ahead); None when
        the run ends before that step (said in an event)."""
        if self.boundary is None:
            if step is None:
                step = max((w.steps_done for w in self.member_workers if w is not None), default=0) + MARGIN_STEPS
            if step >= self.config.steps:
                self.recorder.event(events.BOUNDARY_SKIPPED, -1, f"a step boundary at step {step}: the run ends first",
                                    boundary=step)
                return None
            self.boundary = Boundary(step)
        return self.boundary

    def _tell_members(self) -> None:
        """Every member is told the boundary (again: a notice may have added a checkpoint to it)."""
        b = self.boundary
        pause = protocol.message("pause", gen=self.membership.gen, step=b.step, checkpoint=self._saves())
        for w in self.member_workers:
            if w is not None:
                self.control.send(w, pause)

    def _saves(self) -> bool:
        """A preemption's boundary writes a checkpoint: checkpoint_restart restarts from it, and a run whose every
        rank is preempted (the whole job) ends there, to be resumed from it."""
        return self.boundary is not None and bool(self.boundary.notices) and self.peer is None

    def _notice(self, w: Worker, grace: float, step: int, source: str, planned: bool = False,
                said: str | None = None) -> None:
        """``w`` has ``grace`` seconds to leave: at the planned boundary, or at a live one. ``source``: where the
        notice came from (:data:`events.SOURCES`); ``said``: how its event's text names it (default: the source)."""
        said = said or source
        if w.label not in self.membership.members or w.done:  # a spare, a newcomer, a rank that finished
            self.recorder.event(events.FAULT_SKIPPED, step, f"{said} notice to a rank that is no member", rank=-1,
                                fault=kinds.PREEMPT.name, source=source, reason=events.NOT_MEMBER)
            return
        w.fault = {"kind": "preempt", "step": step, "t": time.time()}
        self.recorder.event(events.PREEMPT, step, f"{said} notice: {grace:g} s to leave at a step boundary",
                            rank=w.label, source=source, grace=grace)
        b = self._arm(step + 1 if planned else None)
        if b is None:
            return  # the run ends before the boundary: nothing to leave
        b.notices[w.label] = (time.monotonic() + grace, grace, step, w.spawn_id)
        self._tell_members()

    def _resize(self, world: int, planned: FaultSpec | None = None) -> None:
        members = self.membership.members
        now = self.boundary.world if self.boundary is not None and self.boundary.world is not None else len(members)
        source = events.LIVE if planned is None else events.PLANNED
        if world == now and planned is None:
            self.recorder.event(events.RESIZE, -1, f"the world has {world} ranks already", source=source, world=world,
                                world_before=now)
            return
        at = planned.step if planned is not None else None  # a planned one at a step: its generation says so
        b = self._arm(at)
        if b is None:
            return
        b.world, b.planned = world, planned
        growing = len(self.membership.growing_labels())
        if world > len(members) + growing:
            self._apply(self.membership.grow(world - len(members) - growing))
        if at is None:
            self._tell_members()
        rule = "" if self.scale is None else "; " + self.scale.resized(b.step, units(self.config, world)).describe(
            b.step)
        self.recorder.event(events.RESIZE, b.step, f"{len(members)} -> {world} ranks at step {b.step}{rule}",
                            source=source, world=world, world_before=len(members))

    def _on_paused(self, w: Worker, m: dict[str, Any]) -> None:
        if self.boundary is not None and m["gen"] == self.membership.gen:
            self.boundary.pause(w.spawn_id, m["step"], time.monotonic())

    def _boundaries(self, now: float) -> None:
        """A preempted rank out of grace is killed (a failure); a boundary where all stopped is carried out."""
        b = self.boundary
        if b is None or self.membership.restarting:
            return
        for label, (deadline, grace, step, spawn) in list(b.notices.items()):
            w = self.worker(label)
            if w is None or w.spawn_id != spawn or not w.alive or w.done:
                del b.notices[label]  # it died, or finished, meanwhile: nothing to leave
                continue
            if now > deadline and not b.paused_in_time(w.spawn_id, deadline, now):
                del b.notices[label]
                b.void_pauses()
                if not b.notices and b.world is None:
                    self.boundary = None
                self.launcher.kill(w, self.control.send)
                self.recorder.event(events.PREEMPT_FALLBACK, step, f"the grace of {grace:g} s ran out before the "
                                    f"step boundary (step {b.step}): recovered as a failure", rank=label, grace=grace,
                                    boundary=b.step)
                self._on_death(w, f"was preempted: its {grace:g} s of notice ran out before the step boundary")
                return
        if self._carry_out(b, now):
            self._after_boundary()

    def _carry_out(self, b: Boundary, now: float) -> bool:
        """The membership change once every member stopped (or the others had ``SETTLE_S``, the boundary's
        checkpoint written) and a resize's newcomers are ready."""
        members = [w for w in self.member_workers if w is not None]
        stopped = all(w.spawn_id in b.paused for w in members)
        written = not self._saves() or Path(self.membership.resume or "").name == ckpt.checkpoint_name(b.step)
        late = b.first_paused is not None and now - b.first_paused > SETTLE_S and written
        if not (stopped or late) or not self.membership.growth_ready():
            return False
        self.boundary = None
        unstaged = self._unstaged(b)
        if unstaged is not None:  # a stage's only copy: it cannot leave cleanly, it fails as it is taken
            w = self.worker(unstaged)
            self.launcher.kill(w, self.control.send)
            self._on_death(w, "was preempted, the only copy of its pipeline stage: recovered as a failure")
            return False
        causes = {label: f"was preempted (notice at step {step}, {grace:g} s of grace): left at step {b.step}"
                  for label, (_, grace, step, _) in b.notices.items()}
        if b.world is not None:
            staying = [m for m in self.membership.members if m not in causes] + self.membership.growing_labels()
            causes.update({label: "" for label in leaving(self.config, staying, b.world)})
        if b.planned is not None and b.planned in self.plan.step_faults:
            self.plan.step_faults.remove(b.planned)
        for label in causes:
            if (w := self.worker(label)) is not None:
                self.control.send(w, protocol.message("stop", reason=f"left the run at step {b.step}"))
        if b.world is not None and self.config.mode.lanes:
            self.lanes = b.world // self.config.pipeline_stages  # every generation message says so from here on
        if b.world is not None and self.scale is not None:  # from the step the members stopped before (a live
            at = max([b.step, *b.paused.values()])  # boundary may lie behind them when its message reached them)
            self.scale = self.recorder.scale = self.scale.resized(at, units(self.config, b.world))
        self._apply(self.membership.at_boundary(causes, b.step, world=b.world))
        return True

    def _unstaged(self, b: Boundary) -> int | None:
        """A preempted rank that holds the only copy of its pipeline stage, where the strategy does not restart the
        world from the boundary's checkpoint (reinit: its replacement would find no copy to take)."""
        if not self.config.mode.staged or self.strategy.recovering(
                self.membership.failures).reaction is strategies.Reaction.RESTART:
            return None
        stay = [m for m in self.membership.members if m not in b.notices]
        for label in b.notices:
            if not any(self.config.stage_of(m) == self.config.stage_of(label) for m in stay):
                return label
        return None

    def _after_boundary(self) -> None:
        """The whole job stopped at its checkpoint: kept where the caller asked (a sweep point's next attempt),
        or said to go with a temporary directory."""
        if not self._outcome or self._outcome[0] != "stopped" or not self.membership.resume:
            return
        if self.keep_stopped is not None:
            try:
                self.keep_stopped(self.membership.resume)
            except OutputError as exc:  # the run stopped, but what it kept for the next attempt is not there
                self._outcome = ("failed", f"{exc} (the whole job stopped at its checkpoint; its next attempt "
                                 "cannot resume from it)")
        elif self.out_dir is None:
            self._outcome = ("stopped", self._outcome[1].split("; resume from")[0] + " (its checkpoint was in a "
                             "temporary directory: give the run an out directory to keep one)")

    # -- slow ranks and stragglers (.stragglers) ---------------------------------------------------------------------
    def _slow(self, label: int, factor: float, seconds: float | None, source: str) -> None:
        """Slow rank ``label`` down ``factor`` times from its next step (1: full speed again) for ``seconds`` (None:
        until changed); its step reports say so (``slow`` / ``slow_end`` events, from ``source``)."""
        w = self.worker(label)
        if w is None or (w.proc is None and w.conn is None) or label not in self.membership.members:
            self.recorder.event(events.FAULT_SKIPPED, -1, f"slow of rank {label}: not alive", rank=label,
                                fault=kinds.SLOW.name, source=source, reason=events.NOT_ALIVE)
            return
        self.slow_sources[label] = source
        self.control.send(w, protocol.message("throttle", factor=factor, seconds=seconds))

    def _slow_planned(self, fault: FaultSpec) -> None:
        """A slow fault at a time (``time=T``): until its ``until``, in seconds too (None: to the end)."""
        self._slow(fault.rank, fault.factor, None if fault.until is None else fault.until - fault.time,
                   source=events.PLANNED)

    def _straggler_step(self, w: Worker, m: dict[str, Any]) -> None:
        """A member's step report: its step time to the detector (its CPU for the step, as the rank-time clock
        counts it), slow / slow_end / straggler events, the run's response."""
        if w.label is None:  # a peer's slot not yet named
            return
        spent = self.recorder.rank_time.spent.get((m["gen"], m["step"]), {}).get(w.spawn_id)
        slowed, flagged = self.stragglers.step(w.spawn_id, w.label, m["gen"], m["step"], spent, m.get("slow"),
                                               group=self.config.stage_of(w.label))  # a stage's replicas compared
        for kind, detail, fields in slowed:
            source = self.slow_sources.pop(w.label, events.PLANNED)  # the throttle sent to it; else its plan's
            self.recorder.event(kind, m["step"], detail, rank=w.label, **fields,
                                **({"source": source} if events.get(kind).fault else {}))
        if spent is not None and self.recorder.on_event:  # the lab's per-rank strip
            self.recorder.on_event("rank_step", {"step": m["step"], "generation": m["gen"], "rank": w.label,
                                                 "cpu_s": spent, "slow": m.get("slow") or 1.0})
        drop = self.config.straggler_response == "drop"
        for straggler in flagged:
            dropped = drop and self._drop(straggler)
            self.recorder.event(events.STRAGGLER, straggler.step, straggler.detail(self.stragglers.window)
                                + ("; dropped" if dropped else ""), rank=straggler.label, own_s=straggler.own,
                                others_s=straggler.others, dropped=dropped)
            if dropped:
                self._on_death(self.launcher.workers[straggler.key],
                               f"was dropped as a straggler ({straggler.ratio:.2f}x the others' step time)")
                return  # one at a time: the others' figures change with the world

    def _drop(self, straggler: Straggler) -> bool:
        """Kill a straggler of a settled generation that has others to go on with (its slow-downs do not follow
        its rank number to a replacement); False where it may not be dropped now."""
        m, w = self.membership, self.launcher.workers.get(straggler.key)
        if w is None or not w.alive or w.done or m.restarting or m.members != m.generation_members \
                or len(m.members) < 2 or self.boundary is not None:  # not while a resize pauses
            return False
        self.plan.forget_slow(w.label)
        self.stragglers.forget(straggler.key)
        w.fault = {"kind": "straggler", "step": straggler.step, "t": time.time()}
        self.launcher.kill(w, self.control.send)
        return True

    # -- plumbing ----------------------------------------------------------------------------------------------------
    def _log_hint(self, name: str) -> str:
        return f" (see {self.log_dir}/{name})" if self.log_dir else ""

    def _join_hint(self, w: Worker) -> str:
        if w.remote and w.proc is None and not (self.peer is not None and self.peer.agent):
            return f"; it is to join from {w.host}: workbench rank --store {self.store_address} --rank-hint {w.label}"
        return ""

    def _cleanup(self) -> None:
        if self.launcher is not None:
            for w in self.launcher.workers.values():
                if w.conn is not None and w.alive:
                    self.control.send(w, protocol.message("stop", reason="run ended"))
            self.launcher.close(self.control.send if self.control else None)
            for w in self.launcher.workers.values():
                if w.conn is not None:
                    w.conn.close()
        if self.control is not None:
            self.control.close()
        if getattr(self, "store", None) is not None:
            self.store.close()
        if getattr(self, "_store_socket", None) is not None:
            self._store_socket.close()
        self.store = None
        if self._tmpdir is not None:
            self._tmpdir.cleanup()
