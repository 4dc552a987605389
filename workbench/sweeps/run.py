"""Papermill sweeps: a grid of parameter points, each executed as its own notebook run; resumable, isolated,
aggregated into one table.

Protocol of ``sweep(notebook, parameters, grid, out, jobs)``:
- **Points.** ``parameters`` (name -> list of values) gives the cartesian product; ``grid`` (a YAML file, a list
  of dicts or a dict of lists) gives a list of points (a list) or another product (a dict); with both, every grid
  point is combined with every product point. Names are checked against the parameters the notebook declares
  (``papermill.inspect_notebook``) and every value list must be non-empty — a bad input raises ``SweepError``
  before anything runs. The notebook's ``out`` parameter, if it declares one, is set by the sweep.
- **Ids.** Each point's id is its parameters in name order, slugged, plus 8 hex digits of the SHA-256 of their
  canonical JSON (``seed=0,strategy=shrink-1a2b3c4d``): stable across invocations and orderings of ``-p``.
  The point runs with ``out=DIR/<id>`` and leaves there the executed notebook, ``result.h5``, ``point.json``
  (its status) and ``point.log``.
- **Resume.** A point is complete when its ``point.json`` says ``completed``, which :mod:`workbench.sweeps.point`
  writes only after the notebook ran to its end and its ``result.h5`` (written atomically by
  ``RunResult.save``) is there — ``DIR/<id>/result.h5``, or for a notebook that saves several runs under
  ``out`` (``gossip_vs_allreduce``), one below it; such a point's row has no run summary.
  Every other point — never run, interrupted, or failed — runs on the next
  invocation (failed points are retried since a failure may have been an interruption; ``retry_failed=False``
  skips them). A point whose notebook fails is recorded as ``failed`` with a one-line error; the others go on.
- **Processes.** Points run in worker processes (``python -m workbench.sweeps.point``), each in a session of its
  own, at most ``jobs`` at a time; each worker owns one rank template, from which the kernels of its points fork
  their ranks (:mod:`workbench.template`: shared templates). On KeyboardInterrupt (Ctrl-C, or SIGTERM through the
  CLI) every worker is sent SIGTERM, kills its kernel, its template and the ranks and exits; anything still alive
  after a bounded wait is SIGKILLed (the workers' process trees are read from /proc). Then ``DIR/results.h5`` is
  written and the KeyboardInterrupt propagates. Executed notebooks and results are renamed into place, never
  half-written.
- **Jobs.** Default: ``max(1, min(cores, 2 * cores // world))`` where ``world`` is the largest ``world_size`` of
  the points (the point's value, else the notebook's default; 1 if the notebook has none): the points' ranks may
  oversubscribe the cores twice, and no more points than cores run at once — on 2 cores, 2 points at a time for
  1- or 2-rank points, 1 for 4-rank points. Measured here (8 points of ``permanent_faults``, 2 ranks): 1 job 116 s,
  2 jobs 86 s, 3 jobs 94 s; 4-rank points already keep both cores busy on their own.
- **Aggregation.** After every invocation (also an interrupted one) ``DIR/results.h5`` holds one row per point
  (:func:`load_sweep`).

This module holds :func:`sweep`, the entry point, and re-exports the public names of the modules that do the
work, one role each: :mod:`workbench.sweeps.plan` (the points, their ids, the notebook's parameters, ``sweep.json``),
:mod:`workbench.sweeps.workers` (worker processes, ``--jobs``, progress, stopping), :mod:`workbench.sweeps.point`
(the worker: one point's notebook run), :mod:`workbench.sweeps.table` (point status, the table ``results.h5``) and
:mod:`workbench.sweeps.slurm_array` (Slurm job arrays).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from workbench import provenance
from workbench.errors import SweepError
from workbench.sweeps.plan import (
    SWEEP_FILE,
    default_jobs,
    grid_points,
    notebook_parameters,
    parse_value,
    point_id,
    point_task,
    prepare,
)
from workbench.sweeps.point import LOG_FILE
from workbench.sweeps.slurm_array import ARRAY_FILE, SLURM_FILE, emit_slurm, run_array_task
from workbench.sweeps.table import TABLE_FILE, aggregate, is_complete, load_sweep, point_status
from workbench.sweeps.workers import STOP_WAIT_S, Scheduler, progress_enabled

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
    ``executed``, ``completed``, ``failed`` (ids) and ``skipped`` (already complete) of this invocation.
    Raises ``SweepError`` on bad input before running anything; KeyboardInterrupt after stopping every point.
    ``track``: an MLflow tracking URI or directory: once the points ran, the sweep is logged there as a parent run
    with a child per point (:mod:`workbench.sweeps.tracking`; ``TrackingUnavailable`` before anything runs when
    MLflow is not installed; a logging failure is a warning, in ``attrs["tracking"]`` and ``DIR/tracking.json``).
    """
    if timeout is not None and not 0 < timeout < float("inf"):
        raise SweepError(f"timeout must be a finite number of seconds > 0, not {timeout!r}")
    if track is not None:
        from workbench.tracking import require

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
        from workbench.sweeps.tracking import track_sweep

        record = track_sweep(track, directory, started, frame)
        frame = aggregate(directory)  # the table's attributes now hold the record
        frame.attrs["tracking"] = record
    frame.attrs.update(executed=list(done), completed=[k for k, v in done.items() if v["status"] == "completed"],
                       failed=[k for k, v in done.items() if v["status"] != "completed"], skipped=skipped)
    return frame
