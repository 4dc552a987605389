"""Rank side of the control channel (protocol in :mod:`workbench.protocol`).

A reader thread receives the supervisor's messages; a ``generation`` message is stored as the latest
membership and wakes whatever the training loop is waiting on. A heartbeat thread proves the process is not
frozen. If the connection ends, the supervisor is gone and the rank exits at once (``os._exit``).
Every ``ready``, ``joined`` and ``step`` message carries ``cpu``: the CPU time this process has spent on its own
work so far (:data:`cpu_time`), what the supervisor's rank-time clock is made of (:mod:`workbench.clock`).
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

from workbench.protocol import CONTROL, HEARTBEAT_PERIOD, SUPERVISOR, LineDecoder, ProtocolError, encode, message

CLOCKED = frozenset({"ready", "joined", "step"})


class _CpuClock:
    """CPU seconds this process has spent on its own work: every thread (compute, Python, gloo's collective
    algorithms) except gloo's transport threads (``gloo_tcp_loop``: socket reads and writes, waking the threads
    that wait for them). Their CPU is the machine's, not the rank's: measured on 2 shared cores it is 4x what the
    same exchanges cost on one (cross-core wake-ups), while the rest stays within 5 %; the supervisor charges the
    bytes a rank sends at the network's bandwidth instead (:mod:`workbench.clock`)."""

    TRANSPORT = "gloo_tcp_loop"

    def __init__(self) -> None:
        self.seen: set[str] = set()
        self.transport: dict[int, float] = {}  # tid -> its CPU when last read (a thread that ended keeps it)

    def __call__(self) -> float:
        total = time.process_time()
        try:
            tids = os.listdir("/proc/self/task")
        except OSError:  # no procfs: the whole process
            return total
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
        return total - sum(self.transport.values())


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
        self.send(message("hello", id=worker_id, pid=os.getpid(), rank_hint=rank_hint))
        threading.Thread(target=self._read, name="wb-control", daemon=True).start()
        threading.Thread(target=self._beat, name="wb-heartbeat", daemon=True).start()

    def send(self, sent: dict[str, Any]) -> None:
        """Send a message built by :func:`workbench.protocol.message`."""
        if sent["type"] in CLOCKED:
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
