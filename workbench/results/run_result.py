"""Results of a run: per-step metrics, events, per-failure figures and a summary; one HDF5 file per run.

``result.h5`` holds root attributes ``config``, ``summary``, ``provenance`` and ``format``, a group ``metrics``
with one 1-D dataset per column (NaN where a step has no value), a group ``rank_steps`` (every member's CPU per step),
and ``events`` and ``failures`` as JSON rows. From format 2 on every event row carries its kind's declared fields;
a reader that needs them asks :meth:`RunResult.fielded_events`, which refuses an older file in one line.
Files are written to a temporary name and renamed; every loader checks the file's kind first
(:func:`workbench.base.h5files.require`). The columns: docs/settings.md; the layout: docs/internals.md.
"""

from __future__ import annotations

import glob as globlib
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from workbench.base.errors import ResultsError
from workbench.base.h5files import FORMATS, RESULT, SWEEP_TABLE, TABLE, reason, require
from workbench.base.h5write import write_hdf5
from workbench.results import summary as summaries
from workbench.results.provenance import columns as provenance_columns

if TYPE_CHECKING:
    import pandas as pd

FORMAT = FORMATS[RESULT]
EVENT_FIELDS = 2  # the result format from which every event row carries its kind's declared fields
RESULT_FILE = "result.h5"
METRIC_COLUMNS = ("step", "time", "loss", "train_acc", "samples", "sample_checksum", "test_acc", "test_loss", "val_acc",
                  "world_size", "generation", "step_time", "rank_step_time", "rank_time", "messages", "bytes_sent",
                  "consensus_distance", "parameters", "hidden_units", "lr", "global_batch")


@dataclass
class RunResult:
    config: dict[str, Any]
    metrics: list[dict[str, Any]]
    events: list[dict[str, Any]]
    failures: list[dict[str, Any]]
    summary: dict[str, Any]
    path: Path | None = None
    provenance: dict[str, Any] = field(default_factory=dict)  # workbench.results.provenance; {} for older files
    # every member's own CPU per step (columns step, generation, rank, cpu_s, slow: the supervisor's straggler
    # bookkeeping, workbench.results.rank_strip); {} for older files
    rank_steps: dict[str, list[Any]] = field(default_factory=dict)
    format: int = FORMAT  # the layout it was written in (a file's; EVENT_FIELDS: its events carry their fields)

    @property
    def outcome(self) -> str:
        return self.summary["outcome"]

    @property
    def completed(self) -> bool:
        return self.outcome == "completed"

    @property
    def events_have_fields(self) -> bool:
        """Whether every event row carries its kind's declared fields (a result of format 2 or later)."""
        return self.format >= EVENT_FIELDS

    def fielded_events(self, purpose: str) -> list[dict[str, Any]]:
        """The events, each with its kind's declared fields; :class:`ResultsError` in one line for a result
        written before events carried them (format 1): ``purpose`` says what reads them; run it again."""
        if not self.events_have_fields:
            raise ResultsError(f"{self.path or 'this result'} was written before run events carried their fields "
                               f"(result format {self.format}): {purpose} reads them; run it again")
        return self.events

    def set_baseline(self, baseline: RunResult) -> None:
        """Record ``overhead_s``: training time beyond a no-fault run of the same configuration, and
        ``overhead_pct``: the same in % of that run's training time, on each clock (``rank_overhead_s``,
        ``rank_overhead_pct`` on the rank clock: :mod:`workbench.results.clock`); ``world_changed``: this run did not
        train at the baseline's world size throughout (a smaller world's steps cost less wall time on shared
        cores and more rank-time: say so beside its overhead)."""
        summaries.with_baseline(self.summary, baseline.summary, {r["world_size"] for r in self.metrics})

    def save(self, directory: str | os.PathLike) -> Path:
        """Write ``directory/result.h5`` atomically and return its path. A full disk or a read-only place raises
        :class:`~workbench.base.h5files.OutputError` (one line naming the path), nothing left behind, the summary's
        ``result_path`` as it was."""
        import h5py
        import numpy as np

        path = Path(directory) / RESULT_FILE
        before = self.summary.get("result_path")
        summaries.saved_at(self.summary, str(path.resolve()))
        text = h5py.string_dtype()

        def fill(f: Any) -> None:
            f.attrs["format"] = self.format  # an older result's events stay as they were: its format says so
            f.attrs["config"] = json.dumps(self.config)
            f.attrs["summary"] = json.dumps(self.summary)
            f.attrs["provenance"] = json.dumps(self.provenance)
            group = f.create_group("metrics")
            for column in METRIC_COLUMNS:
                values = [r.get(column, np.nan) for r in self.metrics]
                group.create_dataset(column, data=np.array(values, dtype=np.float64))
            f.create_dataset("events", data=[json.dumps(e) for e in self.events], dtype=text)
            f.create_dataset("failures", data=[json.dumps(e) for e in self.failures], dtype=text)
            steps = f.create_group("rank_steps")
            for column, values in self.rank_steps.items():
                steps.create_dataset(column, data=np.array(values, dtype=np.float64))

        try:
            write_hdf5(path, fill)
        except BaseException:
            summaries.saved_at(self.summary, before)
            raise
        self.path = path
        return path

    @classmethod
    def load(cls, path: str | os.PathLike) -> RunResult:
        import h5py

        path = Path(path)
        if path.is_dir():
            path = path / RESULT_FILE
        info = require(path, RESULT)
        try:
            with h5py.File(path, "r") as f:
                n = len(f["metrics"]["step"])
                # a column a file predates reads as NaN (files of older versions stay readable)
                metrics_columns = {c: f["metrics"][c][()] if c in f["metrics"] else [float("nan")] * n
                                   for c in METRIC_COLUMNS}
                metrics = [{c: _plain(metrics_columns[c][i], c) for c in METRIC_COLUMNS} for i in range(n)]
                steps = {c: [v if c in ("cpu_s", "slow") else int(v) for v in f["rank_steps"][c][()].tolist()]
                         for c in f.get("rank_steps", {})}
                return cls(json.loads(f.attrs["config"]), metrics,
                           [json.loads(e) for e in f["events"].asstr()[()]],
                           [json.loads(e) for e in f["failures"].asstr()[()]],
                           json.loads(f.attrs["summary"]), path, json.loads(f.attrs.get("provenance", "{}")), steps,
                           info.format)
        except (OSError, RuntimeError, KeyError, ValueError, TypeError) as exc:
            raise ResultsError(f"{path} is a damaged workbench result file ({reason(exc)})") from None

    def to_dataframe(self) -> pd.DataFrame:
        """Per-step metrics, one row per committed step (a redone step appears again)."""
        import pandas as pd

        return pd.DataFrame(self.metrics, columns=list(METRIC_COLUMNS))

    def events_frame(self) -> pd.DataFrame:
        import pandas as pd

        from workbench.faults.events import COLUMNS

        return pd.DataFrame(self.events, columns=list(COLUMNS))

    def summary_row(self) -> dict[str, Any]:
        row = {f"config.{k}": (json.dumps(v) if isinstance(v, list) else v) for k, v in self.config.items()}
        row.update({k: v for k, v in self.summary.items() if k != "failures"})
        row["n_failures"] = len(self.failures)
        row.update(provenance_columns(self.provenance))
        return row

    def __repr__(self) -> str:
        s = self.summary
        acc = s["final_test_accuracy"]
        return (f"RunResult(outcome={s['outcome']!r}, steps={s['steps_completed']}, "
                f"test_acc={acc if acc is None else round(acc, 4)}, world={s['world_size_initial']}->"
                f"{s['world_size_final']}, failures={len(self.failures)}, wall_s={s['wall_s']})")


def model_size(metrics: list[dict[str, Any]]) -> dict[str, dict[str, int] | None]:
    """``hidden_units`` and ``parameters`` of the model at the first and the last step (each row holds the size
    of the model that trained that step; apoptosis never removes units after the last step), None when the rows
    do not say (parallel modes other than data)."""
    size: dict[str, dict[str, int] | None] = {}
    for key in ("hidden_units", "parameters"):
        known = [r[key] for r in metrics if isinstance(r.get(key), (int, float)) and math.isfinite(r[key])]
        size[key] = {"start": int(known[0]), "end": int(known[-1])} if known else None
    return size


def _plain(value: Any, column: str) -> Any:
    value = float(value)
    integral = column in ("step", "samples", "sample_checksum", "world_size", "generation", "parameters",
                          "hidden_units", "global_batch") \
        and math.isfinite(value)
    return int(value) if integral else value


def find_results(where: str | os.PathLike) -> list[Path]:
    path = Path(where)
    if path.is_file():
        return [path]
    if path.is_dir():
        return sorted(path.rglob(RESULT_FILE))
    return sorted(Path(p) for p in globlib.glob(str(where), recursive=True)
                  if Path(p).is_file() or (Path(p) / RESULT_FILE).is_file())


def load_results(where: str | os.PathLike, metrics: bool = False) -> pd.DataFrame:
    """Load every ``result.h5`` under a directory, or matching a glob.

    Default: one row per run (``config.*`` columns, the summary, ``n_failures``, ``prov.*`` — where the run came
    from, :mod:`workbench.results.provenance`; NaN for files written before provenance was kept —, ``path``). With
    ``metrics=True``: one row per step of every run, with the run's ``path``, ``outcome``, ``config.*`` and what
    picks the default clock of its figures (``oversubscribed``, ``prov.steal_pct``: :mod:`workbench.results.clock`).
    """
    import pandas as pd

    paths = find_results(where)
    if not paths:
        raise ResultsError(f"no {RESULT_FILE} found at {str(where)!r}")
    frames = []
    for p in paths:
        result = RunResult.load(p)
        row = result.summary_row() | {"path": str(result.path)}
        if metrics:
            frame = result.to_dataframe()
            for key in ("path", "outcome", "oversubscribed", "prov.steal_pct",
                        *[k for k in row if k.startswith("config.")]):
                frame[key] = row.get(key)
            frames.append(frame)
        else:
            frames.append(pd.DataFrame([row]))
    return pd.concat(frames, ignore_index=True)


def save_table(frame: pd.DataFrame, path: str | os.PathLike, **attrs: Any) -> Path:
    """Write a DataFrame to HDF5 atomically, one dataset per column (in a ``columns`` group, order kept).

    A column of numbers (None allowed: stored as NaN) is stored as float64 or int64, a column of booleans as
    bool, anything else as UTF-8 JSON strings (attribute ``json`` set on the dataset); ``attrs`` (JSON) become
    root attributes. :func:`load_table` reads it back. Written through :func:`workbench.base.h5write.write_hdf5`: a
    full disk or a read-only place is an :class:`~workbench.base.h5files.OutputError`, nothing left behind."""
    import h5py
    import numpy as np

    kind = SWEEP_TABLE if {"signature", "notebook"} <= set(attrs) else TABLE  # as h5files tells them apart

    def fill(f: Any) -> None:
        f.attrs["format"] = FORMATS[kind]
        f.attrs["columns"] = json.dumps([str(c) for c in frame.columns])
        for key, value in attrs.items():
            f.attrs[key] = json.dumps(value)
        group = f.create_group("columns")
        for i, column in enumerate(frame.columns):
            values = [_scalar(v) for v in frame[column].tolist()]
            name = f"{i:04d}"
            present = [v for v in values if v is not None]
            if present and all(isinstance(v, bool) for v in values):
                group.create_dataset(name, data=np.array(values, dtype=bool))
            elif present and all(isinstance(v, int) and not isinstance(v, bool) for v in values):
                group.create_dataset(name, data=np.array(values, dtype=np.int64))
            elif all(isinstance(v, (int, float)) and not isinstance(v, bool) or v is None for v in values):
                group.create_dataset(name, data=np.array([math.nan if v is None else v for v in values],
                                                         dtype=np.float64))
            else:
                group.create_dataset(name, data=[json.dumps(v) for v in values], dtype=h5py.string_dtype())
                group[name].attrs["json"] = True

    return write_hdf5(path, fill)


def load_table(path: str | os.PathLike) -> tuple[pd.DataFrame, dict[str, Any]]:
    """Read a table written by :func:`save_table`: the DataFrame and the root attributes (a file that is no
    table raises :class:`~workbench.base.h5files.FileKindError`)."""
    import h5py
    import pandas as pd

    require(path, TABLE, SWEEP_TABLE)
    try:
        with h5py.File(path, "r") as f:
            columns = json.loads(f.attrs["columns"])
            data = {}
            for i, column in enumerate(columns):
                dataset = f["columns"][f"{i:04d}"]
                data[column] = ([json.loads(v) for v in dataset.asstr()[()]] if dataset.attrs.get("json")
                                else dataset[()])
            attrs = {k: json.loads(v) for k, v in f.attrs.items() if k not in ("format", "columns")}
    except (OSError, RuntimeError, KeyError, ValueError, TypeError) as exc:
        raise ResultsError(f"{path} is a damaged workbench table ({reason(exc)})") from None
    return pd.DataFrame(data, columns=columns), attrs


def _scalar(value: Any) -> Any:
    """numpy scalars to Python ones; NaN to None."""
    if hasattr(value, "item") and not isinstance(value, (list, dict, str)):
        value = value.item()
    if isinstance(value, float) and math.isnan(value):
        return None
    return value
