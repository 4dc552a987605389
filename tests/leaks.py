"""Processes of the project, found by command line whoever their parent is, for the leak checks of the tests
(``conftest.py``) and of ``benchmarks/soak.py``.

A process belongs to the project when its command line is one of: a rank (``workbench.rank``: ``python -m
workbench.rank``, a rank forked by a template, whose title says so, and a peer's rank, ``workbench.rank.peers``), a rank
template (``workbench.supervisor.template``), torchft's ``torchft_lighthouse``, torchrun's agent
(``torch.distributed.run``
or ``torchrun`` with ``workbench`` in its arguments), the CLI (``python -m workbench ...``, the ``workbench``
script, ``workbench.launch.sweeps.point`` workers), papermill, a Jupyter kernel (``ipykernel_launcher``), a JupyterLab
server, or an MLflow tracking server a test started (``mlflow server`` and its uvicorn or gunicorn workers and
job runners, whose command lines name ``mlflow.server``). The calling process is never listed.

Several users (or worktrees) may run the suite on one machine at once, so :func:`tag_this_process` puts a tag
in this process's environment, which every process it starts inherits (the supervisor, papermill, Jupyter and
the CLI all pass the environment on); ``project_processes(tag=...)`` keeps the processes that carry the tag and
those whose environment cannot be read or is blank (a process title written over argv can blank it) unless
their nearest ancestor with a readable environment belongs to someone else. Only processes the caller started
are reported, and so only those are ever killed.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
import uuid
from pathlib import Path
from typing import NamedTuple

TAG_VAR = "WORKBENCH_LEAK_TAG"
_PROC = Path("/proc")
_SUBSTRINGS = ("workbench.rank", "workbench.supervisor.template", "workbench.launch.sweeps.point",
               "torchft_lighthouse", "ipykernel_launcher", "mlflow.server")
_SCRIPTS = {"workbench", "papermill", "jupyter-lab", "torchrun", "mlflow"}
_MODULES = {"workbench", "papermill", "jupyterlab"}


class Proc(NamedTuple):
    pid: int
    ppid: int
    args: str
    start: int = 0  # start time (clock ticks after boot): the same pid with another start is another process

    @property
    def key(self) -> tuple[int, int]:
        return self.pid, self.start

    def __str__(self) -> str:
        return f"{self.pid} (parent {self.ppid}): {self.args}"


def is_project(args: str) -> bool:
    """Whether a command line is one of the project's processes (see the module's docstring)."""
    if any(s in args for s in _SUBSTRINGS):
        return True
    argv = args.split()
    run = argv[1:2] if os.path.basename(argv[0]).startswith("python") else argv[:1]  # the script run
    names = {os.path.basename(a) for a in run}
    modules = {m for flag, m in zip(argv, argv[1:]) if flag == "-m"}
    if "torchrun" in names or "torch.distributed.run" in modules:
        return "workbench" in args  # torchrun's agent, when it runs our ranks
    return bool(names & _SCRIPTS or {m.split(".")[0] for m in modules} & _MODULES)


def all_processes() -> list[Proc]:
    """Every process on the machine (zombies with an empty command line), from /proc or else ``ps``."""
    if not _PROC.is_dir():
        out = subprocess.run(["ps", "-eo", "pid=,ppid=,args="], capture_output=True, text=True, check=True).stdout
        rows = [line.split(None, 2) for line in out.splitlines()]
        return [Proc(int(r[0]), int(r[1]), r[2] if len(r) > 2 else "") for r in rows
                if len(r) >= 2 and not (len(r) > 2 and r[2].startswith("ps -eo"))]
    procs = []
    for entry in os.scandir(_PROC):
        if not entry.name.isdigit():
            continue
        try:
            stat = (_PROC / entry.name / "stat").read_bytes()
            cmdline = (_PROC / entry.name / "cmdline").read_bytes()
        except OSError:  # gone meanwhile
            continue
        fields = stat[stat.rfind(b")") + 2:].split()  # after "pid (comm) ": state ppid ... starttime (22nd)
        args = " ".join(part.decode(errors="replace") for part in cmdline.split(b"\0") if part).strip()
        procs.append(Proc(int(entry.name), int(fields[1]), args, int(fields[19])))
    return procs


def tag_this_process() -> str:
    """Put a tag in this process's environment (inherited by every process it starts from now on); returns it."""
    os.environ[TAG_VAR] = f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
    return os.environ[TAG_VAR]


def _environ_tag(pid: int) -> str | None:
    """The tag in a process's initial environment: the tag, "" if it has none, None if unreadable or blank."""
    try:
        raw = (_PROC / str(pid) / "environ").read_bytes()
    except OSError:
        return None
    entries = [e for e in raw.split(b"\0") if e.strip()]
    if not entries or not any(b"=" in e for e in entries):
        return None
    prefix = TAG_VAR.encode() + b"="
    return next((e[len(prefix):].decode(errors="replace") for e in entries if e.startswith(prefix)), "")


def _ours(proc: Proc, tag: str, by_pid: dict[int, Proc]) -> bool:
    seen = set()
    while proc.pid not in seen:
        seen.add(proc.pid)
        found = _environ_tag(proc.pid)
        if found is not None:
            return found == tag
        parent = by_pid.get(proc.ppid)
        if parent is None or parent.pid <= 1:
            return True  # an orphan with a blank environment: cannot tell, so report it
        proc = parent
    return True


def project_processes(tag: str | None = None, procs: list[Proc] | None = None) -> list[Proc]:
    """Every process of the project by command line, whoever its parent is, except this process; with ``tag``,
    only those started under that tag (see the module's docstring)."""
    procs = all_processes() if procs is None else procs
    mine = {os.getpid()}
    found = [p for p in procs if p.pid not in mine and p.args and is_project(p.args)]
    if tag is None:
        return found
    by_pid = {p.pid: p for p in procs}
    return [p for p in found if _ours(p, tag, by_pid)]


def descendants(pid: int, procs: list[Proc]) -> set[int]:
    """The pids below ``pid`` in the process tree."""
    children: dict[int, list[int]] = {}
    for p in procs:
        children.setdefault(p.ppid, []).append(p.pid)
    found, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def own_idle_template(procs: list[Proc]) -> Proc | None:
    """This process's own rank template, when it is idle: a ``workbench.supervisor.template`` process whose parent is
    this process and which has no children (the first started, should there be several: one is all a process keeps)."""
    parents = {p.ppid for p in procs}
    idle = [p for p in procs
            if p.ppid == os.getpid() and "workbench.supervisor.template" in p.args and p.pid not in parents]
    return min(idle, key=lambda p: p.start) if idle else None


def new_processes(before: set[tuple[int, int]], tag: str | None = None) -> list[Proc]:
    """Project processes not in ``before`` (keys of :class:`Proc`), but for this process's own idle template."""
    procs = all_processes()
    exempt = own_idle_template(procs)
    return [p for p in project_processes(tag, procs) if p.key not in before and p != exempt]


def wait_gone(before: set[tuple[int, int]], tag: str | None = None, timeout: float = 3.0,
              poll: float = 0.05) -> list[Proc]:
    """Wait up to ``timeout`` s for the project processes that are not in ``before`` to end; returns those left."""
    deadline = time.monotonic() + timeout
    while True:
        left = new_processes(before, tag)
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(poll)


def kill(procs: list[Proc], timeout: float = 2.0) -> None:
    """SIGKILL each process that is still the one listed (same pid and start), then wait (bounded) until gone."""
    def current() -> set[tuple[int, int]]:
        return {p.key for p in all_processes() if p.args}

    for p in procs:
        if p.key in current():
            try:
                os.kill(p.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
    deadline = time.monotonic() + timeout
    while {p.key for p in procs} & current() and time.monotonic() < deadline:
        time.sleep(0.05)
