"""Launcher: every process a run owns — ranks, warm spares, the peers' helpers (torchft's lighthouse, torchrun's
agent), the rank templates of other hosts — how each is started, and how every one of them is stopped.

Local ranks are forked by a rank template (:mod:`workbench.supervisor.template`) or started fresh (``python -m
workbench.rank``); remote ones through their host's launch line, or awaited in a slot. No orphans: every rank
runs in a session of its own that ``kill`` SIGKILLs and reaps; ``close`` kills every process of the run on every
exit path; parent-death signals and the control channel's end take the rest. Details: docs/internals.md.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from workbench.base.errors import RunStartError
from workbench.base.hosts_file import Host
from workbench.base.processes import child_env, die_with_parent, kill_session
from workbench.base.protocol import LineDecoder, message
from workbench.supervisor.template import ForkedProcess, SharedTemplate, Template, TemplateError, local_template

TITLE = "workbench.rank"  # forked ranks' command line starts with this: `ps` and the leak checks find them


@dataclass
class Worker:
    """One process of the run (or a slot waiting for one) and what the supervisor knows of it."""

    spawn_id: int
    label: int | None  # the rank number users see; None for a warm spare not yet in use
    proc: Any = None  # subprocess.Popen or template.ForkedProcess (pid, poll, wait, kill)
    conn: Any = None  # its control connection (socket)
    decoder: LineDecoder = field(default_factory=LineDecoder)
    last_heard: float = 0.0
    steps_done: int = 0
    gen: int | None = None  # the latest generation announced to it
    ready: bool = False  # data and model built, waiting for (or in) a generation
    done: bool = False
    alive: bool = True
    fingerprint: str | None = None  # hash of the final parameters, sent with "done"
    group: int = 0  # members of one group hold the same parameters (a pipeline stage's replicas)
    detector_s: float = 0.0  # its time in the soft-error detectors, sent with "done"
    diffusion: dict | None = None  # gossip: the replicas' spread before/after log2 p rounds, sent with "done"
    host: str = "local"  # address of the host it runs on (multi-host runs)
    remote: bool = False  # not a child process of this machine: signals travel as control messages
    pid: int | None = None  # a process of this machine started by a peer's launcher (torchrun, mpirun)
    fault: dict[str, Any] | None = None  # the fault that hit this rank: kind, step, wall-clock time
    started: float = field(default_factory=time.monotonic)  # when it was spawned (or its slot made)


class Launcher:
    def __init__(self, spawn: str, rank_module: str, log_dir: Path | None, placement: dict[int, Host],
                 this_host: Host | None, ready_timeout: float, note: Callable[[str, bool], None] | None = None) -> None:
        self.spawn = spawn if rank_module == "workbench.rank" else "fresh"  # the peers start as their users' do
        self.rank_module = rank_module
        self.log_dir = log_dir.absolute() if log_dir else None  # the same directory if this process changes its own
        self.placement = placement  # rank number -> host; empty: every rank on this machine
        self.this_host = this_host
        self.ready_timeout = ready_timeout
        self.workers: dict[int, Worker] = {}
        self.services: list[subprocess.Popen] = []
        self.scratch: list[str] = []  # directories the run's processes write to (mpirun's session files)
        self.host_templates: dict[tuple[str, ...], Template] = {}
        self.note = note  # says what a run should know of the template it forks from, and whether it is shared
        self._noted: list[Template] = []

    # -- ranks ----------------------------------------------------------------------------------------------------
    def start_rank(self, spawn_id: int, label: int | None, control: str) -> Worker:
        """Start the process of rank ``label`` (None: a warm spare, on this machine) on the host that holds it."""
        host = self.placement.get(label) if label is not None and self.placement else None
        if host is not None and host is not self.this_host and not host.launch:
            return self.slot(spawn_id, label, host.address)
        prefix = list(host.launch) if host is not None and host.launch else []
        argv = ["--control", control, "--id", str(spawn_id)]
        log = self._log(f"spawn{spawn_id}.log")
        what = f"rank {label}" if label is not None else "a warm spare"
        if self.spawn == "template":
            template = self._template(prefix)
            try:
                proc = template.fork(argv, log=None if prefix else log, timeout=self.ready_timeout,
                                     title=f"{TITLE} {' '.join(argv)} (forked)")
            except TemplateError as exc:
                raise RunStartError(f"cannot start {what}: {exc}") from None
        else:
            proc = self.launch([*prefix, sys.executable, "-m", self.rank_module, *argv], f"spawn{spawn_id}.log",
                               what=what, service=False)
        worker = Worker(spawn_id, label, proc=proc, last_heard=time.monotonic(),
                        host=host.address if host is not None else "local", remote=bool(prefix))
        self.workers[spawn_id] = worker
        return worker

    def slot(self, spawn_id: int, label: int | None, host: str) -> Worker:
        """A rank slot that waits for a process started by someone else to join through the store."""
        worker = Worker(spawn_id, label, last_heard=time.monotonic(), host=host, remote=True)
        self.workers[spawn_id] = worker
        return worker

    def joining_slot(self, hint: int | None, address: str) -> tuple[Worker | None, str]:
        """The slot a rank joining from elsewhere takes: rank ``hint`` if it waits for a join, else the lowest
        waiting one of the host it connects from (the lowest of any host if none is listed at that address);
        (None, why) when there is none."""
        waiting = sorted((w for w in self.workers.values() if w.remote and w.proc is None and w.alive
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

    def _template(self, prefix: list[str]) -> Template:
        if not prefix:
            template = local_template()  # a sweep worker's shared one, if this process's environment names it
            if template.notice and self.note is not None and template not in self._noted:
                self._noted.append(template)
                self.note(template.notice, isinstance(template, SharedTemplate))
            return template
        key = tuple(prefix)
        if key not in self.host_templates or not self.host_templates[key].alive:
            log = open(self._log(f"template-{len(self.host_templates)}.log") or os.devnull, "ab")  # noqa: SIM115
            try:
                self.host_templates[key] = Template(prefix, stderr=log, ready_timeout=self.ready_timeout)
            finally:
                log.close()
        return self.host_templates[key]

    def _log(self, name: str) -> str | None:
        return str(self.log_dir / name) if self.log_dir else None

    # -- any process ----------------------------------------------------------------------------------------------
    def launch(self, argv: list[str], log_name: str, what: str, env: dict[str, str] | None = None,
               service: bool = True) -> subprocess.Popen:
        """Start a process of the run (a fresh rank, the lighthouse, the torchrun agent) in a session of its own,
        its output in ``logs/<log_name>``. Ranks must import what this process can (a notebook's working
        directory, the user's package), hence PYTHONPATH; one thread each (gloo on CPU); big tensors on huge pages."""
        env = child_env(env)
        env.setdefault("OMP_NUM_THREADS", "1")
        out = open(self.log_dir / log_name, "ab") if self.log_dir else subprocess.DEVNULL  # noqa: SIM115
        try:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=env,
                                    start_new_session=True, preexec_fn=die_with_parent)  # a Rust lighthouse too
        except OSError as exc:
            raise RunStartError(f"cannot start {what} ({argv[0]}): {exc.strerror}") from None
        finally:
            if self.log_dir:
                out.close()
        if service:
            self.services.append(proc)
        return proc

    def kill(self, worker: Worker, send: Any = None) -> None:
        """Stop a rank: a remote one is told to SIGKILL itself (``send``), a local one's session is killed."""
        if worker.pid is not None:
            _kill_pid(worker.pid, signal.SIGKILL)  # a stopped (hung) process cannot act on a message
        elif worker.remote and send is not None:
            send(worker, message("signal", name="SIGKILL"))  # and it exits when its connection closes
        if worker.proc is not None:
            kill_process(worker.proc)

    def signal(self, worker: Worker, name: str, send: Any) -> None:
        """Deliver a fault (SIGKILL, SIGSTOP) to a rank, wherever it runs."""
        if worker.pid is not None:
            _kill_pid(worker.pid, getattr(signal, name))
        elif worker.remote:
            send(worker, message("signal", name=name))  # not our child: it signals itself
        else:
            os.kill(worker.proc.pid, getattr(signal, name))

    def exit_cause(self, worker: Worker) -> str:
        code = worker.proc.poll() if worker.proc is not None and not worker.remote else None
        if code is None:
            if worker.pid is not None:
                launcher = {"torchrun": "a torchrun worker", "ulfm": "an MPI process of mpirun"}[worker.host]
                return f"died ({launcher}: its connection closed)"
            return f"on {worker.host} lost its connection" if worker.remote else "lost its connection"
        if code < 0:
            template = getattr(worker.proc, "template", None)
            if template is not None and not template.alive:  # it took its ranks along (their parent-death signal)
                return f"died ({signal.Signals(-code).name}) with the rank template: {template.reason}"
            return f"died ({signal.Signals(-code).name})"
        return f"exited with code {code}"

    def death_step(self, worker: Worker) -> int:
        """The step a rank died at: its own, or the run's for a spare that had not joined a generation yet."""
        return worker.steps_done or max((w.steps_done for w in self.workers.values()), default=0)

    def close(self, send: Any = None) -> None:
        """Kill every process of the run and this run's templates on other hosts; reap each (bounded)."""
        for worker in self.workers.values():
            self.kill(worker, send)
        for service in self.services:
            kill_process(service)
        for directory in self.scratch:
            shutil.rmtree(directory, ignore_errors=True)
        for template in self.host_templates.values():
            template.close()


def replicas_identical(workers: list[Worker]) -> bool:
    """Whether the ranks holding the same parameters (all of them; a pipeline stage's replicas) finished with the
    same fingerprint."""
    groups: dict[int, set[str | None]] = {}
    for w in workers:
        groups.setdefault(w.group, set()).add(w.fingerprint)
    return all(len(prints) == 1 for prints in groups.values())


def _kill_pid(pid: int, sig: int) -> None:
    """Signal a rank started by a peer's launcher, if that pid is still a workbench process (not a reused pid)."""
    try:
        if b"workbench" in Path(f"/proc/{pid}/cmdline").read_bytes():
            os.kill(pid, sig)
    except (FileNotFoundError, ProcessLookupError):
        pass


def kill_process(proc: Any, wait: float = 5.0) -> None:
    """SIGKILL a process and its session (it leads one), then reap it (bounded)."""
    if proc.poll() is not None:
        return
    if isinstance(proc, ForkedProcess):
        proc.kill()  # through its template too: it may run on another host
    kill_session(proc.pid)
    try:
        proc.wait(timeout=wait)
    except subprocess.TimeoutExpired:
        pass
