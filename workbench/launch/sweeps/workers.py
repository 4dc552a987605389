"""How a sweep's points run: worker processes (``python -m workbench.launch.sweeps.point``), at most ``jobs`` at a time,
fed one point after another, with a progress bar of points and cells; stopped and reaped on interruption.

Protocol: :mod:`workbench.launch.sweeps.run` (Processes); the worker's side: :mod:`workbench.launch.sweeps.point`.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from workbench.launch.sweeps.point import POINT_FILE, descendants, kill_all, write_json
from workbench.launch.sweeps.table import point_status
from workbench.results.provenance import COMMAND_VAR, command

STOP_WAIT_S = 10.0


def progress_enabled(progress: bool | None) -> bool:
    """``progress`` if given, else whether this runs in a Jupyter kernel or a terminal."""
    if progress is not None:
        return progress
    in_kernel = "ipykernel" in sys.modules and getattr(sys.modules.get("IPython"), "get_ipython", lambda: None)()
    return bool(in_kernel) or sys.stderr.isatty()


class _WorkerProc:
    """One ``python -m workbench.launch.sweeps.point`` process and the thread reading its events."""

    def __init__(self, events: queue.Queue) -> None:
        read, write = os.pipe()
        # the sweep's command line: the provenance of its points and of their runs (workbench.results.provenance)
        env = {**os.environ, "PYTHONUNBUFFERED": "1", COMMAND_VAR: command()}
        self.proc = subprocess.Popen([sys.executable, "-m", "workbench.launch.sweeps.point", "--events", str(write),
                                      "--parent", str(os.getpid())],
                                     stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                     pass_fds=(write,), start_new_session=True, env=env, text=True)
        os.close(write)
        self.task: dict[str, Any] | None = None
        self.running = False  # it said ``start`` for its task: its notice handler is in place
        self.thread = threading.Thread(target=self._read, args=(read, events), daemon=True)
        self.thread.start()

    def _read(self, fd: int, events: queue.Queue) -> None:
        with os.fdopen(fd) as stream:
            for line in stream:
                try:
                    events.put((self, json.loads(line)))
                except ValueError:
                    continue
        events.put((self, {"event": "exit"}))

    def submit(self, task: dict[str, Any]) -> None:
        self.task = task
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(json.dumps(task) + "\n")
            self.proc.stdin.flush()
        except OSError:  # the worker died: its reader reports the exit, and the point is recorded as failed
            pass

    def close(self) -> None:
        try:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
        except OSError:
            pass

    def stop(self) -> None:
        """SIGTERM: the worker kills its kernel and the kernel's ranks, and exits."""
        if self.proc.poll() is None:
            try:
                os.kill(self.proc.pid, signal.SIGTERM)
            except OSError:
                pass


class Scheduler:
    """Runs tasks (:func:`~workbench.launch.sweeps.plan.point_task`) on ``jobs`` workers; :meth:`run` fills ``done``
    (id -> status and error) as points finish, so an interrupted run still tells what finished."""

    def __init__(self, tasks: list[dict[str, Any]], jobs: int, progress: bool) -> None:
        self.tasks = list(tasks)
        self.jobs = jobs
        self.progress = progress
        self.events: queue.Queue = queue.Queue()
        self.workers: list[_WorkerProc] = []
        self.cells: dict[str, str] = {}
        self.noticed = False  # notice of preemption (SIGUSR1): no point starts from now on

    def notice(self, signum: int = signal.SIGUSR1, frame: object = None) -> None:
        """Notice of preemption (Slurm's ``--signal=B:USR1@T``): the points running stop their runs at a kept
        checkpoint (:mod:`workbench.launch.sweeps.requeue`), and no further point starts."""
        self.noticed = True
        for w in self.workers:
            if w.running and w.task is not None and w.proc.poll() is None:
                try:
                    os.kill(w.proc.pid, signal.SIGUSR1)
                except OSError:
                    pass

    def run(self, done: dict[str, dict[str, Any]]) -> None:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(self.tasks), unit="point", desc="sweep", disable=not self.progress, dynamic_ncols=True)
        pending = list(self.tasks)
        main = threading.current_thread() is threading.main_thread()
        previous = signal.signal(signal.SIGUSR1, self.notice) if main else None
        try:
            self.workers = [_WorkerProc(self.events) for _ in range(min(self.jobs, len(pending)))]
            for w in self.workers:
                w.submit(pending.pop(0))
            while len(done) < len(self.tasks) and not (self.noticed and all(w.task is None for w in self.workers)):
                try:
                    worker, event = self.events.get(timeout=0.5)
                except queue.Empty:
                    continue
                kind = event["event"]
                if kind == "start":
                    worker.running = True
                    if self.noticed:  # the notice came while it was starting the point
                        self.notice()
                elif kind == "cell":
                    self.cells[event["id"]] = f"{event['index'] + 1}/{event['total']}"
                elif kind == "progress":  # a campaign's runs done and estimated finish, on the terminal
                    bar.write(f"{event['id'][:40]}: {event['line']}")
                elif kind in ("done", "exit") and worker.task is not None:
                    task, worker.task, worker.running = worker.task, None, False
                    self.cells.pop(task["id"], None)
                    if kind == "exit":  # the worker died under a point: record it, replace the worker
                        event = {"status": "failed", "error": f"worker exited with {worker.proc.wait()}"}
                        _record_failure(task, event["error"])
                        self.workers.remove(worker)
                        if pending:
                            worker = _WorkerProc(self.events)
                            self.workers.append(worker)
                    done[task["id"]] = {"status": event["status"], "error": event.get("error")}
                    bar.update(1)
                    if event["status"] != "completed":
                        bar.write(f"point {task['id']} {event['status']}: {event.get('error')}")
                    if pending and not self.noticed:
                        worker.submit(pending.pop(0))
                    else:
                        worker.close()
                elif kind == "exit":
                    if worker in self.workers:
                        self.workers.remove(worker)
                bar.set_postfix_str("  ".join(f"{k[:40]}: cell {v}" for k, v in self.cells.items()), refresh=False)
                bar.refresh()
        finally:
            if previous is not None:
                signal.signal(signal.SIGUSR1, previous)
            bar.close()
            self.shutdown()

    def shutdown(self) -> None:
        """Close every worker; a worker still busy (interrupted sweep) is stopped: SIGTERM, bounded wait, SIGKILL
        of its remaining process tree."""
        main = threading.current_thread() is threading.main_thread()
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN) if main else None  # a 2nd Ctrl-C waits for us
        try:
            self._shutdown()
        finally:
            if main and previous is not None:
                signal.signal(signal.SIGINT, previous)

    def _shutdown(self) -> None:
        busy = [w for w in self.workers if w.proc.poll() is None]
        trees = {w: descendants(w.proc.pid) for w in busy}
        for w in busy:
            w.close()
            if w.task is not None:
                w.stop()
        deadline = time.monotonic() + STOP_WAIT_S
        for w in busy:
            try:
                w.proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                trees[w] += descendants(w.proc.pid)
                try:
                    os.killpg(w.proc.pid, signal.SIGKILL)
                except OSError:
                    pass
                w.proc.wait()
            kill_all(trees[w])
        for w in self.workers:
            w.thread.join(timeout=2)


def _record_failure(task: dict[str, Any], error: str) -> None:
    directory = Path(task["dir"])
    status = point_status(directory) or {"id": task["id"], "parameters": task["parameters"],
                                         "notebook": str(directory / Path(task["notebook"]).name)}
    status.update(status="failed", error=error, finished=time.time())
    directory.mkdir(parents=True, exist_ok=True)
    write_json(directory / POINT_FILE, status)
