"""Papermill sweeps: a grid of parameter points, each executed as its own notebook run; resumable, isolated,
aggregated into one table.

``sweep(notebook, parameters, grid, out, jobs)``: points from the product of ``parameters`` and the ``grid``,
checked against the notebook's declared parameters; each point has a stable id and its own ``DIR/<id>``; a point
is complete once its ``point.json`` says so, every other point runs on the next invocation; points run in worker
processes, ``jobs`` at a time; ``DIR/results.h5`` holds one row per point after every invocation. The work is
done by the package's other modules (``plan``, ``workers``, ``point``, ``table``, ``slurm_array``). The protocol
in full: docs/sweeps-and-clusters.md and docs/internals.md.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from workbench.base.errors import SweepError
from workbench.launch.sweeps.plan import (
    SWEEP_FILE,
    default_jobs,
    grid_points,
    notebook_parameters,
    parse_value,
    point_id,
    point_task,
    prepare,
)
from workbench.launch.sweeps.point import LOG_FILE
from workbench.launch.sweeps.slurm_array import ARRAY_FILE, SLURM_FILE, emit_slurm, run_array_task
from workbench.launch.sweeps.table import TABLE_FILE, aggregate, is_complete, load_sweep, point_status
from workbench.launch.sweeps.workers import STOP_WAIT_S, Scheduler, progress_enabled
from workbench.results import provenance

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["ARRAY_FILE", "LOG_FILE", "SLURM_FILE", "STOP_WAIT_S", "SWEEP_FILE", "TABLE_FILE", "aggregate",
           "default_jobs", "emit_slurm", "grid_points", "is_complete", "load_sweep", "notebook_parameters",
           "parse_value", "point_id", "point_status", "run_array_task", "sweep"]


def sweep(notebook: str | os.PathLike, parameters: Mapping[str, Iterable[Any]] | None = None, *,
          out: str | os.PathLike, grid: str | os.PathLike | list[dict[str, Any]] | dict[str, Any] | None = None,
          jobs: int | None = None, retry_failed: bool = True, progress: bool | None = None,
          kernel_name: str | None = None, timeout: float | None = None,
          track: str | os.PathLike | None = None) -> pd.DataFrame:
    """Run ``notebook`` at every point of the grid that is not complete under ``out``; return :func:`load_sweep`.

    ``progress``: a tqdm bar (``tqdm.auto``: a widget in Jupyter) of points, with the cells of the running points;
    default on in a terminal or a Jupyter kernel. ``timeout``: seconds per cell. The frame's ``attrs`` hold
    ``executed``, ``completed``, ``failed``, ``preempted`` (ids) and ``skipped`` (already complete) of this
    invocation. A SIGUSR1 is notice of preemption: the running points stop at kept checkpoints and end
    ``preempted``, no other starts, and the next invocation resumes them (:mod:`workbench.launch.sweeps.requeue`).
    Raises ``SweepError`` on bad input before running anything; KeyboardInterrupt after stopping every point.
    ``track``: an MLflow tracking URI or directory: once the points ran, the sweep is logged there as a parent run
    with a child per point (:mod:`workbench.launch.sweeps.tracking`; ``TrackingUnavailable`` before anything runs when
    MLflow is not installed; a logging failure is a warning, in ``attrs["tracking"]`` and ``DIR/tracking.json``).
    """
    if timeout is not None and not 0 < timeout < float("inf"):
        raise SweepError(f"timeout must be a finite number of seconds > 0, not {timeout!r}")
    if track is not None:
        from workbench.results.tracking import require

        track = require(track)
    started = provenance.collect()
    notebook, directory, declared, points = prepare(notebook, parameters, grid, out, jobs)
    tasks, skipped = [], []
    for p in points:
        pid = point_id(p)
        status = point_status(directory / pid)
        if is_complete(directory / pid) or (not retry_failed and status and status.get("status") == "failed"):
            skipped.append(pid)
            continue
        tasks.append(point_task(directory, notebook, declared, p, kernel_name, timeout))
    jobs = min(jobs or default_jobs(points, declared), max(len(tasks), 1))
    done: dict[str, dict[str, Any]] = {}
    try:
        if tasks:
            Scheduler(tasks, jobs, progress_enabled(progress)).run(done)
    finally:
        frame = aggregate(directory)
    if track is not None:
        from workbench.launch.sweeps.tracking import track_sweep

        record = track_sweep(track, directory, started, frame)
        frame = aggregate(directory)  # the table's attributes now hold the record
        frame.attrs["tracking"] = record
    frame.attrs.update(executed=list(done), completed=[k for k, v in done.items() if v["status"] == "completed"],
                       failed=[k for k, v in done.items() if v["status"] not in ("completed", "preempted")],
                       preempted=[k for k, v in done.items() if v["status"] == "preempted"], skipped=skipped)
    return frame
