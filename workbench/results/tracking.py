"""MLflow tracking of runs (optional: ``pip install -e .[tracking]``: ``mlflow-skinny``, SQLAlchemy, Alembic).

``workbench run --track URI`` and ``workbench.run(..., track=URI)`` log the run as one MLflow run **after it ended**,
from its :class:`~workbench.results.run_result.RunResult`: parameters, per-step metrics, summary figures, tags (outcome,
failures,
provenance) and artifacts. ``URI`` is an MLflow tracking URI (``sqlite:///mlflow.db`` offline) or a plain directory.
Logging never fails the run: an error ends it with a :class:`TrackingWarning` recorded in the summary; without MLflow,
:func:`require` raises :class:`TrackingUnavailable`. Sweeps: :mod:`workbench.launch.sweeps.tracking`. Details:
docs/internals.md.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import sys
import tempfile
import warnings
from collections.abc import Iterable
from datetime import datetime
from pathlib import Path
from typing import Any

from workbench.base.errors import WorkbenchError
from workbench.results import clock
from workbench.results import summary as summaries
from workbench.results.run_result import METRIC_COLUMNS, RunResult

INSTALL = "pip install -e .[tracking]"
DEFAULT_EXPERIMENT = "Default"  # MLflow's own default experiment
BATCH = 1000  # MLflow's LogBatch limits: 1,000 metrics, 100 params, 100 tags, 1,000 entities a request
_HTTP_DEFAULTS = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "1", "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
                  "MLFLOW_HTTP_REQUEST_TIMEOUT": "10"}
_COMMAND_LINE = False  # set by for_command_line: say on stderr where a run was logged
FAILURE_METRICS = (*clock.TIME_FIGURES, *(clock.PREFIX + name for name in clock.TIME_FIGURES))
_SUMMARY_METRICS = ("final_test_accuracy", "baseline_accuracy", "wall_s", "train_s", "overhead_s", "overhead_pct",
                    "rank_train_s", "rank_overhead_s", "rank_overhead_pct", "steps_completed", "steps_redone_total",
                    "samples_lost_total", "generations", "world_size_final",
                    "checkpoints", "flips", "detections")


class TrackingUnavailable(WorkbenchError):
    """MLflow is not installed (the ``tracking`` extra), or the tracking URI is empty."""


class TrackingWarning(UserWarning):
    """Logging to MLflow failed; the run itself is unaffected (its summary's ``tracking`` says what failed)."""


# the URI schemes MLflow's tracking store registry reads (file and the SQLAlchemy databases; REST; Databricks)
_SCHEMES = ("file", "sqlite", "postgresql", "mysql", "mssql", "http", "https", "databricks", "databricks-uc", "uc")


def require(uri: str | os.PathLike) -> str:
    """The tracking URI to use (a plain path made an absolute ``file://`` URI), after checking — without importing
    it — that MLflow can be imported. Raises :class:`TrackingUnavailable` (one line, with the install command)."""
    text = os.fspath(uri).strip()
    if not text:
        raise TrackingUnavailable("--track needs a tracking URI or a directory, e.g. --track sqlite:///mlflow.db")
    try:
        found = importlib.util.find_spec("mlflow") is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        raise TrackingUnavailable(f"--track needs MLflow, which is not installed: {INSTALL}")
    if "://" in text or text.startswith(("file:", "databricks")) or ":" in text.split("/", 1)[0]:
        scheme = text.split(":", 1)[0].lower()
        if scheme.split("+", 1)[0] not in _SCHEMES:  # "postgresql+psycopg2" is postgresql's
            raise TrackingUnavailable(f"--track: {text!r} is no tracking URI MLflow reads: allowed a directory "
                                      f"(./mlruns) or a URI of {', '.join(s + ':' for s in _SCHEMES)}")
        return text  # a URI MLflow reads (file:, sqlite:, http(s):, databricks, ...) as it is
    return Path(text).expanduser().resolve().as_uri()


def for_command_line(uri: str | None) -> str | None:
    """:func:`require` for a command: None stays None; a :class:`TrackingWarning` is shown as one line on stderr,
    ``workbench: warning: ...`` (other warnings as before), and a logged run as ``workbench: tracked: ...``."""
    if uri is None:
        return None
    previous = warnings.showwarning

    def show(message: Warning | str, category: type[Warning], *args: Any, **kwargs: Any) -> None:
        if issubclass(category, TrackingWarning):
            print(f"workbench: warning: {message}", file=sys.stderr, flush=True)
        else:
            previous(message, category, *args, **kwargs)

    warnings.showwarning = show
    warnings.simplefilter("always", TrackingWarning)
    global _COMMAND_LINE
    _COMMAND_LINE = True
    return require(uri)


def client(uri: str) -> Any:
    """An ``MlflowClient`` for ``uri`` (imports MLflow), with the process-wide settings of the module docstring."""
    for key, value in _HTTP_DEFAULTS.items():
        os.environ.setdefault(key, value)
    os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")  # stdout is the command's (--json)
    if uri.startswith("file:"):
        os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    from mlflow import MlflowClient

    return MlflowClient(tracking_uri=uri)


def experiment_id(mlflow_client: Any) -> str:
    """``$MLFLOW_EXPERIMENT_ID`` if set, else the id of ``$MLFLOW_EXPERIMENT_NAME`` or, unset, of MLflow's
    ``Default`` experiment (where ``mlflow.search_runs()`` looks by default); created if missing."""
    if os.environ.get("MLFLOW_EXPERIMENT_ID"):
        return os.environ["MLFLOW_EXPERIMENT_ID"]
    name = os.environ.get("MLFLOW_EXPERIMENT_NAME") or DEFAULT_EXPERIMENT
    found = mlflow_client.get_experiment_by_name(name)
    if found is not None:
        return found.experiment_id
    try:
        return mlflow_client.create_experiment(name)
    except Exception:  # noqa: BLE001 - another process created it meanwhile
        return mlflow_client.get_experiment_by_name(name).experiment_id


def track_result(uri: str, result: RunResult, out: str | os.PathLike | None = None) -> dict[str, Any]:
    """Log ``result`` as an MLflow run; record ``{uri, run_id, experiment_id, error}`` in its summary under
    ``tracking`` (and save it again under ``out``, when given). Never raises: a failure is a
    :class:`TrackingWarning` and the record's ``error``."""
    record: dict[str, Any] = {"uri": uri, "run_id": None, "experiment_id": None, "error": None}
    mlflow_client = None
    try:
        mlflow_client = client(uri)
        record["experiment_id"] = experiment_id(mlflow_client)
        with tempfile.TemporaryDirectory(prefix="workbench-track-") as scratch:
            if result.path is None or not Path(result.path).is_file():  # a run without out: its file, for MLflow
                RunResult(result.config, result.metrics, result.events, result.failures, dict(result.summary),
                          provenance=result.provenance, format=result.format).save(scratch)
                artifact = Path(scratch) / "result.h5"
            else:
                artifact = Path(result.path)
            log_result(mlflow_client, record["experiment_id"], result, artifact, record=record)
    except Exception as exc:  # noqa: BLE001 - tracking must never fail the run
        record["error"] = failure_text(exc)
        abandon(mlflow_client, record["run_id"])
        warnings.warn(f"MLflow tracking to {uri} failed: {record['error']}", TrackingWarning, stacklevel=2)
    summaries.tracked(result.summary, record)
    if out is not None:
        result.save(out)
    if _COMMAND_LINE and not record["error"]:
        print(f"workbench: tracked: MLflow run {record['run_id']} at {uri}", file=sys.stderr, flush=True)
    return record


def log_result(mlflow_client: Any, experiment: str, result: RunResult, artifact: Path | None, *,
               name: str | None = None, parent: str | None = None, params: dict[str, Any] | None = None,
               artifacts: Iterable[Path] = (), record: dict[str, Any] | None = None) -> str:
    """Create one MLflow run for ``result`` (a child of ``parent`` when given) and log everything of the module
    docstring into it, plus ``params`` (a sweep point's parameters, where the configuration has no such key) and
    ``artifacts``; returns its run id (also put in ``record["run_id"]`` as soon as it exists). Raises what MLflow
    raises."""
    prov = result.provenance
    tags = {"outcome": result.outcome, "reason": str(result.summary.get("reason", ""))[:5000],
            **{f"prov.{k}": str(v) for k, v in prov.items()},
            "mlflow.source.name": str(prov.get("notebook") or prov.get("command") or "workbench"),
            **({"mlflow.source.git.commit": prov["commit"]} if prov.get("commit") not in (None, "unknown") else {}),
            **({"mlflow.parentRunId": parent} if parent else {})}
    for i, f in enumerate(result.failures):
        tags[f"failure.{i}"] = (f"rank {f.get('rank')} at step {f.get('step')}: {f.get('cause')}; detection "
                                f"{f.get('detection_s')} s, resume {f.get('resume_s')} s (rank-time "
                                f"{f.get('rank_resume_s')} s), steps redone "
                                f"{f.get('steps_redone')}, samples lost {f.get('samples_lost')}")[:5000]
    run = mlflow_client.create_run(experiment, start_time=epoch_ms(prov.get("started_utc")), tags=tags, run_name=name)
    run_id = run.info.run_id
    if record is not None:
        record["run_id"] = run_id
    all_params = {k: _text(v) for k, v in result.config.items()}
    all_params.update({k: _text(v) for k, v in (params or {}).items() if k not in all_params})
    log_batches(mlflow_client, run_id, metrics=step_metrics(result), params=all_params)
    mlflow_client.log_dict(run_id, {"events": result.events}, "events.json")
    mlflow_client.log_dict(run_id, {"failures": result.failures}, "failures.json")
    checkpoint = result.summary.get("final_checkpoint")
    for path in [artifact, Path(checkpoint) if checkpoint else None, *artifacts]:
        if path is not None and Path(path).is_file():
            mlflow_client.log_artifact(run_id, str(path))
    mlflow_client.set_terminated(run_id, "FINISHED" if result.completed else "FAILED",
                                 end_time=epoch_ms(prov.get("ended_utc")))
    return run_id


def abandon(mlflow_client: Any, run_id: str | None) -> None:
    """Mark a run whose logging failed half-way ``FAILED`` (so it does not stay ``RUNNING``), if the store still
    answers; nothing otherwise."""
    if mlflow_client is None or run_id is None:
        return
    try:
        mlflow_client.set_terminated(run_id, "FAILED")
    except Exception:  # noqa: BLE001 - the store that failed may well fail again
        pass


def step_metrics(result: RunResult) -> list[tuple[str, float, int, int]]:
    """(key, value, timestamp in ms, step) of every finite per-step value (but ``sample_checksum``, an id) and of
    the summary's numbers."""
    start = epoch_ms(result.provenance.get("started_utc")) or 0
    found = []
    for row in result.metrics:
        at = start + int(1000 * row["time"]) if _finite(row.get("time")) else start
        for key in METRIC_COLUMNS:
            if key not in ("step", "time", "sample_checksum") and _finite(row.get(key)):  # an id, not a measure
                found.append((key, float(row[key]), at, int(row["step"])))
    last = max((int(r["step"]) for r in result.metrics), default=0)
    end = epoch_ms(result.provenance.get("ended_utc")) or start
    found += [(key, float(result.summary[key]), end, last) for key in _SUMMARY_METRICS
              if _finite(result.summary.get(key))]
    found.append(("n_failures", float(len(result.failures)), end, last))
    for f in result.failures:  # each failure's time figures on both clocks, at the step it struck
        found += [(f"failure.{key}", float(f[key]), end, int(f.get("step") or 0)) for key in FAILURE_METRICS
                  if _finite(f.get(key))]
    return found


def log_batches(mlflow_client: Any, run_id: str, metrics: list[tuple[str, float, int, int]] = (),
                params: dict[str, str] | None = None, tags: dict[str, str] | None = None) -> None:
    """Send metrics, params and tags with ``log_batch``, within MLflow's per-request limits."""
    from mlflow.entities import Metric, Param, RunTag

    metric_list = [Metric(k, v, t, s) for k, v, t, s in metrics]
    param_list = [Param(k, v) for k, v in (params or {}).items()]
    tag_list = [RunTag(k, v) for k, v in (tags or {}).items()]
    for i in range(0, len(param_list), 100):
        mlflow_client.log_batch(run_id, params=param_list[i:i + 100])
    for i in range(0, len(tag_list), 100):
        mlflow_client.log_batch(run_id, tags=tag_list[i:i + 100])
    for i in range(0, len(metric_list), BATCH):
        mlflow_client.log_batch(run_id, metrics=metric_list[i:i + BATCH])


def failure_text(exc: BaseException) -> str:
    """One line: the exception's type and the first line of its message."""
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text[:300]}" if text else type(exc).__name__


def _text(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value)
    return text[:6000]  # MLflow's limit on a parameter's value


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def epoch_ms(iso: str | None) -> int | None:
    """An ISO 8601 time as milliseconds since the epoch (MLflow's times); None for none."""
    if not iso:
        return None
    try:
        return int(datetime.fromisoformat(iso).timestamp() * 1000)
    except ValueError:
        return None
