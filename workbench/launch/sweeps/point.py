"""A sweep worker: executes sweep points with papermill, one after another, in this process.

Started by :func:`workbench.launch.sweeps.run.sweep` as ``python -m workbench.launch.sweeps.point --events FD
--parent PID``, one worker per job slot, with one shared rank template (:func:`workbench.supervisor.template.share`)
for its whole life.
Stdin: one JSON line per point; FD: JSON line events (``start``, ``cell``, ``progress``, ``done``); per point, in
its directory: ``point.json``, the executed notebook and ``point.log``. After each point everything the kernel left
is killed; on SIGTERM the worker kills its whole tree and exits, the point staying ``running``. Details:
docs/internals.md.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

from workbench.base.h5files import write_text
from workbench.launch.sweeps.requeue import CHECKPOINT_FILE, NOTICE_FILE, PREEMPTED_DIR, PROGRESS_FILE
from workbench.results import provenance
from workbench.results.outdir import clear as clear_run
from workbench.results.run_result import RESULT_FILE
from workbench.supervisor.template import SHARED_VAR, UNSHARED, Template, TemplateError, share
from workbench.supervisor.template_server import code_fingerprint

POINT_FILE = "point.json"
LOG_FILE = "point.log"
ENGINE = "workbench_sweep"


def write_json(path: Path, data: dict[str, Any]) -> None:
    """Write JSON atomically (temporary file, then rename; none left behind on failure, which is an
    :class:`~workbench.base.h5files.OutputError` naming ``path``)."""
    write_text(path, json.dumps(data, indent=1, default=str))


def descendants(pid: int) -> list[tuple[int, int]]:
    """(pid, start time) of every process below ``pid``, read from /proc (Linux); children before grandchildren."""
    children: dict[int, list[tuple[int, int]]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append((int(entry), int(fields[19])))
    found, frontier = [], [pid]
    while frontier:
        below = [c for p in frontier for c in children.get(p, [])]
        found.extend(below)
        frontier = [c for c, _ in below]
    return found


def has_result(directory: Path) -> bool:
    """``directory/result.h5`` exists — or, for a notebook that saves several runs under ``out`` (e.g. one per
    parallel mode), a ``result.h5`` somewhere below it."""
    return (directory / RESULT_FILE).is_file() or next(directory.rglob(RESULT_FILE), None) is not None


def alive(pid: int, started: int) -> bool:
    """The process (pid, start time) exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return False
    return fields[0] not in ("Z", "X") and int(fields[19]) == started


def kill_all(processes: list[tuple[int, int]], wait: float = 5.0) -> list[tuple[int, int]]:
    """SIGKILL each (pid, start time) still alive (a reused pid is left alone), then wait up to ``wait`` seconds
    until they are gone; returns those still alive (none, unless a process is stuck in the kernel)."""
    for pid, started in processes:
        if alive(pid, started):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
    deadline = time.monotonic() + wait
    left = [p for p in processes if alive(*p)]
    while left and time.monotonic() < deadline:
        time.sleep(0.01)
        left = [p for p in left if alive(*p)]
    return left


class Worker:
    def __init__(self, events_fd: int) -> None:
        self.events = os.fdopen(events_fd, "w", buffering=1)
        self.emitting = threading.Lock()
        self.current_tmp: Path | None = None
        self.current_dir: Path | None = None
        self.noticed = False  # the point running has notice of preemption (SIGUSR1)
        self.template: Template | None = None
        self.unshared: str | None = None  # why no template could be shared (its kernels start their own)

    def share_template(self) -> None:
        """Start the shared rank template, or a new one if it died or workbench's files changed since it started
        (its ranks would run the old code); the kernels started from now on get its address (where none can be
        shared: why, and they start their own, saying so)."""
        if self.template is not None and self.template.alive and self.template.code == code_fingerprint():
            return
        if self.template is not None:
            self.template.close()
        try:
            self.template, self.unshared = share(), None
            os.environ[SHARED_VAR] = self.template.address  # type: ignore[assignment]
        except TemplateError as exc:  # every kernel starts a template of its own: said by point.json and each run
            self.template, self.unshared = None, f"the sweep worker could not share a rank template: {exc}"
            os.environ[SHARED_VAR] = f"{UNSHARED} {self.unshared}"

    def leftovers(self) -> list[tuple[int, int]]:
        """Every process below this worker but its shared template."""
        keep = self.template.proc.pid if self.template is not None and self.template.proc is not None else None
        return [p for p in descendants(os.getpid()) if p[0] != keep]

    def template_cpu(self) -> tuple[Template | None, float | None]:
        return self.template, self.template.children_cpu() if self.template is not None else None

    def emit(self, **event: Any) -> None:
        with self.emitting:  # the progress relay's thread emits too
            self.events.write(json.dumps(event) + "\n")

    def terminate(self, signum: int, frame: object) -> None:
        kill_all(descendants(os.getpid()))
        if self.current_tmp is not None:
            self.current_tmp.unlink(missing_ok=True)
        os._exit(128 + signum)

    def notice(self, signum: int, frame: object) -> None:
        """The point's runs are told through its ``.notice`` file (workbench.launch.sweeps.requeue): each stops at a
        checkpoint kept for the point's next attempt."""
        if self.current_dir is not None and not self.noticed:
            self.noticed = True
            write_json(self.current_dir / NOTICE_FILE, {"time": time.time()})

    def serve(self, parent: int | None = None) -> None:
        signal.signal(signal.SIGTERM, self.terminate)
        signal.signal(signal.SIGINT, self.terminate)
        signal.signal(signal.SIGUSR1, self.notice)
        _die_with_parent(parent)
        self.share_template()
        _register_engine(self)
        try:
            for line in sys.stdin:
                if line.strip():
                    self.run_point(json.loads(line))
        finally:
            if self.template is not None:
                self.template.close()

    def run_point(self, task: dict[str, Any]) -> None:
        import papermill
        from papermill.exceptions import PapermillExecutionError

        directory = Path(task["dir"])
        directory.mkdir(parents=True, exist_ok=True)
        executed = directory / Path(task["notebook"]).name
        tmp = directory / f".running-{executed.name}"
        for stale in (directory / RESULT_FILE, directory / PROGRESS_FILE, executed, tmp, *directory.glob(".*.tmp")):
            stale.unlink(missing_ok=True)
        clear_run(directory)  # an earlier attempt's checkpoints and logs: its run into out=DIR is not refused
        (directory / NOTICE_FILE).unlink(missing_ok=True)  # a notice was for the attempt it reached
        os.environ[provenance.NOTEBOOK_VAR] = task["notebook"]  # the kernel inherits it: its runs record it
        self.current_dir, self.noticed = directory, False
        seed = task["parameters"].get("seed")
        status = {"id": task["id"], "parameters": task["parameters"], "notebook": str(executed),
                  "status": "running", "error": None, "started": time.time(), "wall_s": None,
                  "provenance": provenance.collect(seed if isinstance(seed, int) else None)}
        write_json(directory / POINT_FILE, status)
        self.share_template()
        self.emit(id=task["id"], event="start")
        self.current_id, self.current_tmp = task["id"], tmp
        log = open(directory / LOG_FILE, "ab", buffering=0)
        saved = os.dup(1), os.dup(2)
        os.dup2(log.fileno(), 1)  # the kernel inherits these: its stray output lands in point.log
        os.dup2(log.fileno(), 2)
        t0 = time.monotonic()
        cpu0, (template0, reaped0) = _cpu(), self.template_cpu()
        error = None
        relay = _ProgressRelay(self, task["id"], directory / PROGRESS_FILE)
        try:
            papermill.execute_notebook(task["notebook"], str(tmp), parameters=task["parameters"], engine_name=ENGINE,
                                       kernel_name=task.get("kernel_name"), progress_bar=False,
                                       execution_timeout=task.get("timeout"))
        except PapermillExecutionError as exc:
            error = f"{exc.ename}: {exc.evalue}".splitlines()[0] + f" (cell [{exc.exec_count}])"
        except Exception as exc:  # kernel died, timeout, bad kernel name ...: this point fails, the next goes on
            error = f"{type(exc).__name__}: {exc}".splitlines()[0]
        finally:
            relay.stop()
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            for fd in saved:
                os.close(fd)
            log.close()
            kill_all(self.leftovers())  # nothing of this point outlives it (the template waits for the next)
            if tmp.exists():
                os.replace(tmp, executed)
            self.current_tmp = None
        if error is None and "out" in task["parameters"] and not has_result(directory):
            error = f"the notebook completed but wrote no {RESULT_FILE} under out={task['parameters']['out']}"
        self.current_dir = None
        state, error = _preempted(directory, error) if self.noticed else ("failed" if error else "completed", error)
        if state == "completed":
            shutil.rmtree(directory / PREEMPTED_DIR, ignore_errors=True)  # stale: no run of this notebook took it
        cpu1, (template1, reaped1) = _cpu(), self.template_cpu()
        # the kernel's ranks are the template's children: their CPU comes from it (a template that died meanwhile
        # was reaped by this worker, its ranks' CPU with it)
        ranks_cpu = reaped1 - reaped0 if template1 is template0 and None not in (reaped0, reaped1) else 0.0
        status.update(status=state, error=error, wall_s=round(time.monotonic() - t0, 3),
                      finished=time.time(), worker_cpu_s=round(cpu1[0] - cpu0[0], 3),
                      kernel_cpu_s=round(cpu1[1] - cpu0[1] + ranks_cpu, 3),
                      rank_template={"pid": template1.pid, "address": template1.address}
                      if template1 is not None and template1.alive else None,
                      fallbacks=[{"what": "template_unshared", "detail": self.unshared}] if self.unshared else [],
                      provenance=provenance.finish(status["provenance"]))
        write_json(directory / POINT_FILE, status)
        self.emit(id=task["id"], event="done", status=status["status"], error=error)


class _ProgressRelay:
    """Emits a ``progress`` event with each new line of the point's progress file (a campaign's runs done, its
    estimated finish: :class:`workbench.campaigns.reproduce.common.Progress`), polled every ``every`` seconds."""

    def __init__(self, worker: Worker, pid: str, path: Path, every: float = 1.0) -> None:
        self.worker, self.pid, self.path, self.every = worker, pid, path, every
        self.stopped = threading.Event()
        self.last = ""
        self.thread = threading.Thread(target=self._poll, name="progress-relay", daemon=True)
        self.thread.start()

    def _poll(self) -> None:
        while not self.stopped.wait(self.every):
            self._relay()

    def _relay(self) -> None:
        try:
            line = self.path.read_text().strip()
        except OSError:
            return
        if line and line != self.last:
            self.last = line
            self.worker.emit(id=self.pid, event="progress", line=line)

    def stop(self) -> None:
        self.stopped.set()
        self.thread.join(timeout=5)
        self._relay()  # the last line, written after the last poll


def _preempted(directory: Path, error: str | None) -> tuple[str, str | None]:
    """The point's state after a notice: ``preempted`` when the notice stopped runs (at a checkpoint kept for its
    next attempt, or before they trained), whatever the notebook's later cells made of them; else as it ended."""
    stopped = [d for d in (directory / PREEMPTED_DIR).glob("*") if d.is_dir()]
    if stopped:
        kept = sum((d / CHECKPOINT_FILE).is_file() for d in stopped)
        return "preempted", (f"preempted with notice: {len(stopped)} run(s) stopped, {kept} at a step boundary "
                             f"kept in {PREEMPTED_DIR}/; the point resumes from there when it runs again")
    return ("failed" if error else "completed"), error


def _cpu() -> tuple[float, float]:
    """CPU seconds of this worker, and of its finished descendants (the kernel and the ranks it reaped)."""
    import resource

    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, children.ru_utime + children.ru_stime


def _register_engine(worker: Worker) -> None:
    """papermill's nbclient engine, telling the sweep when each cell starts (the notebook-aware progress)."""
    from papermill.engines import NBClientEngine, papermill_engines

    class Engine(NBClientEngine):
        @classmethod
        def execute_managed_notebook(cls, nb_man: Any, kernel_name: str, **kwargs: Any) -> Any:
            cell_start = nb_man.cell_start
            total = len(nb_man.nb.cells)

            def on_cell_start(cell: Any, cell_index: int | None = None, **kw: Any) -> Any:
                worker.emit(id=worker.current_id, event="cell", index=cell_index, total=total)
                return cell_start(cell, cell_index=cell_index, **kw)

            nb_man.cell_start = on_cell_start
            return super().execute_managed_notebook(nb_man, kernel_name, **kwargs)

    papermill_engines.register(ENGINE, Engine)


def _die_with_parent(parent: int | None) -> None:
    """SIGTERM this worker when the sweep's process dies, even by SIGKILL (Linux parent-death signal)."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if parent is not None and os.getppid() != parent:  # the parent died before prctl
        os.kill(os.getpid(), signal.SIGTERM)


def main(argv: list[str] | None = None) -> None:
    """``python -m workbench.launch.sweeps.point --events FD [--parent PID]``, started by a sweep; bad arguments are one
    line, exit 2."""
    from workbench.base.entry import OneLineParser, open_fd

    parser = OneLineParser(prog="python -m workbench.launch.sweeps.point", description="A sweep's worker process.")
    parser.add_argument("--events", type=open_fd, required=True, metavar="FD", help="the pipe events are written to")
    parser.add_argument("--parent", type=int, metavar="PID", help="the sweep's process (the worker ends with it)")
    args = parser.parse_args(argv)
    Worker(args.events).serve(args.parent)


if __name__ == "__main__":
    main()
