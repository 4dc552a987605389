"""The supervisor: one run from start to result, on the monitor thread of a :class:`~workbench.launch.session.Run`.

It hosts the store the ranks' gloo groups rendezvous through (:mod:`.store`) and the control server every rank
reports to, and wires the rooms together: :mod:`.membership` decides, :mod:`.launcher` starts and stops
processes, :mod:`.control` carries messages, :mod:`.faultplan` holds the faults, :mod:`.recorder` keeps the
figures, :mod:`workbench.strategies.peers.adapters` speaks for the peers. Membership is a numbered generation with an
authoritative ``source``. A dead rank is seen by its closed connection and exit status, a frozen one by missing
heartbeats (then SIGKILLed); a supervisor error still ends in a result, every process gone (docs/internals.md).
"""

from __future__ import annotations

import queue
import tempfile
import time
from functools import partial
from pathlib import Path
from typing import Any

from workbench import strategies
from workbench.config import errors, resize_rule, run
from workbench.launch import devices, outdir
from workbench.launch.cluster import hosts_file
from workbench.rank import protocol
from workbench.rank.protocol import CONTROL, CONTROL_KEY, RANK
from workbench.results import checkpoint, clock, provenance, run_result
from workbench.strategies.peers.adapters import adapter
from workbench.supervisor.boundary import Commands
from workbench.supervisor.control import ControlServer, Pending, open_store
from workbench.supervisor.faultplan import FaultPlan
from workbench.supervisor.launcher import Launcher, Worker, replicas_identical
from workbench.supervisor.membership import Assign, Decision, End, Generation, Lost, Membership, Note, Retire, Start
from workbench.supervisor.recorder import EventCallback, Recorder
from workbench.supervisor.slow_ranks import SlowRanks
from workbench.supervisor.stragglers import Stragglers
from workbench.supervisor.watchdog import Watchdog


class Supervisor(Commands, SlowRanks):
    """Runs one training run to its end; ``run()`` is called on the monitor thread of a :class:`Run`; live
    commands and step boundaries: :class:`~workbench.supervisor.boundary.Commands`; slow ranks:
    :class:`~workbench.supervisor.slow_ranks.SlowRanks`."""

    def __init__(self, config: run.RunConfig, out_dir: Path | None, on_event: EventCallback | None = None) -> None:
        self.config = config
        self.out_dir = out_dir
        self.host = config.bind
        hosts = [hosts_file.Host.coerce(h, first=i == 0) for i, h in enumerate(config.hosts or [])]
        self.this_host = hosts[0] if hosts else None
        self.placement = hosts_file.placement(hosts)
        self.strategy = strategies.get(config.strategy)
        self.peer = adapter(self.strategy)  # a peer strategy's adapter (None for ours)
        self.recorder = Recorder(config, on_event)
        # what other threads see (the recorder's own list and dicts, appended and updated in place)
        self.metrics, self.events, self.status = self.recorder.metrics, self.recorder.events, self.recorder.status
        self.membership = Membership(
            self.strategy, config.world_size, regrow=config.regrow, warm_spares=config.warm_spares,
            resume=config.resume, stage_of=config.stage_of if config.parallelism == "hybrid" else None,
            verify=partial(checkpoint.unusable, elsewhere=bool(self.placement)) if config.resume_verify else None)
        self.plan = FaultPlan(config, start=checkpoint.step_of(config.resume) if config.resume else 0)
        self.watchdog = Watchdog(config.progress_timeout, config.heartbeat_timeout)
        self.stragglers = Stragglers(config.straggler_factor, config.straggler_window,
                                     enabled=config.straggler_response != "off")
        self.commands: queue.Queue[tuple[str, Any]] = queue.Queue()
        self.control: ControlServer | None = None
        self.launcher: Launcher | None = None
        self.agent: Any = None  # torchrun's agent
        self.lighthouse_address: str | None = None
        self._outcome: tuple[str, str] | None = None
        self._tmpdir: tempfile.TemporaryDirectory | None = None
        self.log_dir = (out_dir / "logs") if out_dir else None

    # -- views ----------------------------------------------------------------------------------------------------
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

    # -- the run ----------------------------------------------------------------------------------------------------
    def run(self) -> run_result.RunResult:
        """Run to the end; the result carries the run's provenance (:mod:`workbench.results.provenance`)."""
        outcome, reason = "failed", "the run did not start"
        self.provenance = provenance.collect(self.config.seed, devices.describe(self.config), self.config.speed_probe)
        try:
            self._start()
            outcome, reason = self._loop()
        except errors.RunStartError as exc:
            outcome, reason = "failed", str(exc)
        except BaseException as exc:  # noqa: BLE001 - a supervisor bug must still end in a result, ranks gone
            outcome, reason = "failed", f"supervisor error: {type(exc).__name__}: {exc}"
        finally:
            self._cleanup()
        self.status.update(state=outcome)
        self.recorder.event("end", -1, f"{outcome}: {reason}")
        workers = [w for w in self.member_workers if w is not None and (w.done or outcome != "completed")]
        result = self.recorder.result(outcome, reason, world_size_final=len(workers),  # completed: who finished
                                      replicas_identical=replicas_identical(workers),
                                      keep_checkpoint=self.out_dir is not None)
        result.summary["detector_s"] = round(max((w.detector_s for w in workers), default=0.0), 4)
        result.summary["diffusion"] = next((w.diffusion for w in workers if w.diffusion), None)  # gossip: the same
        result.rank_steps, result.summary["stragglers"] = self.stragglers.table(), sum(
            e["kind"] == "straggler" for e in self.events)
        result.provenance = provenance.finish(self.provenance)
        result.summary["clock"] = clock.default(result.summary, result.provenance)  # what its figures show
        return result

    def _start(self) -> None:
        self.store, self._store_socket = open_store(self.host, self.config.store_port)
        listen = self._store_socket
        self.control = ControlServer(self.host, listen.family)
        self.store.set(CONTROL_KEY, self.control.address)
        self.store_address = f"{self.host}:{listen.getsockname()[1]}"
        if self.placement:
            self.recorder.event("store", -1, f"store at {self.store_address}; ranks on " + ", ".join(
                f"{h.address} ({h.slots})" for h in dict.fromkeys(self.placement.values())))
        if self.log_dir:
            self.log_dir.mkdir(parents=True, exist_ok=True)
        rank_module = self.strategy.peer.rank_module if self.strategy.peer else "workbench.rank"
        self.launcher = Launcher(self.config.spawn, rank_module, self.log_dir, self.placement, self.this_host,
                                 self.config.startup_timeout,
                                 note=lambda detail: self.recorder.event("template", -1, detail))
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
                self._inject(fault.kind, fault.rank, source=f"planned ({fault})", fault=fault)
            if self._all_done():
                return "completed", (f"all {self.config.steps} steps done with world size "
                                     f"{sum(w.done for w in self.member_workers)}")

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

    def _all_done(self) -> bool:
        """Every member finished, but one first announced after another had (the finished never join again)."""
        members = self.member_workers
        if not members or self.membership.restarting or None in members:
            return False
        finished = max((w.done_gen for w in members if w.done and w.done_gen is not None), default=None)
        return all(w.done or finished is not None and (w.first_gen or 0) > finished for w in members)

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
            elif isinstance(d, Lost):
                w = self.launcher.workers[d.id]
                fault, say = w.fault or {}, self.recorder.fallback  # a teardown not measured: said in this run
                self.recorder.lost(d, fault.get("step", w.steps_done), fault.get("t", time.time()),
                                   peer=self.peer is not None, teardown=clock.teardown_s(w.proc, fault, say))
            elif isinstance(d, Generation):
                self._announce(d)
            elif isinstance(d, Note):
                self.recorder.event(d.kind, self.recorder.committed if d.kind == "restart" else -1, d.detail,
                                    rank=d.rank)
            elif isinstance(d, End):
                self._outcome = (d.outcome, d.reason)

    def _start_process(self, d: Start) -> None:
        if d.slot:
            self.launcher.slot(d.id, d.label, self.peer.name)
            return
        w = self.launcher.start_rank(d.id, d.label, self.control.address)
        if w.remote and w.proc is None:
            self.recorder.event("waiting", -1, f"rank {d.label} is to join from {w.host}: workbench rank --store "
                                f"{self.store_address} --rank-hint {d.label}", rank=d.label)

    def _announce(self, d: Generation) -> None:
        members = list(d.members)
        pause = self.planned_pause(members)  # the boundary under way outlives a failure
        for i, (label, w) in enumerate(zip(d.members, [self.launcher.workers[id] for id in d.holders])):
            w.first_gen = d.gen if w.first_gen is None else w.first_gen
            self.control.send(w, protocol.message(
                "generation", gen=d.gen, members=members, rank=i, size=len(members), source=d.source,
                resume=d.resume, recovery=d.recovery, pause=pause, **({"lanes": self.lanes} if self.lanes else {}),
                **({"rule": self.scale.message()} if self.scale is not None else {}),
                **({"dead_pids": self._dead_pids()} if self.config.device == "cuda" else {}),
                **self.plan.for_member(label, members)))
        resize = [f for f in self.plan.resizes() if pause and f.step == pause["step"]]
        if resize and self.boundary is None:
            self._resize(resize[0].world, planned=resize[0])
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
            worker, refusal = self.launcher.joining_slot(hello.get("rank_hint"), pending.conn.getpeername()[0])
            if worker is None:
                self.control.refuse(pending, refusal)
                self.recorder.event("join_refused", -1, refusal)
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
                self.recorder.event("host", -1, f"rank {w.label} joined from {w.host}", rank=w.label)
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
            self._notice(w, m["grace"], w.steps_done, f"{m['signal']}")
        elif kind == "paused":
            self._on_paused(w, m)
        elif kind == "flip":
            self.plan.flipped(w.label, m)
            self.recorder.rank_message(w.label, m)
        elif kind in ("detected", "apoptosis", "fallback"):
            self.recorder.rank_message(w.label, m)
        elif self.peer is not None and kind in self.peer.handlers:
            self.peer.handlers[kind](self.recorder, w.spawn_id, w.label, m)
        elif kind == "peer_error":
            self.recorder.event("peer_error", w.steps_done, m["message"], rank=w.label)
        elif kind == "done":
            w.done = True
            w.fingerprint, w.group, w.detector_s, w.done_gen = (m.get("fingerprint"), m.get("group", 0),
                                                                 m.get("detector_s", 0.0), m.get("gen"))
            w.diffusion = m.get("diffusion")
        elif kind == "error":
            self._outcome = ("failed", self.recorder.rank_error(w.label, w.steps_done, m))

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
