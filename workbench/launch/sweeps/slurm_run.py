"""A sweep run by Slurm (``workbench sweep ... --executor slurm``): the points that are not complete are submitted
as one job array (``sbatch``), waited for, and gathered into the table and the report when the array ends.

:func:`sweep_slurm` checks first (``sbatch``/``squeue``/``scancel`` on PATH, the input, no earlier array still
running), submits only the incomplete points' indices, waits on the points' ``point.json`` with ``squeue`` asked
only whether tasks remain, records a point that did not finish as ``failed`` with Slurm's reason, and writes the
table and the report. Ctrl-C cancels the array and waits for it to go; requeued tasks rerun their point from
scratch. Details: docs/sweeps-and-clusters.md and docs/internals.md.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from workbench.base import slurm_commands as slurm
from workbench.base.errors import SweepError
from workbench.launch.sweeps.plan import point_id, prepare
from workbench.launch.sweeps.point import POINT_FILE, write_json
from workbench.launch.sweeps.slurm_array import ARRAY_FILE, emit_slurm
from workbench.launch.sweeps.table import aggregate, is_complete, point_status
from workbench.launch.sweeps.workers import progress_enabled

if TYPE_CHECKING:
    import pandas as pd

JOB_FILE = "slurm.json"
POLL_S = 1.0  # points' files are read this often
SQUEUE_EVERY_S = 3.0  # squeue is asked this often whether the array has ended
# A task that ended other than CANCELLED may be requeued after its end (RequeueExit, a node failure, preemption,
# an operator's `scontrol requeue` of an ended task: its state goes FAILED -> PENDING): while a point is
# unfinished, such an end counts only after this long. scancel is final: a cancelled array ends at once.
REQUEUE_GRACE_S = 60.0
LOST_S = 300.0  # squeue silent this long: give up waiting
CANCEL_WAIT_S = 120.0  # after scancel: wait this long for the tasks to leave the queue (KillWait is 30 s by default)


def sweep_slurm(notebook: str | os.PathLike, parameters: Mapping[str, Iterable[Any]] | None = None, *,
                out: str | os.PathLike, grid: str | os.PathLike | list[dict[str, Any]] | dict[str, Any] | None = None,
                sbatch: Iterable[str] = (), jobs: int | None = None, retry_failed: bool = True,
                progress: bool | None = None, kernel_name: str | None = None,
                timeout: float | None = None) -> pd.DataFrame:
    """Run the incomplete points of the grid as a Slurm job array and wait for it (see the module docstring);
    return the table (:func:`~workbench.launch.sweeps.run.load_sweep`). ``sbatch``: options for every task (each item
    may hold several, split as a shell would: ``"--partition=cpu --time=10"``); ``jobs``: at most this many tasks at
    once (``%jobs``). The frame's ``attrs``: ``executed``, ``completed``, ``failed``, ``skipped`` (ids, as for a
    local sweep), ``job`` (the array's id, None when nothing was submitted) and ``report`` (its path or None)."""
    absent = slurm.missing_clients()
    if absent:
        raise SweepError(f"--executor slurm needs Slurm's client commands on PATH; not found: {', '.join(absent)}")
    if jobs is not None and jobs < 1:
        raise SweepError(f"jobs must be at least 1, not {jobs}")
    options = [o for item in sbatch for o in shlex.split(item)]
    notebook, directory, declared, points = prepare(notebook, parameters, grid, out, None)
    _refuse_if_running(directory)
    ids = [point_id(p) for p in points]
    indices, skipped = [], []
    for i, pid in enumerate(ids):
        status = point_status(directory / pid)
        if is_complete(directory / pid) or (not retry_failed and status and status.get("status") == "failed"):
            skipped.append(pid)
        else:
            indices.append(i)
    job, done = None, {}
    if indices:
        worlds = [p.get("world_size", declared.get("world_size", 1)) for p in points]
        want = max(w if isinstance(w, int) and w > 0 else 1 for w in worlds)
        script = emit_slurm(notebook, parameters, grid=grid, out=directory, kernel_name=kernel_name,
                            timeout=timeout, sbatch=options, cpus=_cap_cpus(want, options))
        before = {ids[i]: _started(directory / ids[i]) for i in indices}
        array = ",".join(map(str, indices)) + (f"%{jobs}" if jobs else "")
        try:
            with _signals_held():  # a Ctrl-C during sbatch lands once the job id is known, and cancels the array
                job = _submit(str(script), array)
                write_json(directory / JOB_FILE, {"job": job, "points": [ids[i] for i in indices],
                                                  "submitted": time.time()})
            task_of = {ids[i]: f"{job}_{i}" for i in indices}
            done = _wait(job, directory, before, task_of, progress_enabled(progress))
        except KeyboardInterrupt:
            if job is not None:
                _cancel(job)
            aggregate(directory)
            raise
        _record_unfinished(job, directory, {i: (ids[i], points[i]) for i in indices}, done)
    frame = aggregate(directory)
    report = None
    if (frame.status == "completed").any():
        from workbench.launch.sweeps.report import report as write_report

        report = write_report(directory)
    executed = [ids[i] for i in indices]
    frame.attrs.update(executed=executed, completed=[k for k in executed if done.get(k) == "completed"],
                       failed=[k for k in executed if done.get(k) not in ("completed", "preempted")],
                       preempted=[k for k in executed if done.get(k) == "preempted"], skipped=skipped, job=job,
                       report=str(report) if report else None)
    return frame


def _submit(script: str, array: str) -> str:
    try:
        return slurm.submit(script, [f"--array={array}"])
    except (slurm.SlurmError, slurm.SlurmUnavailable) as exc:
        raise SweepError(str(exc)) from None


@contextlib.contextmanager
def _signals_held() -> Iterator[None]:
    """SIGINT and SIGTERM wait (blocked in this thread, delivered on exit) while the block runs."""
    held = {signal.SIGINT, signal.SIGTERM}
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, held)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def _refuse_if_running(directory: Path) -> None:
    try:
        job = json.loads((directory / JOB_FILE).read_text())["job"]
    except (OSError, ValueError, KeyError):
        return
    active = slurm.active_tasks(str(job))
    if active is None:  # going on could run a second array over the same points
        raise SweepError(f"{directory} has a job array {job}, and squeue did not answer whether it still runs: try "
                         f"again, or check squeue -j {job} and remove {directory / JOB_FILE}")
    if active:
        raise SweepError(f"{directory} has its job array {job} still queued or running: wait for it to end, or "
                         f"scancel {job}")


def _cap_cpus(want: int, options: list[str]) -> int:
    """``want`` CPUs per task, at most the CPUs of the largest node of the partition the tasks go to (the one in
    ``options``, else the default one); ``want`` if ``sinfo`` does not tell."""
    partition = None
    for k, option in enumerate(options):
        if option.startswith("--partition="):
            partition = option.split("=", 1)[1]
        elif option in ("-p", "--partition") and k + 1 < len(options):
            partition = options[k + 1]
        elif option.startswith("-p") and len(option) > 2 and not option.startswith("--"):
            partition = option[2:]
    try:
        done = slurm.run(["sinfo", "-h", "-N", "-o", "%c %P"])
    except slurm.SlurmUnavailable:
        return want
    sizes = []
    for line in done.stdout.splitlines() if done.returncode == 0 else []:
        cpus, _, name = line.partition(" ")
        if cpus.isdigit() and (name.rstrip("*") == partition if partition else name.endswith("*")):
            sizes.append(int(cpus))
    return min(want, max(sizes)) if sizes else want


def _started(directory: Path) -> Any:
    status = point_status(directory)
    return status.get("started") if status else None


def _finished(directory: Path, before: Any) -> str | None:
    """``completed`` or ``failed`` when the point ran to an end since submission, else None."""
    status = point_status(directory)
    if status and status.get("status") in ("completed", "failed") and status.get("started") != before:
        return "completed" if status["status"] == "completed" and is_complete(directory) else "failed"
    return None


def _wait(job: str, directory: Path, before: dict[str, Any], task_of: dict[str, str],
          progress: bool) -> dict[str, str]:
    """Until Slurm lists no task of ``job`` queued or running: the bar follows the points' files. Returns id ->
    completed/failed of the points that finished, as their files say when the array has ended (a requeued task
    may run a point again after an attempt that failed). ``task_of``: point id -> its task (``J_i``)."""
    from tqdm.auto import tqdm

    bar = tqdm(total=len(before), unit="point", desc=f"sweep (Slurm job {job})", disable=not progress,
               dynamic_ncols=True)
    last_answer = asked = time.monotonic()
    queued, reported, ended_at = "", set(), None  # ended_at: the first of the polls in a row that found no task
    try:
        while True:
            done = _states(directory, before)
            for pid in (p for p, state in done.items() if state != "completed"):
                status = point_status(directory / pid) or {}
                if (pid, status.get("started")) not in reported:
                    reported.add((pid, status.get("started")))
                    bar.write(f"point {pid} failed: {status.get('error')}")
            bar.update(len(done) - bar.n)
            running = sum(1 for pid in before if pid not in done and _is_running(directory / pid, before[pid]))
            bar.set_postfix_str(f"{running} running" + queued, refresh=True)
            now = time.monotonic()
            if now - asked >= (POLL_S if ended_at is not None else SQUEUE_EVERY_S) or len(done) == len(before):
                asked = now
                states = slurm.task_states(job)
                if states is not None:
                    last_answer = now
                    tasks = {task: state for task, state in states.items() if slurm.is_active(state)}
                    pending = sorted(v for v in tasks.values() if v.startswith("PENDING"))
                    queued = f", {len(pending)} queued: {pending[0]}" if pending else ""  # why they wait, shown
                    if tasks:
                        ended_at = None
                    else:
                        # an end is seen twice in a row (a task between two states is not taken for one); an
                        # unfinished point's task may still come back unless it was cancelled (REQUEUE_GRACE_S)
                        final = all(states.get(task_of[pid], "CANCELLED").startswith("CANCELLED")
                                    for pid in before if pid not in done)
                        if ended_at is not None and (final or now - ended_at >= REQUEUE_GRACE_S):
                            return _states(directory, before)
                        ended_at = ended_at or now
                        if not final:  # on screen: why a sweep whose tasks have ended still waits
                            queued = f", tasks ended; waiting up to {REQUEUE_GRACE_S:g} s for a requeue"
                elif now - last_answer > LOST_S:
                    raise SweepError(f"squeue has not answered for {LOST_S:g} s; the array (job {job}) may still run: "
                                     f"squeue -j {job}, scancel {job}")
            time.sleep(POLL_S)
    finally:
        bar.close()


def _states(directory: Path, before: dict[str, Any]) -> dict[str, str]:
    """id -> completed/failed of the points that ran to an end since submission."""
    return {pid: state for pid, started in before.items()
            if (state := _finished(directory / pid, started)) is not None}


def _is_running(directory: Path, before: Any) -> bool:
    status = point_status(directory)
    return bool(status and status.get("status") == "running" and status.get("started") != before)


def _cancel(job: str) -> None:
    """scancel the array, then wait (bounded) until Slurm lists none of its tasks; a second Ctrl-C waits too."""
    main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN) if main else None
    try:
        try:
            slurm.cancel(job)
        except (slurm.SlurmError, slurm.SlurmUnavailable):
            pass
        deadline = time.monotonic() + CANCEL_WAIT_S
        while time.monotonic() < deadline:
            if slurm.active_tasks(job) == {}:
                return
            time.sleep(0.2)
    finally:
        if main and previous is not None:
            signal.signal(signal.SIGINT, previous)


def _record_unfinished(job: str, directory: Path, submitted: dict[int, tuple[str, dict[str, Any]]],
                       done: dict[str, str]) -> None:
    """A submitted point that did not finish: ``failed``, with one line saying how its task ended."""
    left = {i: (pid, params) for i, (pid, params) in submitted.items() if pid not in done}
    if not left:
        return
    outcomes = slurm.task_outcomes(job)
    for i, (pid, params) in left.items():
        log = _last_line(directory / f"slurm-{job}_{i}.log")
        status = point_status(directory / pid)
        if status and status.get("status") == "preempted":  # not requeued (in time): the next invocation resumes it
            done[pid] = "preempted"
            continue
        where = "while its point ran" if status and status.get("status") == "running" else "before its point ran"
        error = (f"Slurm task {job}_{i} ended {outcomes.get(i, 'without a state Slurm could report')} {where}"
                 + (f"; its log ends: {log}" if log else ""))
        if status is None:
            status = {"id": pid, "parameters": params, "notebook": ""}
        status.update(status="failed", error=error, finished=time.time())
        (directory / pid).mkdir(parents=True, exist_ok=True)
        write_json(directory / pid / POINT_FILE, status)
        done[pid] = "failed"


def _last_line(path: Path) -> str:
    try:
        lines = [x.strip() for x in path.read_text(errors="replace").splitlines() if x.strip()]
    except OSError:
        return ""
    return lines[-1][:200] if lines else ""


__all__ = ["ARRAY_FILE", "JOB_FILE", "sweep_slurm"]
