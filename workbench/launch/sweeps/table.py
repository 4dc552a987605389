"""What a sweep ran: each point's status (``DIR/<id>/point.json``), whether it is complete, and the sweep's table
(``DIR/results.h5``, one row per point) built from the point directories.

Protocol: :mod:`workbench.launch.sweeps.run` (Resume, Aggregation).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from workbench.base.errors import ResultsError
from workbench.base.fallbacks import taken
from workbench.base.h5files import FileKindError, read_json
from workbench.launch.sweeps.plan import SWEEP_FILE, read_sweep_spec
from workbench.launch.sweeps.point import POINT_FILE, has_result
from workbench.results.provenance import columns as provenance_columns
from workbench.results.run_result import RESULT_FILE, RunResult, load_table, save_table

if TYPE_CHECKING:
    import pandas as pd

TABLE_FILE = "results.h5"
TRACKING_FILE = "tracking.json"  # the last MLflow logging of the sweep (workbench.launch.sweeps.tracking)


def point_status(directory: str | os.PathLike) -> dict[str, Any] | None:
    """A point directory's ``point.json``, or None if the point never started; a damaged one is None too (the point
    is run again), said: ``point_status_damaged``."""
    path = Path(directory) / POINT_FILE
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, NotADirectoryError):
        return None
    except (OSError, ValueError) as exc:
        taken("point_status_damaged", f"{path} cannot be read ({str(exc).splitlines()[0][:80]}): the point counts "
              "as not run, and a sweep runs it again")
        return None


def is_complete(directory: str | os.PathLike) -> bool:
    status = point_status(directory)
    if not status or status.get("status") != "completed" or not Path(status.get("notebook", "")).is_file():
        return False
    return "out" not in status.get("parameters", {}) or has_result(Path(directory))


def _row(directory: Path, pid: str, params: dict[str, Any]) -> dict[str, Any]:
    status = point_status(directory / pid)
    row: dict[str, Any] = {"point": pid, **params}
    state = "pending" if status is None or status.get("status") == "running" else status["status"]
    complete = is_complete(directory / pid)
    notebook = status.get("notebook") if status else None
    row.update(status="completed" if complete else ("failed" if state == "completed" else state),
               outcome="completed" if complete else ("pending" if state == "pending" else "error"),
               error=status.get("error") if status else None,
               point_wall_s=status.get("wall_s") if status else None,
               notebook=notebook if notebook and Path(notebook).is_file() else None, path=None)
    row.update(provenance_columns(status.get("provenance") if status else None))  # the run's own, if any, wins
    result_path = directory / pid / RESULT_FILE
    if complete and result_path.is_file():
        try:
            result = RunResult.load(result_path)
        except ResultsError as exc:
            row.update(status="failed", error=str(exc))
            return row
        for key, value in result.summary_row().items():
            row[f"result.{key}" if key in params or key in ("point", "status", "error", "path") else key] = value
        row["path"] = str(result_path)
    return row


def aggregate(directory: str | os.PathLike) -> pd.DataFrame:
    """Build the sweep's table from its point directories and write ``DIR/results.h5`` (atomically); its
    attribute ``tracking`` holds ``DIR/tracking.json`` (the sweep's last MLflow logging), if any."""
    import pandas as pd

    directory = Path(directory)
    spec = read_sweep_spec(directory)  # FileKindError (a ResultsError), one line: no sweep.json, or malformed
    rows = [_row(directory, p["id"], p["parameters"]) for p in spec["points"]]
    frame = pd.DataFrame(rows)
    tracking = directory / TRACKING_FILE
    try:
        extra = {"tracking": read_json(tracking, "tracking record")} if tracking.is_file() else {}
    except FileKindError as exc:  # a damaged record of the last MLflow logging does not stop the table
        taken("tracking_record_damaged", f"{exc}: the table is written without the record of the sweep's last "
              "MLflow logging")
        extra = {}
    save_table(frame, directory / TABLE_FILE, notebook=spec["notebook"], signature=_signature(directory),
               parameters=sorted({k for p in spec["points"] for k in p["parameters"]}), **extra)
    return frame


def _signature(directory: Path) -> list[list[Any]]:
    """(name, size, mtime) of the files the table is built from: a table with another signature is stale."""
    files = [directory / SWEEP_FILE, *directory.glob(f"*/{POINT_FILE}"), *directory.glob(f"*/{RESULT_FILE}")]
    found = []
    for path in sorted(files):
        try:
            stat = path.stat()
        except OSError:
            continue
        found.append([str(path.relative_to(directory)), stat.st_size, stat.st_mtime_ns])
    return found


def load_sweep(directory: str | os.PathLike) -> pd.DataFrame:
    """The sweep's table, one row per point: ``point`` (id), the parameters as columns, ``status`` (completed /
    failed / pending), ``outcome`` (the run's outcome; ``error`` for a failed notebook, ``pending`` for a point
    not run yet), ``error``, ``point_wall_s``, ``notebook`` and ``path`` (executed notebook and ``result.h5``),
    and the run's summary (``final_test_accuracy``, ``steps_redone_total``, ``samples_lost_total``,
    ``n_failures``, ``overhead_s``, ``config.*`` ...; a summary key equal to a parameter name gets a ``result.``
    prefix), and ``prov.*``: where the point came from (:mod:`workbench.results.provenance`) — its run's provenance, or
    for a point without a run (failed notebook) the point's own from ``point.json``; missing or NaN for points run
    before provenance was kept. Read from ``DIR/results.h5``; rebuilt from the points (and rewritten) when it is
    missing or stale — when any ``point.json`` or ``result.h5`` was added, removed or changed since it was written.
    """
    directory = Path(directory)
    table = directory / TABLE_FILE
    read_sweep_spec(directory)  # FileKindError (a ResultsError), one line: no sweep.json, or malformed
    if table.is_file():
        try:
            frame, attrs = load_table(table)
            if attrs.get("signature") == _signature(directory):
                return frame
        except ResultsError as exc:
            taken("sweep_table_damaged", f"{exc}: the sweep's table is rebuilt from its points")
    return aggregate(directory)
