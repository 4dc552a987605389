"""MLflow tracking of a sweep (``workbench sweep --track URI``, ``workbench.sweep(..., track=URI)``).

After the points ran and the table was written, the sweep is logged as one parent run (the swept parameters,
provenance, ``results.h5``, ``sweep.json``, ``report.html``) with one child run per point, logged as
:func:`workbench.results.tracking.log_result` does. Never raises: an error stops the logging with a
:class:`~workbench.results.tracking.TrackingWarning`, and the record goes to ``DIR/tracking.json``. Details:
docs/internals.md.
"""

from __future__ import annotations

import argparse
import json
import os
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from workbench.launch.sweeps.plan import SWEEP_FILE
from workbench.launch.sweeps.point import LOG_FILE, write_json
from workbench.launch.sweeps.table import TABLE_FILE, TRACKING_FILE, load_sweep, point_status
from workbench.results import provenance
from workbench.results.run_result import RESULT_FILE, RunResult
from workbench.results.tracking import (
    TrackingWarning,
    abandon,
    client,
    epoch_ms,
    experiment_id,
    failure_text,
    for_command_line,
    log_batches,
    log_result,
)

if TYPE_CHECKING:
    import pandas as pd


def track_sweep(uri: str, directory: str | os.PathLike, started: dict[str, Any],
                frame: pd.DataFrame | None = None) -> dict[str, Any]:
    """Log the sweep under ``directory`` (its table ``frame``, default :func:`load_sweep`) as a parent run with a
    child per point; returns the record also written to ``DIR/tracking.json``. ``started``: the provenance of the
    sweep's process at its start (a point that started before it is tagged ``skipped``: an earlier invocation's)."""
    directory = Path(directory)
    record: dict[str, Any] = {"uri": uri, "run_id": None, "experiment_id": None, "error": None, "points": {}}
    mlflow_client = None
    try:
        frame = load_sweep(directory) if frame is None else frame
        mlflow_client = client(uri)
        experiment = record["experiment_id"] = experiment_id(mlflow_client)
        spec = json.loads((directory / SWEEP_FILE).read_text())
        prov = provenance.finish(started)
        parent = mlflow_client.create_run(experiment, start_time=epoch_ms(prov["started_utc"]), run_name=directory.name,
                                          tags={**{f"prov.{k}": str(v) for k, v in prov.items()},
                                                "mlflow.source.name": spec["notebook"], "sweep": str(directory),
                                                **({"mlflow.source.git.commit": prov["commit"]}
                                                   if prov.get("commit") not in (None, "unknown") else {})})
        record["run_id"] = parent.info.run_id
        values: dict[str, list[Any]] = {}
        for p in spec["points"]:
            for k, v in p["parameters"].items():
                if v not in values.setdefault(k, []):
                    values[k].append(v)
        log_batches(mlflow_client, record["run_id"], params={
            "notebook": spec["notebook"], "points": str(len(frame)),
            **{f"sweep.{k}": json.dumps(v)[:6000] for k, v in values.items()}})
        parameters = {p["id"]: p["parameters"] for p in spec["points"]}
        for _, row in frame.iterrows():
            record["points"][row.point] = _log_point(mlflow_client, experiment, record["run_id"], directory,
                                                     row.point, parameters.get(row.point, {}), started["started_utc"])
        _attach(mlflow_client, record["run_id"], directory)
        done = bool(len(frame)) and set(frame.status) == {"completed"}
        mlflow_client.set_terminated(record["run_id"], "FINISHED" if done else "FAILED",
                                     end_time=epoch_ms(prov["ended_utc"]))
    except Exception as exc:  # noqa: BLE001 - tracking must never fail the sweep
        record["error"] = failure_text(exc)
        abandon(mlflow_client, record["run_id"])
        warnings.warn(f"MLflow tracking of the sweep to {uri} failed: {record['error']}", TrackingWarning,
                      stacklevel=2)
    write_json(directory / TRACKING_FILE, record)
    return record


def _log_point(mlflow_client: Any, experiment: str, parent: str, directory: Path, pid: str,
               parameters: dict[str, Any], since: str) -> str:
    """One child run for point ``pid``; returns its id. ``since``: the sweep's start (UTC ISO)."""
    point = directory / pid
    status = point_status(point) or {}
    skipped = (status.get("provenance") or {}).get("started_utc", "") < since  # ran in an earlier invocation
    params = {k: v for k, v in parameters.items() if k != "out"}
    notebook = Path(status["notebook"]) if status.get("notebook") else None
    artifacts = [p for p in (notebook, point / LOG_FILE) if p is not None and p.is_file()]
    own = point / RESULT_FILE
    if own.is_file():
        result = RunResult.load(own)
        run_id = log_result(mlflow_client, experiment, result, own, name=pid, parent=parent, params=params,
                            artifacts=artifacts)
        mlflow_client.set_tag(run_id, "skipped", str(skipped).lower())
    else:
        prov = status.get("provenance") or {}
        run = mlflow_client.create_run(
            experiment, start_time=epoch_ms(prov.get("started_utc")), run_name=pid,
            tags={"mlflow.parentRunId": parent, "skipped": str(skipped).lower(),
                  "outcome": "error" if status.get("status") == "failed" else str(status.get("status", "pending")),
                  "error": str(status.get("error"))[:5000], **{f"prov.{k}": str(v) for k, v in prov.items()}})
        run_id = run.info.run_id
        log_batches(mlflow_client, run_id, params={k: v if isinstance(v, str) else json.dumps(v)
                                                   for k, v in params.items()})
        for path in artifacts:
            mlflow_client.log_artifact(run_id, str(path))
        mlflow_client.set_terminated(run_id, "FINISHED" if status.get("status") == "completed" else "FAILED",
                                     end_time=epoch_ms(prov.get("ended_utc")))
    for below in sorted(point.rglob(RESULT_FILE)):
        if below != own:  # a notebook that saved several runs: each a child of the point's run
            log_result(mlflow_client, experiment, RunResult.load(below), below,
                       name=str(below.parent.relative_to(point)), parent=run_id)
    return run_id


def _attach(mlflow_client: Any, run_id: str, directory: Path) -> None:
    """The table, ``sweep.json`` and the sweep's report (built here) as the parent's artifacts."""
    from workbench.launch.sweeps.report import report

    try:
        page = report(directory)
    except Exception as exc:  # noqa: BLE001 - a figure that cannot be drawn must not lose the logging
        mlflow_client.set_tag(run_id, "report_error", failure_text(exc))
        page = None
    for path in (directory / TABLE_FILE, directory / SWEEP_FILE, page):
        if path is not None and Path(path).is_file():
            mlflow_client.log_artifact(run_id, str(path))


def tracked_command(args: argparse.Namespace, command: Callable[[argparse.Namespace], int]) -> int:
    """``workbench sweep`` (``command``) with ``--track``: the URI is checked before anything runs
    (``TrackingUnavailable``, exit 2), the sweep is logged once its points ran, whichever executor ran them, and
    one line tells the parent run or the failure. Not for ``--dry-run``, ``--emit`` or ``--point``."""
    track = for_command_line(args.track)
    if track is None or args.dry_run or args.emit or args.point is not None:
        return command(args)
    started = provenance.collect()
    code = command(args)
    record = track_sweep(track, args.out, started)
    if not record["error"]:  # a failure was one warning line already (for_command_line)
        print(f"tracked: MLflow run {record['run_id']} with {len(record['points'])} child runs at {record['uri']}")
    return code
