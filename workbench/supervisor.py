"""Parent side of a run: the store, the rank processes, the watching, the fault plan, membership decisions.

Protocol (DESIGN §3). The supervisor hosts the ``TCPStore`` (bound to 127.0.0.1) that the ranks' gloo groups
rendezvous through, and a control server (:mod:`workbench.protocol`) through which every rank says hello,
heartbeats and reports steps. Membership is a numbered generation: the supervisor decides who is in generation
``g`` and which member's state is authoritative (``source``) and tells each member; ranks build their group
under the store prefix ``gen{g}`` and take the source's state by broadcast.

Failure handling. A dead rank is seen by the end of its control connection (the kernel closes it the instant
the process dies) and by ``Popen.poll``; a frozen rank by heartbeats missing for ``heartbeat_timeout`` seconds,
after which it is SIGKILLed before anything else happens. Then the strategy decides: ``none`` ends the run with
outcome ``failed`` and a one-line reason; ``shrink`` announces generation ``g+1`` of the survivors, with the
survivor that committed the most steps as source (no step is lost).

No orphans: ranks run in sessions of their own, are started from the monitor thread (their parent-death
signal fires when it ends), exit when the control channel closes, and every exit path of the monitor thread —
completion, failure, ``stop()``, an exception, interpreter exit — kills each rank's process group and reaps it.
"""

from __future__ import annotations

import os
import queue
import selectors
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable

from workbench.config import RunConfig
from workbench.errors import RunStartError
from workbench.protocol import LineDecoder, encode
from workbench.results import RunResult

EventCallback = Callable[[str, dict[str, Any]], None]


@dataclass
class Worker:
    id: int
    proc: subprocess.Popen | None = None
    conn: socket.socket | None = None
    decoder: LineDecoder = field(default_factory=LineDecoder)
    last_heard: float = 0.0
    steps_done: int = 0
    done: bool = False
    alive: bool = True
    fingerprint: str | None = None  # hash of the final parameters, sent with "done"
    fault: dict[str, Any] | None = None  # the fault that hit this rank: kind, step, wall-clock time


@dataclass
class Failure:
    rank: int
    step: int
    cause: str
    fault_time: float  # wall clock of the fault (announced, sent, or when it was last seen alive)
    detect_time: float
    world_size_after: int = 0
    resume_time: float | None = None

    def figures(self, strategy: str) -> dict[str, Any]:
        return {
            "rank": self.rank, "step": self.step, "cause": self.cause, "strategy": strategy,
            "detection_s": round(self.detect_time - self.fault_time, 4),
            "resume_s": None if self.resume_time is None else round(self.resume_time - self.fault_time, 4),
            "world_size_after": self.world_size_after,
        }


class Supervisor:
    """Runs one training run to its end; ``run()`` is called on the monitor thread of a :class:`Run`."""

    def __init__(self, config: RunConfig, out_dir: Path | None, on_event: EventCallback | None = None,
                 host: str = "127.0.0.1") -> None:
        self.config = config
        self.out_dir = out_dir
        self.host = host
        self.on_event = on_event
        self.workers: dict[int, Worker] = {}
        self.commands: queue.Queue[tuple[str, Any]] = queue.Queue()
        self.gen = -1
        self.members: list[int] = []
        self.metrics: list[dict[str, Any]] = []
        self.events: list[dict[str, Any]] = []
        self.failures: list[Failure] = []
        self.t0 = time.time()
        self.train_start: float | None = None
        self.pending_time_faults = sorted((f for f in config.faults if f.time is not None), key=lambda f: f.time)
        self._wake_r, self._wake_w = socket.socketpair()
        self._sel = selectors.DefaultSelector()
        self._outcome: tuple[str, str] | None = None
        self.status: dict[str, Any] = {"state": "starting", "generation": -1, "world_size": 0, "step": 0}

    # -- commands from other threads ---------------------------------------------------------------------------
    def command(self, name: str, arg: Any = None) -> None:
        self.commands.put((name, arg))
        try:
            self._wake_w.send(b"x")
        except OSError:
            pass

    # -- the run ------------------------------------------------------------------------------------------------
    def run(self) -> RunResult:
        outcome, reason = "failed", "the run did not start"
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
        self._event("end", -1, f"{outcome}: {reason}")
        return RunResult.build(self, outcome, reason)

    def _start(self) -> None:
        import torch.distributed as dist

        listen = socket.socket()
        listen.bind((self.host, 0))
        listen.listen(256)
        self._store_socket = listen
        self.store = dist.TCPStore(self.host, listen.getsockname()[1], is_master=True, wait_for_workers=False,
                                   timeout=timedelta(seconds=self.config.startup_timeout),
                                   master_listen_fd=listen.fileno())
        self.server = socket.socket()
        self.server.bind((self.host, 0))
        self.server.listen(256)
        self.server.setblocking(False)
        self._sel.register(self.server, selectors.EVENT_READ, "accept")
        self._sel.register(self._wake_r, selectors.EVENT_READ, "wake")
        log_dir = (self.out_dir / "logs") if self.out_dir else None
        if log_dir:
            log_dir.mkdir(parents=True, exist_ok=True)
        for rank in range(self.config.world_size):
            self._spawn(rank, log_dir)
        deadline = time.monotonic() + self.config.startup_timeout
        while any(w.conn is None for w in self.workers.values()):
            if time.monotonic() > deadline:
                missing = [w.id for w in self.workers.values() if w.conn is None]
                raise RunStartError(f"ranks {missing} did not start within {self.config.startup_timeout:g} s")
            self._poll(0.05)
            for w in self.workers.values():
                if w.conn is None and w.proc.poll() is not None:
                    raise RunStartError(f"rank {w.id} exited during start-up with code {w.proc.returncode}"
                                        + (f" (see {log_dir}/rank{w.id}.log)" if log_dir else ""))
            if self._outcome:
                raise RunStartError(self._outcome[1])
        self.status.update(state="running")
        self._new_generation(sorted(self.workers), source_rank=0)

    def _spawn(self, rank: int, log_dir: Path | None) -> None:
        env = dict(os.environ)
        env.setdefault("OMP_NUM_THREADS", "1")
        env.setdefault("GLOO_SOCKET_IFNAME", "lo")
        # the ranks must import what this process can (a notebook's working directory, the user's package)
        env["PYTHONPATH"] = os.pathsep.join([p for p in sys.path if p] + [env.get("PYTHONPATH", "")])
        out = open(log_dir / f"rank{rank}.log", "ab") if log_dir else subprocess.DEVNULL  # noqa: SIM115
        try:
            proc = subprocess.Popen(
                [sys.executable, "-m", "workbench.rank", "--control", f"{self.host}:{self.server.getsockname()[1]}",
                 "--id", str(rank)],
                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        finally:
            if log_dir:
                out.close()
        self.workers[rank] = Worker(rank, proc=proc, last_heard=time.monotonic())

    def _loop(self) -> tuple[str, str]:
        while True:
            self._poll(0.05)
            if self._outcome:
                return self._outcome
            now = time.monotonic()
            for w in list(self.workers.values()):
                if not w.alive or w.done:
                    continue
                if w.proc is not None and w.proc.poll() is not None:
                    self._on_death(w, self._exit_cause(w))
                elif now - w.last_heard > self.config.heartbeat_timeout:
                    self._kill(w)
                    self._on_death(w, f"froze (no heartbeat for {self.config.heartbeat_timeout:g} s)", hung=True)
                if self._outcome:
                    return self._outcome
            self._fire_time_faults()
            if self.members and all(self.workers[m].done for m in self.members):
                return "completed", f"all {self.config.steps} steps done with world size {len(self.members)}"

    def _poll(self, timeout: float) -> None:
        for key, _ in self._sel.select(timeout):
            if key.data == "accept":
                self._accept()
            elif key.data == "wake":
                self._wake_r.recv(4096)
                self._run_commands()
            else:
                self._read(key.data)

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.server.accept()
            except BlockingIOError:
                return
            conn.setblocking(True)
            conn.settimeout(5.0)
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._sel.register(conn, selectors.EVENT_READ, _Pending(conn))

    def _read(self, who: Any) -> None:
        conn = who.conn
        try:
            data = conn.recv(65536)
        except OSError:
            data = b""
        if isinstance(who, _Pending):
            if not data:
                self._sel.unregister(conn)
                conn.close()
                return
            messages = who.decoder.feed(data)
            if not messages or messages[0].get("type") != "hello":
                return
            worker = self.workers.get(messages[0]["id"])
            if worker is None or worker.conn is not None:
                self._sel.unregister(conn)
                conn.close()
                return
            worker.conn, worker.decoder, worker.last_heard = conn, who.decoder, time.monotonic()
            self._sel.modify(conn, selectors.EVENT_READ, worker)
            self._send(worker, {"type": "start", "config": self.config.to_dict(),
                                "faults": [str(f) for f in self.config.faults
                                           if f.rank == worker.id and f.step is not None],
                                "store": f"{self.host}:{self._store_socket.getsockname()[1]}"})
            for message in messages[1:]:
                self._handle(worker, message)
            return
        worker: Worker = who
        if not data:
            self._sel.unregister(conn)
            if worker.alive and not worker.done:
                self._reap(worker, timeout=1.0)
                self._on_death(worker, self._exit_cause(worker))
            return
        worker.last_heard = time.monotonic()
        for message in worker.decoder.feed(data):
            self._handle(worker, message)

    def _handle(self, w: Worker, m: dict[str, Any]) -> None:
        kind = m["type"]
        if kind == "hb":
            return
        if kind == "step":
            w.steps_done = max(w.steps_done, m["step"] + 1) if m["gen"] == self.gen else w.steps_done
            if "loss" in m and m["gen"] == self.gen:
                self._record_step(m)
        elif kind == "joined":
            w.steps_done = m["step"]
            if m["gen"] == self.gen:
                self._event("joined", m["step"], f"generation {m['gen']}: state synced in {m['sync_s']:.3f} s",
                            rank=w.id)
        elif kind == "fault":
            w.fault = m
            self._event(m["kind"], m["step"], "planned fault fired", rank=w.id)
        elif kind == "done":
            w.done = True
            w.fingerprint = m.get("fingerprint")
        elif kind == "error":
            self._event("error", w.steps_done, m["message"], rank=w.id)
            self._outcome = ("failed", f"rank {w.id} raised an error at step {w.steps_done}: {m['message']}")

    def _record_step(self, m: dict[str, Any]) -> None:
        if self.train_start is None:
            self.train_start = time.time() - m["step_time"]
        for failure in self.failures:
            if failure.resume_time is None and failure.world_size_after and m["gen"] == self.gen:
                failure.resume_time = m["t"]
        row = {"step": m["step"], "time": m["t"] - self.t0, "loss": m["loss"], "train_acc": m["train_acc"],
               "test_acc": m.get("test_acc", float("nan")), "test_loss": m.get("test_loss", float("nan")),
               "world_size": len(self.members), "generation": self.gen, "step_time": m["step_time"]}
        self.metrics.append(row)
        self.status.update(step=m["step"] + 1)
        if self.on_event:
            self.on_event("step", row)

    # -- faults and failures -------------------------------------------------------------------------------------
    def _run_commands(self) -> None:
        while True:
            try:
                name, arg = self.commands.get_nowait()
            except queue.Empty:
                return
            if name == "stop":
                self._outcome = ("stopped", str(arg or "stopped by the user"))
            elif name in ("kill", "hang"):
                self._inject(name, arg, source="live")

    def _inject(self, kind: str, rank: int, source: str) -> None:
        w = self.workers.get(rank)
        if w is None or not w.alive or w.proc is None:
            self._event("fault_skipped", -1, f"{kind} of rank {rank}: not alive", rank=rank)
            return
        now = time.time()
        w.fault = {"kind": kind, "step": w.steps_done, "t": now}
        os.kill(w.proc.pid, signal.SIGKILL if kind == "kill" else signal.SIGSTOP)
        self._event(kind, w.steps_done, f"{source} fault", rank=rank)

    def _fire_time_faults(self) -> None:
        if self.train_start is None:
            return
        while self.pending_time_faults and time.time() - self.train_start >= self.pending_time_faults[0].time:
            fault = self.pending_time_faults.pop(0)
            self._inject(fault.kind, fault.rank, source=f"planned ({fault})")

    def _on_death(self, w: Worker, cause: str, hung: bool = False) -> None:
        w.alive = False
        if w.conn is not None:
            try:
                self._sel.unregister(w.conn)
            except (KeyError, ValueError):
                pass
            w.conn.close()
        now = time.time()
        fault_time = (w.fault or {}).get("t", now)
        step = (w.fault or {}).get("step", w.steps_done)
        failure = Failure(w.id, step, cause, fault_time, now)
        self.failures.append(failure)
        self._event("failure", step, f"rank {w.id} {cause}", rank=w.id)
        if w.id not in self.members:
            return
        survivors = [m for m in self.members if m != w.id and self.workers[m].alive]
        if self.config.strategy == "none" or not survivors:
            why = "strategy 'none' does not recover" if self.config.strategy == "none" else "no rank survived"
            self._outcome = ("failed", f"rank {w.id} {cause} at step {step}; {why}")
            return
        failure.world_size_after = len(survivors)
        source = max(survivors, key=lambda m: (self.workers[m].steps_done, -m))
        self._new_generation(survivors, source_rank=survivors.index(source))

    def _new_generation(self, members: list[int], source_rank: int) -> None:
        self.gen += 1
        self.members = list(members)
        for i, m in enumerate(self.members):
            self._send(self.workers[m], {"type": "generation", "gen": self.gen, "members": self.members, "rank": i,
                                         "size": len(self.members), "source": source_rank})
        self.status.update(generation=self.gen, world_size=len(self.members), members=list(self.members))
        self._event("generation", self.workers[self.members[source_rank]].steps_done,
                    f"generation {self.gen}: ranks {self.members}")

    def _exit_cause(self, w: Worker) -> str:
        code = w.proc.poll() if w.proc is not None else None
        if code is None:
            return "lost its connection"
        if code < 0:
            return f"died ({signal.Signals(-code).name})"
        return f"exited with code {code}"

    # -- plumbing ------------------------------------------------------------------------------------------------
    def _send(self, w: Worker, message: dict[str, Any]) -> None:
        try:
            w.conn.sendall(encode(message))
        except OSError:
            pass  # its death is noticed by the watch loop

    def _event(self, kind: str, step: int, detail: str, rank: int = -1) -> None:
        event = {"time": time.time() - self.t0, "step": step, "rank": rank, "kind": kind, "detail": detail}
        self.events.append(event)
        if self.on_event:
            self.on_event("event", event)

    def _kill(self, w: Worker) -> None:
        if w.proc is None:
            return
        for kill in (lambda: os.killpg(w.proc.pid, signal.SIGKILL), lambda: os.kill(w.proc.pid, signal.SIGKILL)):
            try:
                kill()
            except (ProcessLookupError, PermissionError):
                pass
        self._reap(w, timeout=5.0)

    def _reap(self, w: Worker, timeout: float) -> None:
        if w.proc is not None:
            try:
                w.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                pass

    def _cleanup(self) -> None:
        for w in self.workers.values():
            if w.conn is not None and w.alive:
                self._send(w, {"type": "stop", "reason": "run ended"})
        for w in self.workers.values():
            self._kill(w)
            if w.conn is not None:
                w.conn.close()
        for sock in (getattr(self, "server", None), getattr(self, "_store_socket", None), self._wake_r, self._wake_w):
            if sock is not None:
                sock.close()
        self._sel.close()
        self.store = None


@dataclass
class _Pending:
    conn: socket.socket
    decoder: LineDecoder = field(default_factory=LineDecoder)
