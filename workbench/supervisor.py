"""Parent side of a run: the store, the rank processes, the watching, the fault plan, membership decisions.

Protocol (DESIGN §3). The supervisor hosts the ``TCPStore`` (bound to 127.0.0.1) that the ranks' gloo groups
rendezvous through, and a control server (:mod:`workbench.protocol`) through which every rank says hello,
heartbeats and reports steps. Membership is a numbered generation: the supervisor decides who is in generation
``g`` and which member's state is authoritative (``source``) and tells each member; ranks build their group
under the store prefix ``gen{g}`` and take the source's state by broadcast.

Failure handling. A dead rank is seen by the end of its control connection (the kernel closes it the instant
the process dies) and by ``Popen.poll``; a frozen rank by heartbeats missing for ``heartbeat_timeout`` seconds,
after which it is SIGKILLed before anything else happens. Then the strategy decides (DESIGN §4):

* ``none``: the run ends, outcome ``failed``, with a one-line reason naming rank and step.
* ``shrink`` / ``rollback`` / ``forward``: generation ``g+1`` of the survivors with ``recovery`` set; the ranks
  settle the step in flight among themselves (``workbench.rank.recovery``). With ``regrow`` a replacement joins:
  at once if a warm spare is ready, else in a later generation as soon as a fresh process is ready.
* ``reinit``: survivors stay alive and wait; a replacement (spare or fresh) is made ready, then everyone joins
  ``g+1`` and takes a survivor's last in-memory snapshot.
* ``checkpoint_restart``: every rank is stopped, a fresh world is started and resumes from the last HDF5
  checkpoint (torchrun semantics).
* the peers (:mod:`workbench.peers`) recover by their own means; the supervisor only watches and records.
  ``torchft``: it runs torchft's lighthouse; the replicas see the death themselves (quorum), the supervisor
  restarts the dead replica, which heals from a peer. ``torchrun``: it starts one torchrun agent whose workers
  join through the store; the agent restarts the whole world, whose workers resume from the last checkpoint.

Ranks have stable numbers (labels): a replacement takes the number of the rank it replaces.

Several hosts (``RunConfig.hosts``, :mod:`workbench.hosts`). The store and the control server bind to
``config.bind`` (127.0.0.1 unless a hosts file names this machine's address); the store holds the control
server's address under ``workbench/control``. A rank placed on another host is either started through that
host's launcher (``ssh HOST``, ``ip netns exec NS``: the supervisor keeps the launcher's process) or started there
by someone else and joins with ``workbench rank --store ADDR:PORT --rank-hint K`` (its slot waits for it, bounded
by ``startup_timeout``). Remote ranks are watched like local ones — their connection closes when they die, their
heartbeats stop when they freeze — and faults reach them as ``signal`` messages (they cannot be signalled from
here). A remote rank exits when its connection to the supervisor ends, so it never outlives the run either.

No orphans: ranks run in sessions of their own, are started from the monitor thread (their parent-death
signal fires when it ends), exit when the control channel closes, and every exit path of the monitor thread —
completion, failure, ``stop()``, an exception, interpreter exit — kills each rank's process group and reaps it.
"""

from __future__ import annotations

import os
import queue
import select
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

from workbench.config import RunConfig
from workbench.errors import RunStartError
from workbench.peers import PEER_STRATEGIES
from workbench.protocol import CONTROL_KEY, LineDecoder, encode
from workbench.results import RunResult

EventCallback = Callable[[str, dict[str, Any]], None]


@dataclass
class Worker:
    spawn_id: int
    label: int | None  # the rank number users see; None for a warm spare not yet in use
    proc: subprocess.Popen | None = None
    conn: socket.socket | None = None
    decoder: LineDecoder = field(default_factory=LineDecoder)
    last_heard: float = 0.0
    steps_done: int = 0
    ready: bool = False  # data and model built, waiting for (or in) a generation
    done: bool = False
    alive: bool = True
    fingerprint: str | None = None  # hash of the final parameters, sent with "done"
    group: int = 0  # members of one group hold the same parameters (a pipeline stage's replicas)
    host: str = "local"  # address of the host it runs on (multi-host runs)
    remote: bool = False  # not a child process of this machine: signals travel as control messages
    fault: dict[str, Any] | None = None  # the fault that hit this rank: kind, step, wall-clock time
    started: float = field(default_factory=time.monotonic)  # when it was spawned (or its slot made)


@dataclass
class Failure:
    rank: int
    step: int
    cause: str
    fault_time: float  # wall clock of the fault (announced by the rank, or sent by the supervisor)
    detect_time: float
    committed: int  # steps committed by the run when the fault hit
    lost_share: int  # samples of the global batch that were the dead rank's share at that step
    recovery_gen: int | None = None
    world_size_after: int = 0
    resume_time: float | None = None
    replacement: int | None = None  # spawn id of the process taking the dead rank's place (regrow, reinit)
    regrow_time: float | None = None  # when that replacement joined: the world is back to its size
    steps_redone: int = 0
    samples_lost: int = 0
    peer_seen: bool = False  # a peer's own detection (torchft quorum, torchrun restart) replaced detect_time
    discarded: set[int] = field(default_factory=set)  # torchft: steps the survivors did not commit

    def figures(self, strategy: str) -> dict[str, Any]:
        return {
            "rank": self.rank, "step": self.step, "cause": self.cause, "strategy": strategy,
            "detection_s": round(self.detect_time - self.fault_time, 4) if self.detect_time is not None else None,
            "resume_s": None if self.resume_time is None else round(self.resume_time - self.fault_time, 4),
            "regrow_s": None if self.regrow_time is None else round(self.regrow_time - self.fault_time, 4),
            "steps_redone": self.steps_redone, "samples_lost": self.samples_lost,
            "world_size_after": self.world_size_after,
        }


class Supervisor:
    """Runs one training run to its end; ``run()`` is called on the monitor thread of a :class:`Run`."""

    def __init__(self, config: RunConfig, out_dir: Path | None, on_event: EventCallback | None = None) -> None:
        from workbench.hosts import Host, placement

        self.config = config
        self.out_dir = out_dir
        self.host = config.bind
        hosts = [Host.coerce(h, first=i == 0) for i, h in enumerate(config.hosts or [])]
        self.this_host = hosts[0] if hosts else None
        self.placement = placement(hosts)  # rank number -> host; empty: every rank on this machine
        self.peer = config.strategy if config.strategy in PEER_STRATEGIES else None
        self.rank_module = "workbench.peers.torchft_rank" if self.peer == "torchft" else "workbench.rank"
        self.lighthouse: subprocess.Popen | None = None  # torchft's lighthouse service
        self.agent: subprocess.Popen | None = None  # torchrun's agent
        self.on_event = on_event
        self.spawned: dict[int, Worker] = {}
        self.commands: queue.Queue[tuple[str, Any]] = queue.Queue()
        self.gen = -1
        self.members: list[int] = []  # labels of the current generation, in generation-rank order
        self.metrics: list[dict[str, Any]] = []
        self.events: list[dict[str, Any]] = []
        self.failures: list[Failure] = []
        self.t0 = time.time()
        self.train_start: float | None = None
        self.committed = 0  # steps committed by the run (rank 0 of the current generation)
        self.last_checkpoint: dict[str, Any] | None = None
        self.final_checkpoint: str | None = None
        self.pending_time_faults = sorted(config.time_faults, key=lambda f: f.time)
        self.pending_step_faults = list(config.step_faults)  # kill, hang and flip at a step, until they fire
        self.pending_random = list(config.random_failures)  # (step, position among live ranks)
        self.replacements: list[Worker] = []  # processes starting up to take a dead rank's place
        self.restarting = False  # checkpoint_restart: a fresh world is starting
        self._resume_path = config.resume
        self._wake_r, self._wake_w = socket.socketpair()
        self._sel = selectors.DefaultSelector()
        self._outcome: tuple[str, str] | None = None
        self._tmpdir: tempfile.TemporaryDirectory | None = None
        self.status: dict[str, Any] = {"state": "starting", "generation": -1, "world_size": 0, "step": 0}

    # -- commands from other threads ---------------------------------------------------------------------------
    def command(self, name: str, arg: Any = None) -> None:
        self.commands.put((name, arg))
        try:
            self._wake_w.send(b"x")
        except OSError:
            pass

    # -- views ---------------------------------------------------------------------------------------------------
    def worker(self, label: int) -> Worker | None:
        """The live process that currently holds rank number ``label``."""
        for w in self.spawned.values():
            if w.label == label and w.alive:
                return w
        return None

    @property
    def member_workers(self) -> list[Worker]:
        return [self.worker(label) for label in self.members]

    @property
    def checkpoint_dir(self) -> Path:
        if self.out_dir is not None:
            return self.out_dir / "checkpoints"
        if self._tmpdir is None:
            self._tmpdir = tempfile.TemporaryDirectory(prefix="workbench-ckpt-")
        return Path(self._tmpdir.name)

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

        listen = socket.socket(socket.AF_INET6 if ":" in self.host else socket.AF_INET)
        listen.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            listen.bind((self.host, self.config.store_port))
        except OSError as exc:
            listen.close()
            raise RunStartError(f"cannot listen on {self.host}:{self.config.store_port} ({exc.strerror}): choose "
                                "another --store-port, or a --bind address of this machine") from None
        listen.listen(256)
        self._store_socket = listen
        self.store = dist.TCPStore(self.host, listen.getsockname()[1], is_master=True, wait_for_workers=False,
                                   timeout=timedelta(seconds=self.config.startup_timeout),
                                   master_listen_fd=listen.fileno())
        self.server = socket.socket(listen.family)
        self.server.bind((self.host, 0))
        self.server.listen(256)
        self.server.setblocking(False)
        self._sel.register(self.server, selectors.EVENT_READ, "accept")
        self._sel.register(self._wake_r, selectors.EVENT_READ, "wake")
        self.store.set(CONTROL_KEY, f"{self.host}:{self.server.getsockname()[1]}")
        self.store_address = f"{self.host}:{listen.getsockname()[1]}"
        if self.placement:
            self._event("store", -1, f"store at {self.store_address}; ranks on "
                        + ", ".join(f"{h.address} ({h.slots})" for h in dict.fromkeys(self.placement.values())))
        self.log_dir = (self.out_dir / "logs") if self.out_dir else None
        if self.log_dir:
            self.log_dir.mkdir(parents=True, exist_ok=True)
        if self.peer == "torchft":
            self._start_lighthouse()
        if self.peer == "torchrun":
            first = [self._join_slot(label, "torchrun") for label in range(self.config.world_size)]
            self._start_agent()
        else:
            first = [self._spawn(label) for label in range(self.config.world_size)]
        spares = [self._spawn(None) for _ in range(self.config.warm_spares)]
        self._wait_ready(first + spares)  # a spare is warm from the first step: regrow timing does not vary
        self.status.update(state="running")
        self._new_generation(list(range(self.config.world_size)), source=0, resume=self._resume_path)

    def _wait_ready(self, workers: list[Worker]) -> None:
        deadline = time.monotonic() + self.config.startup_timeout
        while not all(w.ready for w in workers):
            if time.monotonic() > deadline:
                missing = [w.label if w.label is not None else "spare" for w in workers if not w.ready]
                joining = [w.label for w in workers if not w.ready and w.remote and w.proc is None]
                hint = (f"; ranks {joining} are to join from their hosts: workbench rank --store "
                        f"{self.store_address} --rank-hint K" if joining else "")
                raise RunStartError(f"ranks {missing} were not ready within {self.config.startup_timeout:g} s{hint}")
            self._poll(0.05)
            for w in workers:
                if w.proc is not None and w.proc.poll() is not None and not w.ready:
                    who = f"rank {w.label}" if w.label is not None else "a warm spare"
                    raise RunStartError(f"{who} exited during start-up with code {w.proc.returncode}"
                                        + (f" (see {self.log_dir}/spawn{w.spawn_id}.log)" if self.log_dir else ""))
            if self._outcome:
                raise RunStartError(self._outcome[1])
            if self.agent is not None and self.agent.poll() is not None:
                raise RunStartError(f"the torchrun agent exited during start-up with code {self.agent.returncode}"
                                    + (f" (see {self.log_dir}/torchrun.log)" if self.log_dir else ""))

    def _spawn(self, label: int | None) -> Worker:
        """Start the process for rank ``label`` (None: a warm spare, on this machine) on the host that holds it:
        here, through the host's launcher, or — for a host whose ranks join by themselves — a slot that waits."""
        spawn_id = len(self.spawned)
        host = self.placement.get(label) if label is not None and self.placement else None
        if host is not None and host is not self.this_host and not host.launch:
            worker = self._join_slot(label, host.address)
            self._event("waiting", -1, f"rank {label} is to join from {host.address}: workbench rank --store "
                        f"{self.store_address} --rank-hint {label}", rank=label)
            return worker
        prefix = list(host.launch) if host is not None and host.launch else []
        proc = self._launch(prefix + [sys.executable, "-m", self.rank_module, "--control",
                                      f"{self.host}:{self.server.getsockname()[1]}", "--id", str(spawn_id)],
                            f"spawn{spawn_id}.log", what=f"rank {label}")
        worker = Worker(spawn_id, label, proc=proc, last_heard=time.monotonic(),
                        host=host.address if host is not None else "local", remote=bool(prefix))
        self.spawned[spawn_id] = worker
        return worker

    def _launch(self, argv: list[str], log_name: str, what: str, env: dict[str, str] | None = None
                ) -> subprocess.Popen:
        """Start a process of the run (a rank, the lighthouse, the torchrun agent) in a session of its own, its
        output in ``logs/<log_name>``. Ranks must import what this process can (a notebook's working directory,
        the user's package), hence PYTHONPATH; one thread each (gloo on CPU)."""
        env = {**os.environ, **(env or {}),
               "PYTHONPATH": os.pathsep.join([p for p in sys.path if p] + [os.environ.get("PYTHONPATH", "")])}
        env.setdefault("OMP_NUM_THREADS", "1")
        out = open(self.log_dir / log_name, "ab") if self.log_dir else subprocess.DEVNULL  # noqa: SIM115
        try:
            return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=env,
                                    start_new_session=True)
        except OSError as exc:
            raise RunStartError(f"cannot start {what} ({argv[0]}): {exc.strerror}") from None
        finally:
            if self.log_dir:
                out.close()

    def _join_slot(self, label: int, host: str) -> Worker:
        """A rank slot that waits for a process started by someone else to join through the store."""
        worker = Worker(len(self.spawned), label, last_heard=time.monotonic(), host=host, remote=True)
        self.spawned[worker.spawn_id] = worker
        return worker

    def _free_port(self) -> int:
        with socket.socket() as probe:
            probe.bind((self.host, 0))
            return probe.getsockname()[1]

    def _start_lighthouse(self) -> None:
        """torchft: its Rust lighthouse as the separate service its users run (quorum, heartbeats)."""
        binary = Path(sys.executable).with_name("torchft_lighthouse")
        if not binary.is_file():
            binary = Path(shutil.which("torchft_lighthouse") or binary)
        port = self._free_port()
        self.lighthouse = self._launch(
            [str(binary), "--bind", f"{self.host}:{port}", "--min_replicas", "1", "--quorum_tick_ms", "100",
             "--join_timeout_ms", "10000", "--heartbeat_timeout_ms", str(int(self.config.heartbeat_timeout * 1000))],
            "lighthouse.log", what="torchft's lighthouse", env={"RUST_LOG": "warn"})
        self.lighthouse_address = f"http://{self.host}:{port}"
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection((self.host, port), timeout=1).close()
                return
            except OSError:
                if self.lighthouse.poll() is not None or time.monotonic() > deadline:
                    raise RunStartError("torchft's lighthouse did not start listening within 10 s") from None
                time.sleep(0.02)

    def _restart_torchrun_world(self) -> None:
        """Every current worker and slot retires (their end is the agent's doing, not another failure); fresh
        slots wait for the workers the agent starts next."""
        for w in [*self.member_workers, *self.replacements]:
            if w is not None:
                w.alive = False
        self.restarting = True
        self.replacements = [self._join_slot(label, "torchrun") for label in range(self.config.world_size)]

    def _start_agent(self) -> None:
        """torchrun: one elastic agent for the world; its workers join the slots by $RANK."""
        # every planned kill/hang and every planned random failure, plus 3 for restarts that fail on their own
        restarts = len(self.pending_step_faults) + len(self.pending_time_faults) + len(self.pending_random) + 3
        self.agent = self._launch(
            [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--master-addr", self.host,
             "--master-port", str(self._free_port()), "--nproc-per-node", str(self.config.world_size),
             "--max-restarts", str(restarts), "--monitor-interval", "0.1",
             "-m", "workbench.peers.torchrun_rank", "--store", self.store_address],
            "torchrun.log", what="the torchrun agent", env={"LOGLEVEL": "WARNING"})
        self._event("torchrun", -1, f"torchrun agent started: {self.config.world_size} workers, up to {restarts} "
                    "restarts of the world")

    def _loop(self) -> tuple[str, str]:
        while True:
            self._poll(0.05)
            if self._outcome:
                return self._outcome
            now = time.monotonic()
            for w in list(self.spawned.values()):
                if not w.alive or w.done:
                    continue
                if w.proc is not None and w.proc.poll() is not None:
                    self._drain(w)  # its last messages ("done") may still be in the socket
                    if not w.done and w.alive:
                        self._on_death(w, self._exit_cause(w))
                elif w.conn is not None and now - w.last_heard > self.config.heartbeat_timeout:
                    self._kill(w)
                    self._on_death(w, f"froze (no heartbeat for {self.config.heartbeat_timeout:g} s)")
                elif not w.ready and now - w.started > self.config.startup_timeout:
                    self._kill(w)  # a process that never said hello, or never got ready (a stuck rendezvous)
                    self._on_death(w, f"was not ready within {self.config.startup_timeout:g} s")
                if self._outcome:
                    return self._outcome
            if self.agent is not None and self.agent.poll() is not None and not self._all_done():
                return "failed", (f"the torchrun agent gave up (exit code {self.agent.returncode}): a worker failed "
                                  "more often than --max-restarts allows")
            self._fire_time_faults()
            self._admit_replacements()
            if self._all_done():
                return "completed", f"all {self.config.steps} steps done with world size {len(self.members)}"

    def _all_done(self) -> bool:
        return bool(self.members) and not self.restarting and all(w is not None and w.done
                                                                    for w in self.member_workers)

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
            self._hello(who, data)
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

    def _drain(self, w: Worker) -> None:
        """Handle whatever an exited rank sent before it ended."""
        while w.conn is not None and w.alive and select.select([w.conn], [], [], 0)[0]:
            try:
                data = w.conn.recv(65536)
            except OSError:
                return
            if not data:
                return
            for message in w.decoder.feed(data):
                self._handle(w, message)

    def _hello(self, pending: _Pending, data: bytes) -> None:
        conn = pending.conn
        messages = pending.decoder.feed(data) if data else []
        if not data or (messages and messages[0].get("type") != "hello"):
            self._sel.unregister(conn)
            conn.close()
            return
        if not messages:
            return
        if messages[0]["id"] is None:  # a rank started elsewhere, joining through the store
            worker, refusal = self._joining_slot(messages[0].get("rank_hint"), conn.getpeername()[0])
            if worker is None:
                self._sel.unregister(conn)
                try:
                    conn.sendall(encode({"type": "stop", "reason": refusal, "refused": True}))
                except OSError:
                    pass
                conn.close()
                self._event("join_refused", -1, refusal)
                return
            if self.peer != "torchrun":
                worker.host = conn.getpeername()[0]
            else:  # a restarted worker: the agent has seen the failure and acted on it
                for failure in self.failures:
                    if not failure.peer_seen:
                        failure.detect_time, failure.peer_seen = time.time(), True
        else:
            worker = self.spawned.get(messages[0]["id"])
        if worker is None or worker.conn is not None or not worker.alive:
            self._sel.unregister(conn)
            conn.close()
            return
        worker.conn, worker.decoder, worker.last_heard = conn, pending.decoder, time.monotonic()
        self._sel.modify(conn, selectors.EVENT_READ, worker)
        self._send(worker, {"type": "start", "config": self.config.to_dict(),
                            "lighthouse": getattr(self, "lighthouse_address", None),
                            "store": self.store_address,
                            "checkpoint_dir": str(self.checkpoint_dir)})
        for message in messages[1:]:
            self._handle(worker, message)

    def _joining_slot(self, hint: int | None, address: str) -> tuple[Worker | None, str]:
        """The slot a joining rank takes: rank ``hint`` if it waits for a join, else the lowest waiting one of
        the host it connects from (the lowest of any host if none is listed at that address)."""
        waiting = sorted((w for w in self.spawned.values() if w.remote and w.proc is None and w.alive
                          and w.conn is None), key=lambda w: w.label)
        if hint is not None:
            chosen = [w for w in waiting if w.label == hint]
            if chosen:
                return chosen[0], ""
            why = "no such rank" if self.placement.get(hint) is None else "it is not waiting for a join"
            return None, (f"rank {hint} cannot be taken ({why}); ranks waiting for a join: "
                          f"{[w.label for w in waiting] or 'none'}")
        same_host = [w for w in waiting if w.host == address]
        if same_host or waiting:
            return (same_host or waiting)[0], ""
        return None, "no rank of this run is waiting for a join"

    def _handle(self, w: Worker, m: dict[str, Any]) -> None:
        kind = m["type"]
        if kind == "hb":
            return
        if kind == "step":
            if self.peer == "torchft":
                self._torchft_step(w, m)
            if m["gen"] == self.gen:
                w.steps_done = max(w.steps_done, m["step"] + 1)
                reporter = self.peer != "torchft" or w.label == min(self.members)
                if "loss" in m and reporter:
                    self._record_step(m)
        elif kind == "quorum":
            self._event("quorum", m["step"], f"torchft quorum {m['quorum_id']}: {m['participants']} replicas",
                        rank=w.label)
            for failure in self.failures:  # a survivor's first new quorum after the fault: torchft has seen it
                if not failure.peer_seen and failure.fault_time <= m["t"] and failure.replacement != w.spawn_id:
                    failure.detect_time, failure.peer_seen = m["t"], True
        elif kind == "discarded":
            self._event("discarded", m["step"], "torchft did not commit the step" + (f": {m['error']}" if m.get(
                "error") else ""), rank=w.label)
            for failure in self.failures:
                if failure.resume_time is None and failure.fault_time <= m["t"]:
                    failure.discarded.add(m["step"])
                    failure.steps_redone = len(failure.discarded)
        elif kind == "peer_error":
            self._event("peer_error", w.steps_done, m["message"], rank=w.label)
        elif kind == "ready":
            w.ready = True
            if w.remote and w.proc is None:
                self._event("host", -1, f"rank {w.label} joined from {w.host}", rank=w.label)
        elif kind == "joined":
            w.steps_done = m["step"]
            for failure in self.failures:
                if failure.replacement == w.spawn_id and failure.regrow_time is None:
                    failure.regrow_time = time.time()
            if m["gen"] == self.gen and "recovery" in m:
                self._record_recovery(m)
            if m["gen"] == self.gen:
                self._event("joined", m["step"], f"generation {m['gen']}: state synced in {m['sync_s']:.3f} s",
                            rank=w.label if w.label is not None else -1)
        elif kind == "checkpoint":
            if Path(m["path"]).name == "final.h5":
                self.final_checkpoint = m["path"]
                return
            self.last_checkpoint = m
            self._event("checkpoint", m["step"], f"{m['path']} (stall {m['stall_s'] * 1e3:.1f} ms, "
                        f"write {m['write_s'] * 1e3:.1f} ms)")
        elif kind == "fault":
            w.fault = m
            self.pending_step_faults = [f for f in self.pending_step_faults
                                        if (f.rank, f.step, f.kind) != (w.label, m["step"], m["kind"])]
            self.pending_random = [f for f in self.pending_random if f[0] != m["step"] or not m.get("random")]
            self._event(m["kind"], m["step"], "planned fault fired", rank=w.label)
        elif kind == "flip":
            self.pending_step_faults = [f for f in self.pending_step_faults if not (
                f.kind == "flip" and f.rank == w.label and f.step == m["planned"] and f.target == m["target"])]
            self._event("flip", m["step"], f"{m['target']} {m['tensor']}[{m['index']}] bit {m['bit']}: "
                        f"{m['old']:.6g} -> {m['new']:.6g}", rank=w.label)
        elif kind == "detected":
            self._event("detected", m["step"], f"{m['detector']}: {m['detail']}")
            self._event("recovered", m["to_step"], f"soft error: {m['action']} (resumed at step {m['to_step']})")
        elif kind == "apoptosis":
            for layer, removed in m["removed"].items():
                before, after = m["widths"][layer]
                self._event("apoptosis", m["step"], f"{layer}: {removed} units removed ({before} -> {after}), "
                            f"tau {m['tau']:.4g}; model now {m['hidden_units']} hidden units, "
                            f"{m['parameters']} parameters")
        elif kind == "done":
            w.done = True
            w.fingerprint = m.get("fingerprint")
            w.group = m.get("group", 0)
        elif kind == "error":
            self._event("error", w.steps_done, m["message"], rank=w.label if w.label is not None else -1)
            self._outcome = ("failed", f"rank {w.label} raised an error at step {w.steps_done}: {m['message']}")

    def _torchft_step(self, w: Worker, m: dict[str, Any]) -> None:
        """torchft's figures: resume = first step committed by a quorum without the dead replica; regrow = the
        replacement's first committed step; samples lost = the missing replica's share of every step between."""
        for failure in self.failures:
            if failure.resume_time is None and failure.peer_seen and m["t"] >= failure.detect_time:
                failure.resume_time = m["t"]
            if failure.replacement == w.spawn_id and failure.regrow_time is None:
                failure.regrow_time = m["t"]
                how = (f"healed from a peer and committed step {m['step']}" if m["step"] > 0 else
                       "found no peer to heal from (they had finished) and started from step 0")
                self._event("regrow", m["step"], f"rank {w.label}'s replacement {how}", rank=w.label)
            elif failure.resume_time is not None and failure.regrow_time is None and w.label == min(self.members):
                failure.samples_lost += failure.lost_share

    def _record_step(self, m: dict[str, Any]) -> None:
        if self.train_start is None:
            self.train_start = time.time() - m["step_time"]
        self.committed = m["step"] + 1
        for failure in self.failures:
            if failure.resume_time is None and failure.recovery_gen is not None and m["gen"] >= failure.recovery_gen:
                failure.resume_time = m["t"]
        row = {"step": m["step"], "time": m["t"] - self.t0, "loss": m["loss"], "train_acc": m["train_acc"],
               "samples": m["samples"],
               "test_acc": m.get("test_acc", float("nan")), "test_loss": m.get("test_loss", float("nan")),
               "world_size": len(self.members), "generation": self.gen, "step_time": m["step_time"],
               "messages": m.get("messages", float("nan")), "bytes_sent": m.get("bytes_sent", float("nan")),
               "consensus_distance": m.get("consensus_distance", float("nan")),
               "parameters": m.get("parameters", float("nan")), "hidden_units": m.get("hidden_units", float("nan"))}
        self.metrics.append(row)
        self.status.update(step=m["step"] + 1)
        if self.on_event:
            self.on_event("step", row)

    def _record_recovery(self, m: dict[str, Any]) -> None:
        """Rank 0 of a recovery generation says where the state resumed and whether it finished the failed step."""
        for failure in self.failures:
            if failure.recovery_gen == m["gen"] or (failure.recovery_gen is not None and failure.recovery_gen < m["gen"]
                                                   and failure.resume_time is None):
                failure.steps_redone = max(0, failure.committed - m["resume_step"])
                failure.samples_lost = failure.lost_share if m.get("retried") else 0
        detail = f"resumed at step {m['resume_step']}" + (", failed step finished by the survivors"
                                                           if m.get("retried") else "")
        self._event("recovered", m["resume_step"], f"{m['recovery']}: {detail}")

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
            elif name == "flip":
                w = self.worker(arg.rank)
                if w is None or arg.rank not in self.members:
                    self._event("fault_skipped", -1, f"flip on rank {arg.rank}: not alive", rank=arg.rank)
                else:
                    self._send(w, {"type": "faults_add", "faults": [str(arg)]})

    def _inject(self, kind: str, label: int, source: str) -> None:
        w = self.worker(label)
        if w is None or (w.proc is None and w.conn is None) or label not in self.members:
            self._event("fault_skipped", -1, f"{kind} of rank {label}: not alive", rank=label)
            return
        w.fault = {"kind": kind, "step": w.steps_done, "t": time.time()}
        name = "SIGKILL" if kind == "kill" else "SIGSTOP"
        if w.remote:
            self._send(w, {"type": "signal", "name": name})  # not our child: it signals itself
        else:
            os.kill(w.proc.pid, getattr(signal, name))
        self._event(kind, w.steps_done, f"{source} fault", rank=label)

    def _fire_time_faults(self) -> None:
        if self.train_start is None:
            return
        while self.pending_time_faults and time.time() - self.train_start >= self.pending_time_faults[0].time:
            fault = self.pending_time_faults.pop(0)
            self._inject(fault.kind, fault.rank, source=f"planned ({fault})")

    def _on_death(self, w: Worker, cause: str) -> None:
        w.alive = False
        if w.conn is not None:
            try:
                self._sel.unregister(w.conn)
            except (KeyError, ValueError):
                pass
            w.conn.close()
        if w in self.replacements:
            self.replacements.remove(w)
        if self.peer == "torchrun" and self.restarting and w.label is not None:
            # a worker of the restarted world failed too: the agent restarts the world once more
            self._restart_torchrun_world()
            self._event("restart", -1, f"a restarted torchrun worker (rank {w.label}) {cause}; the agent "
                        "restarts the world again")
            return
        if w.label is None or w.label not in self.members or self.restarting:
            self._event("spare_lost", -1, f"a starting or spare rank {cause}")
            return
        now = time.time()
        fault_time = (w.fault or {}).get("t", now)
        step = (w.fault or {}).get("step", w.steps_done)
        position, size = self.members.index(w.label), len(self.members)
        share = self.config.batch_size // size + (1 if position < self.config.batch_size % size else 0)
        failure = Failure(w.label, step, cause, fault_time, now, committed=self.committed, lost_share=share)
        self.failures.append(failure)
        self._event("failure", step, f"rank {w.label} {cause}", rank=w.label)
        survivors = [label for label in self.members if label != w.label and self.worker(label) is not None]
        strategy = self.config.strategy
        if strategy == "none" or not survivors and strategy != "checkpoint_restart":
            why = "strategy 'none' does not recover" if strategy == "none" else "no rank survived"
            self._outcome = ("failed", f"rank {w.label} {cause} at step {step}; {why}")
            return
        if self.config.parallelism == "hybrid" and strategy == "shrink":
            stage = self.config.stage_of(w.label)
            if not any(self.config.stage_of(label) == stage for label in survivors):
                self._outcome = ("failed", f"rank {w.label} {cause} at step {step}, the last replica of pipeline "
                                 f"stage {stage}; shrink cannot rebuild a stage's layers (checkpoint_restart or "
                                 "reinit can)")
                return
        if self.peer:
            failure.detect_time = None  # the peer's own detection replaces it (see _handle)
        if self.peer == "torchft":  # the replicas find out by themselves; torchft's recovery is a restart + heal
            failure.world_size_after = len(survivors)
            self.members = survivors
            failure.replacement = self._replace(w.label)
            return
        if self.peer == "torchrun":  # the agent stops and restarts every worker; fresh slots wait for them
            failure.world_size_after = self.config.world_size
            self._restart_torchrun_world()
            self._event("restart", failure.step, "torchrun restarts the world; the workers resume from the "
                        + (f"checkpoint of step {self.last_checkpoint['step']}" if self.last_checkpoint else "start"))
            return
        if strategy == "checkpoint_restart":
            self._restart_world(failure)
        elif strategy == "reinit":
            failure.replacement = self._replace(w.label)
            self.members = survivors  # the replacement is admitted with everyone in _admit_replacements
            failure.world_size_after = self.config.world_size
        else:
            spare = self._take_spare(w.label) if self.config.regrow else None
            if spare is not None:
                failure.replacement = spare.spawn_id
            members = sorted(survivors + ([spare.label] if spare else []))
            failure.world_size_after = len(members)
            failure.recovery_gen = self.gen + 1
            self._new_generation(members, recovery=strategy)
            if self.config.regrow and spare is None:
                failure.replacement = self._replace(w.label)

    def _take_spare(self, label: int) -> Worker | None:
        for w in self.spawned.values():
            if w.label is None and w.alive and w.ready:
                w.label = label
                self._spawn(None)  # keep the pool full
                self._event("spare", -1, f"a warm spare takes the place of rank {label}", rank=label)
                return w
        return None

    def _replace(self, label: int) -> int:
        """Start (or take from the spares) the process that will hold rank ``label``; returns its spawn id."""
        worker = self._take_spare(label)
        if worker is None:
            worker = self._spawn(label)
            self._event("respawn", -1, f"starting a fresh process for rank {label}", rank=label)
        self.replacements.append(worker)
        return worker.spawn_id

    def _admit_replacements(self) -> None:
        """Bring ready replacements into the next generation (regrow, reinit, checkpoint_restart)."""
        if not self.replacements:
            return
        if self.restarting:
            if all(w.ready for w in self.replacements):
                self.replacements.clear()
                self.restarting = False
                resume = self.last_checkpoint["path"] if self.last_checkpoint else self._resume_path
                self.failures[-1].recovery_gen = self.gen + 1
                self._new_generation(list(range(self.config.world_size)), source=0, resume=resume,
                                     recovery=self.config.strategy)
            return
        ready = [w for w in self.replacements if w.ready]
        if not ready:
            return
        if self.config.strategy == "reinit" and len(ready) < len(self.replacements):
            return  # everyone restarts together
        for w in ready:
            self.replacements.remove(w)
        members = sorted(self.members + [w.label for w in ready])
        if self.config.strategy == "reinit":
            source = members.index(min(self.members))
            for failure in self.failures:
                if failure.recovery_gen is None:
                    failure.recovery_gen = self.gen + 1
            self._new_generation(members, source=source, recovery="reinit")
        else:
            self._new_generation(members)
            self._event("regrow", -1, f"ranks {[w.label for w in ready]} rejoined: world size {len(members)}")

    def _restart_world(self, failure: Failure) -> None:
        """checkpoint_restart: stop every rank, start a fresh world, resume from the last checkpoint."""
        for w in self.member_workers:
            if w is not None:
                w.alive = False
                if w.conn is not None:
                    self._sel.unregister(w.conn)
                self._kill(w)
        self.restarting = True
        failure.world_size_after = self.config.world_size
        self.replacements = [self._spawn(label) for label in range(self.config.world_size)]
        where = f"checkpoint of step {self.last_checkpoint['step']}" if self.last_checkpoint else "step 0"
        self._event("restart", failure.step, f"world stopped; {self.config.world_size} fresh ranks resume from {where}")

    def _new_generation(self, members: list[int], source: int | None = None, resume: str | None = None,
                        recovery: str | None = None) -> None:
        """Announce generation g+1. ``source`` None: the ranks pick the most advanced member themselves."""
        self.gen += 1
        self.members = list(members)
        random_here = [(step, self.members[pos % len(self.members)]) for step, pos in self.pending_random]
        for i, label in enumerate(self.members):
            w = self.worker(label)
            faults = [str(f) for f in self.pending_step_faults if f.rank == label]
            faults += [f"kill:rank={label},step={step}" for step, r in random_here if r == label]
            self._send(w, {"type": "generation", "gen": self.gen, "members": self.members, "rank": i,
                           "size": len(self.members), "source": source, "resume": resume, "recovery": recovery,
                           "faults": faults, "random_steps": [step for step, r in random_here if r == label]})
        self.status.update(generation=self.gen, world_size=len(self.members), members=list(self.members))
        size = len(self.members)
        if self.config.parallelism == "gossip" and size & (size - 1):
            cube = 1 << (size - 1).bit_length()
            self._event("gossip", self.committed, f"{size} members gossip on a {cube}-slot hypercube: a member whose "
                        "partner slot is empty skips that round's average (the replicas' mean is kept)")
        self._event("generation", self.committed, f"generation {self.gen}: ranks {self.members}"
                    + (f" ({recovery})" if recovery else ""))

    def _exit_cause(self, w: Worker) -> str:
        code = w.proc.poll() if w.proc is not None and not w.remote else None
        if code is None:
            if w.host == "torchrun":
                return "died (a torchrun worker: its connection closed)"
            return f"on {w.host} lost its connection" if w.remote else "lost its connection"
        if code < 0:
            return f"died ({signal.Signals(-code).name})"
        return f"exited with code {code}"

    # -- plumbing ------------------------------------------------------------------------------------------------
    def _send(self, w: Worker | None, message: dict[str, Any]) -> None:
        if w is None or w.conn is None:
            return
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
        if w.remote:
            self._send(w, {"type": "signal", "name": "SIGKILL"})  # and it exits when its connection closes
        if w.proc is not None:
            _kill_process(w.proc)

    def _reap(self, w: Worker, timeout: float) -> None:
        if w.proc is not None:
            try:
                w.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                pass

    def _cleanup(self) -> None:
        for w in self.spawned.values():
            if w.conn is not None and w.alive:
                self._send(w, {"type": "stop", "reason": "run ended"})
        for w in self.spawned.values():
            self._kill(w)
            if w.conn is not None:
                w.conn.close()
        for service in (self.agent, self.lighthouse):
            if service is not None:
                _kill_process(service)
        for sock in (getattr(self, "server", None), getattr(self, "_store_socket", None), self._wake_r, self._wake_w):
            if sock is not None:
                sock.close()
        self._sel.close()
        self.store = None
        if self._tmpdir is not None:
            self._tmpdir.cleanup()


def _kill_process(proc: subprocess.Popen, wait: float = 5.0) -> None:
    """SIGKILL a process and its session (it leads one), then reap it (bounded)."""
    for kill in (lambda: os.killpg(proc.pid, signal.SIGKILL), lambda: os.kill(proc.pid, signal.SIGKILL)):
        try:
            kill()
        except (ProcessLookupError, PermissionError):
            pass
    try:
        proc.wait(timeout=wait)
    except subprocess.TimeoutExpired:
        pass


@dataclass
class _Pending:
    conn: socket.socket
    decoder: LineDecoder = field(default_factory=LineDecoder)
