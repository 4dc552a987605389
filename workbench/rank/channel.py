"""Rank side of the control channel (protocol in :mod:`workbench.base.protocol`).

A reader thread receives the supervisor's messages; a ``generation`` message is stored as the latest
membership and wakes whatever the training loop is waiting on. A heartbeat thread proves the process is not
frozen. If the connection ends, the supervisor is gone and the rank exits at once (``os._exit``).
Every ``ready``, ``joined`` and ``step`` message carries ``cpu``: the CPU time this process has spent on its own
work so far (:data:`cpu_time`), what the supervisor's rank-time clock is made of (:mod:`workbench.results.clock`). A
fallback taken in the rank's process (:func:`workbench.base.fallbacks.taken`) is sent as a ``fallback`` message: the
run records it as its own.
"""

from __future__ import annotations

import os
import queue
import signal
import socket
import sys
import threading
import time
from typing import Any

from workbench.base import fallbacks
from workbench.base.protocol import CONTROL, HEARTBEAT_PERIOD, SUPERVISOR, LineDecoder, ProtocolError, encode, message
from workbench.rank import speed

CLOCKED = frozenset({"ready", "joined", "step"})


class _CpuClock:
    """CPU seconds this process has spent on its own work: every thread (compute, Python, gloo's collective
    algorithms) except gloo's transport threads (``gloo_tcp_loop``: socket reads and writes, waking the threads
    that wait for them). Their CPU is the machine's, not the rank's: measured on 2 shared cores it is 4x what the
    same exchanges cost on one (cross-core wake-ups), while the rest stays within 5 %; the supervisor charges the
    bytes a rank sends at the network's bandwidth instead (:mod:`workbench.results.clock`).

    With :meth:`scale_to` (``speed_probe``) the clock reads CPU seconds at the machine's reference speed: each
    stretch of CPU is scaled by ``reference / probe``, the probe (:mod:`workbench.rank.speed`) run every
    :data:`~workbench.rank.speed.EVERY_S` of CPU (:meth:`maybe_probe`); the probes' own CPU is not the rank's."""

    TRANSPORT = "gloo_tcp_loop"

    def __init__(self) -> None:
        self.seen: set[str] = set()
        self.unseparated = False  # /proc/self/task could not be read: the transport threads are counted (said)
        self.transport: dict[int, float] = {}  # tid -> its CPU when last read (a thread that ended keeps it)
        self.probed = 0.0  # CPU spent in probes
        self.probes: list[float] = []  # seconds per probe, the latest last
        self.reference: float | None = None  # seconds per probe at the reference speed; None: no scaling
        self._lock = threading.Lock()
        self._raw_at = self._scaled = self._probed_at = 0.0

    def raw(self) -> float:
        """CPU seconds of the rank's own work, unscaled."""
        total = time.process_time()
        try:
            tids = os.listdir("/proc/self/task")
        except OSError as exc:  # no procfs: the whole process, said once
            if not self.unseparated:
                self.unseparated = True
                fallbacks.taken("rank_cpu_with_transport", f"no /proc/self/task ({exc.strerror or exc}): gloo's "
                                "transport threads count as the rank's CPU time (more than its work on shared cores)")
            return total - self.probed
        for tid in tids:
            if tid not in self.seen:
                self.seen.add(tid)
                try:
                    with open(f"/proc/self/task/{tid}/comm", encoding="utf-8") as f:
                        if f.read().strip() == self.TRANSPORT:
                            self.transport[int(tid)] = 0.0
                except OSError:
                    pass
        for tid in self.transport:
            try:
                self.transport[tid] = time.clock_gettime((~tid << 3) | 6)  # Linux: the thread's CPU-time clock
            except OSError:
                pass  # the thread ended: its last reading stands
        return total - sum(self.transport.values()) - self.probed

    def __call__(self) -> float:
        raw = self.raw()
        if self.reference is None:
            return raw
        with self._lock:  # the CPU since the last reading, at the speed the probes read now
            self._scaled += max(raw - self._raw_at, 0.0) * self.factor()
            self._raw_at = raw
            return self._scaled

    def factor(self) -> float:
        """reference / probe: how much faster the reference core is than this one now (1 before any probe)."""
        if self.reference is None or not self.probes:
            return 1.0
        return self.reference / speed.lower_quartile(self.probes[-speed.KEEP:])

    def scale_to(self, reference_us: float) -> None:
        """From now on, read CPU at the reference speed: ``reference_us`` per probe (warmed up, probed once)."""
        for _ in range(3):  # the first probes pay for loading kernels: not a reading of the core's speed
            self._probe()
        self.probes.clear()
        self._raw_at = self._scaled = self._probed_at = self.raw()
        self.reference = reference_us * 1e-6
        self.maybe_probe(force=True)

    def maybe_probe(self, force: bool = False) -> None:
        """Run the probe if :data:`~workbench.rank.speed.EVERY_S` of CPU has passed since the last (scaling on)."""
        if self.reference is None or not force and self.raw() - self._probed_at < speed.EVERY_S:
            return
        self()  # the CPU so far, at the speed read before this probe
        self.probes.append(self._probe())
        del self.probes[:-speed.KEEP]
        self._probed_at = self.raw()

    def _probe(self) -> float:
        spent = speed.probe()
        self.probed += spent
        return spent


cpu_time = _CpuClock()


class Channel:
    def __init__(self, host: str, port: int, worker_id: int | None, connect_timeout: float = 30.0,
                 rank_hint: int | None = None) -> None:
        self.worker_id = worker_id
        self.sock = socket.create_connection((host, port), timeout=connect_timeout)
        # the address this host reaches the supervisor from: gloo binds there too, so its traffic takes the
        # interface that reaches the other hosts (127.0.0.1 for a run on one machine)
        self.local_address: str = self.sock.getsockname()[0]
        self.sock.settimeout(None)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._send_lock = threading.Lock()
        self.inbox: queue.Queue[dict[str, Any]] = queue.Queue()
        self.wake = threading.Event()  # set on every membership change; waits in comm.py watch it
        self.latest_generation: dict[str, Any] | None = None
        self.stop_reason: str | None = None
        self.waiting = False  # the training thread waits in a collective (Comm.wait); sent with each heartbeat
        self.ops = 0  # collectives it waited for
        self.live_faults: list[str] = []  # faults sent while the run goes on (run.flip); the trainer drains it
        self.throttle: tuple[float, float | None] | None = None  # a live slow-down (factor, seconds) not yet taken
        self.pause: dict[str, Any] | None = None  # the step boundary to stop at (a resize, a preemption)
        self.finish: int | None = None  # the step count the run ends at (run.finish), if asked to end early
        self.send(message("hello", id=worker_id, pid=os.getpid(), rank_hint=rank_hint))
        threading.Thread(target=self._read, name="wb-control", daemon=True).start()
        threading.Thread(target=self._beat, name="wb-heartbeat", daemon=True).start()
        fallbacks.listen(self)  # a rank's stderr goes to its log: what it falls back on goes to the supervisor

    def fallback(self, what: str, detail: str) -> None:
        """A fallback taken in this process: the supervisor records it (:mod:`workbench.base.fallbacks`)."""
        self.send(message("fallback", what=what, detail=detail))

    def send(self, sent: dict[str, Any]) -> None:
        """Send a message built by :func:`workbench.base.protocol.message`."""
        if sent["type"] in CLOCKED:
            if sent["type"] == "step":
                cpu_time.maybe_probe()
            sent["cpu"] = cpu_time()
        data = encode(sent)
        try:
            with self._send_lock:
                self.sock.sendall(data)
        except OSError:
            os._exit(3)  # supervisor gone

    def recv(self, timeout: float) -> dict[str, Any]:
        return self.inbox.get(timeout=timeout)

    def _read(self) -> None:
        decoder = LineDecoder()
        while True:
            try:
                data = self.sock.recv(65536)
            except OSError:
                data = b""
            if not data:
                os._exit(3)  # the supervisor closed the channel or died: never outlive it
            for got in decoder.feed(data):
                try:
                    kind = CONTROL.received(got, SUPERVISOR)
                except ProtocolError as exc:  # a supervisor of another workbench version: no way to follow it
                    print(f"workbench rank: {exc}", file=sys.stderr, flush=True)
                    os._exit(2)
                if kind == "generation":
                    self.pause = {"gen": got["gen"], **got["pause"]} if got.get("pause") else None
                    self.latest_generation = got
                    self.wake.set()
                elif kind == "throttle":
                    self.throttle = (float(got["factor"]), got.get("seconds"))
                    continue
                elif kind == "pause":
                    self.pause = got
                    continue
                elif kind == "finish":
                    self.finish = int(got["steps"])
                    continue
                elif kind == "faults_add":
                    self.live_faults.extend(got["faults"])
                    continue
                elif kind == "stop":
                    self.stop_reason = got.get("reason", "stopped")
                    if got.get("refused"):
                        print(f"workbench rank: {self.stop_reason}", file=sys.stderr, flush=True)
                        os._exit(2)
                    os._exit(0)
                elif kind == "signal":
                    os.kill(os.getpid(), getattr(signal, got["name"]))
                    continue
                self.inbox.put(got)

    def end(self, steps: int) -> int:
        """The step count this rank trains to: the run's ``steps``, or fewer once the run was asked to finish."""
        return steps if self.finish is None else min(steps, self.finish)

    def notice(self, signum: int, grace: float) -> None:
        """An outside preemption notice (a signal handler calls this): said from a thread of its own, since the
        interrupted training thread may hold the send lock."""
        name = signal.Signals(signum).name
        threading.Thread(target=self.send, args=(message("notice", grace=grace, signal=name, t=time.time()),),
                         name="wb-notice", daemon=True).start()

    def _beat(self) -> None:
        while True:
            time.sleep(HEARTBEAT_PERIOD)
            self.send(message("hb", waiting=self.waiting, ops=self.ops))
