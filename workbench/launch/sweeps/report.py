"""One self-contained HTML page of a sweep: the figures of :mod:`workbench.results.plots` that fit its columns, and a
table of its points.

Figures, each only when its data is there: strategy trade-off, recovery timelines, per-rank step times (a point
that flagged a straggler), bit sensitivity, gossip vs allreduce. plotly.js is inlined once (no network needed to
view the page); the page is written atomically, and every file read is checked first (:mod:`workbench.base.h5files`).
Which columns each figure needs: docs/sweeps-and-clusters.md and docs/internals.md.
"""

from __future__ import annotations

import html
import os
import sys
import time
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

from workbench.base import modes
from workbench.base.h5files import check_output_place, write_text
from workbench.launch.sweeps.plan import read_sweep_spec
from workbench.launch.sweeps.table import load_sweep
from workbench.results.provenance import describe
from workbench.results.run_result import RESULT_FILE, RunResult
from workbench.results.trials import SENSITIVITY_FILE, load_trials

if TYPE_CHECKING:
    import pandas as pd
    import plotly.graph_objects as go

TABLE_COLUMNS = ("status", "outcome", "final_test_accuracy", "baseline_accuracy", "overhead_pct", "rank_overhead_pct",
                 "world_changed", "n_failures", "steps_redone_total", "samples_lost_total", "world_size_final",
                 "point_wall_s", "error")


def strategy_label(row: Any) -> str:
    regrow = row.get("config.regrow")
    return f"{row['config.strategy']}+regrow" if regrow is True or regrow == 1 else str(row["config.strategy"])


def _failed_label(row: pd.Series) -> str:
    """A failed point's strategy: its result's when it saved one, else the sweep's ``strategy`` (and ``regrow``)
    parameters, else the point's name."""
    if isinstance(row.get("config.strategy"), str):
        return strategy_label(row)
    if not isinstance(row.get("strategy"), str):
        return str(row.get("point"))
    regrow = row.get("regrow")
    return f"{row['strategy']}+regrow" if regrow is True or regrow == 1 else row["strategy"]


def figures(frame: pd.DataFrame) -> list[tuple[str, go.Figure]]:
    """(title, figure) for each figure that fits the sweep's table (see the module docstring)."""
    import pandas as pd

    from workbench.results import plots
    from workbench.results.rank_strip import rank_strip

    done = frame[frame.status == "completed"].copy()
    found: list[tuple[str, Any]] = []
    if {"config.strategy", "overhead_s", "baseline_accuracy", "final_test_accuracy"} <= set(done.columns):
        done["strategy_label"] = [strategy_label(r) for _, r in done.iterrows()]
        # a point whose notebook failed (its run failed and the last cell said so) is a failed run of its strategy:
        # listed apart with the others, never left out of the figure
        errored = frame[frame.status != "completed"].copy()
        errored["strategy_label"] = [_failed_label(r) for _, r in errored.iterrows()]
        usable = pd.concat([done, errored.assign(outcome="failed")])
        drawn = done[(done.outcome == "completed") & done.baseline_accuracy.notna()]
        if drawn.strategy_label.nunique() >= 2 and usable.n_failures.fillna(0).sum():
            fig = plots.strategy_tradeoff(usable, strategy="strategy_label")
            found.append((f"Strategy trade-off: accuracy lost vs runtime overhead on the {fig.layout.meta['clock']} "
                          "clock (mean and 95 % interval over points; failed runs listed apart)", fig))
    if "config.strategy" in done.columns and "n_failures" in done.columns:
        faulty = done[done.n_failures.fillna(0) > 0].copy()
        faulty["strategy_label"] = [strategy_label(r) for _, r in faulty.iterrows()]
        for label, rows in faulty.groupby("strategy_label", sort=True):
            first = rows.iloc[0]
            fig = plots.recovery_timeline(RunResult.load(first.path))
            fig.update_layout(title=f"{label}: ranks over the run ({first.point})")
            found.append((f"Recovery timeline: {label}", fig))
    if "stragglers" in done.columns:  # slow ranks: the per-rank strip of the first point that flagged one
        flagged = done[done.stragglers.fillna(0) > 0]
        if len(flagged):
            found.append((f"Per-rank step times: {flagged.iloc[0].point}",
                          rank_strip(RunResult.load(flagged.iloc[0].path))))
    trials = [load_trials(Path(p).parent / SENSITIVITY_FILE) for p in done.get("path", [])
              if isinstance(p, str) and (Path(p).parent / SENSITIVITY_FILE).is_file()]
    if trials:
        import pandas as pd

        fig = plots.bit_sensitivity(pd.concat(trials, ignore_index=True))
        found.append((f"Bit sensitivity ({sum(len(t) for t in trials)} trials from {len(trials)} points)", fig))
    runs, gossip = _runs_by_mode(done), modes.GOSSIP.name  # runs by the name of their mode
    if gossip in runs and len(runs) >= 2:
        found.append((f"Gossip vs {', '.join(sorted(m for m in runs if m != gossip))} (mean over "
                      f"{sum(len(r) for r in runs.values())} runs)", plots.gossip_vs_allreduce(_mean_metrics(runs))))
    return found


def _runs_by_mode(done: pd.DataFrame) -> dict[str, list[RunResult]]:
    """Every run saved under the completed points (a point may save several, e.g. one per mode), by
    ``config.parallelism``; only the largest world size, as the runs of different sizes do not average."""
    runs: list[RunResult] = []
    for notebook in done.get("notebook", []):
        if isinstance(notebook, str):
            for path in sorted(Path(notebook).parent.rglob(RESULT_FILE)):
                result = RunResult.load(path)
                if result.config.get("parallelism"):
                    runs.append(result)
    if not runs:
        return {}
    largest = max(r.config.get("world_size", 0) for r in runs)
    by_mode: dict[str, list[RunResult]] = {}
    for r in runs:
        if r.config.get("world_size", 0) == largest:
            by_mode.setdefault(str(r.config["parallelism"]), []).append(r)
    return by_mode


def _mean_metrics(runs: dict[str, list[RunResult]]) -> pd.DataFrame:
    """Per-step metrics of every run, time from each run's first step, averaged per (mode, step)."""
    import pandas as pd

    frames = []
    for mode, results in runs.items():
        for result in results:
            metrics = result.to_dataframe()
            if "consensus_distance" not in metrics:
                metrics["consensus_distance"] = float("nan")
            metrics["time"] = metrics["time"] - metrics["time"].min()
            metrics["parallelism"] = mode
            metrics["oversubscribed"] = bool(result.summary.get("oversubscribed"))
            frames.append(metrics)
    data = pd.concat(frames, ignore_index=True)
    means = data.groupby(["parallelism", "step"], as_index=False)[["time", "rank_time", "test_acc",
                                                                   "consensus_distance"]].mean()
    return means.assign(oversubscribed=bool(data.oversubscribed.any()))  # which clock the figure shows


def _table(frame: pd.DataFrame, parameters: list[str], base: Path) -> str:
    columns = ["point", *parameters, *[c for c in TABLE_COLUMNS if c in frame.columns]]
    head = "".join(f"<th>{html.escape(c)}</th>" for c in columns)
    body = []
    for _, row in frame.iterrows():
        cells = []
        for c in columns:
            value = row.get(c)
            if c == "point" and isinstance(row.get("notebook"), str):
                link = os.path.relpath(row["notebook"], base)
                cells.append(f'<td><a href="{html.escape(link)}">{html.escape(str(value))}</a></td>')
                continue
            if isinstance(value, float):
                text = "" if value != value else f"{value:.4g}"
            else:
                text = "" if value is None else str(value)
            cells.append(f"<td>{html.escape(text)}</td>")
        body.append(f"<tr class=\"{html.escape(str(row.get('status')))}\">{''.join(cells)}</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


class ProvenanceWarning(UserWarning):
    """The points of one sweep come from different commits or hosts."""


def _provenance(frame: pd.DataFrame, directory: Path) -> str:
    """The sweep's provenance (:func:`workbench.results.provenance.describe`) as HTML; each warning is also issued as a
    :class:`ProvenanceWarning` (``workbench report`` prints them on stderr)."""
    lines, found = describe(frame)
    for text in found:
        warnings.warn(f"sweep {directory}: {text}", ProvenanceWarning, stacklevel=3)
    items = "".join(f"<li>{html.escape(line)}</li>" for line in lines)
    alerts = "".join(f'<p class="warning">Warning: {html.escape(text)}</p>' for text in found)
    return f"{alerts}<details open><summary>Provenance</summary><ul>{items}</ul></details>"


PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{title}</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1200px; color: #222; }}
table {{ border-collapse: collapse; font-size: 0.85em; }} td, th {{ border: 1px solid #ccc; padding: 2px 6px; }}
tr.failed {{ background: #fdd; }} tr.pending {{ background: #eee; }} .figure {{ margin: 1.5em 0; }}
.warning {{ color: #a00; font-weight: bold; }}
</style></head><body>
<h1>{title}</h1>
<p>Generated {generated}.</p>
{sections}
</body></html>
"""


def report(directory: str | os.PathLike, *more: str | os.PathLike, out: str | os.PathLike | None = None) -> Path:
    """Write the report of one or more sweeps (default ``DIR/report.html`` of the first) and return its path.

    Each sweep gets its own section — where its points came from (commits, hosts, versions, times: the ``prov.*``
    columns; a :class:`ProvenanceWarning` when its points come from different commits or hosts), its figures, then
    its table of points (each point linked to its executed notebook) — so figures never mix points of different
    notebooks."""
    directories = [Path(d) for d in (directory, *more)]
    out = Path(out) if out is not None else directories[0] / "report.html"
    for d in directories:
        read_sweep_spec(d)  # every directory checked before any work: one line for the first that is no sweep
    check_output_place(out)
    sections, k = [], 0
    for d in directories:
        frame = load_sweep(d)
        spec = read_sweep_spec(d)
        parameters = sorted({key for p in spec["points"] for key in p["parameters"]})
        counts = frame.status.value_counts().to_dict()
        parts = [f"<h2>{html.escape(Path(spec['notebook']).stem)}: <code>{html.escape(str(d))}</code></h2>",
                 f"<p>Notebook <code>{html.escape(spec['notebook'])}</code>, {len(frame)} points: "
                 + ", ".join(f"{n} {html.escape(str(s))}" for s, n in sorted(counts.items())) + ".</p>"]
        parts.append(_provenance(frame, d))
        found = figures(frame)
        for title, fig in found:
            div = fig.to_html(full_html=False, include_plotlyjs=k == 0, div_id=f"figure-{k}")
            parts.append(f'<div class="figure"><h3>{html.escape(title)}</h3>{div}</div>')
            k += 1
        if not found:
            parts.append("<p>No figure fits this sweep's columns "
                         "(see <code>workbench.launch.sweeps.report</code>).</p>")
        parts.append(f'<h3>Points</h3><div style="overflow-x: auto">'
                     f'{_table(frame, parameters, out.resolve().parent)}</div>')
        sections.append("\n".join(parts))
    name = ", ".join(d.resolve().name for d in directories)
    page = PAGE.format(title=html.escape(f"Sweep report: {name}"), generated=time.strftime("%Y-%m-%d %H:%M:%S"),
                       sections="\n".join(sections))
    write_text(out, page)  # OutputError, one line, for a read-only or full place; no temporary file left
    return out


def report_command(directories: list[Path], out: str | os.PathLike | None = None) -> Path:
    """``workbench report``: :func:`report`, then each sweep's provenance lines on stdout and each
    :class:`ProvenanceWarning` as one line on stderr."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ProvenanceWarning)
        path = report(*directories, out=out)
    for directory in directories:
        print(f"{directory}:\n" + "".join(f"  {line}\n" for line in describe(load_sweep(directory))[0]), end="")
    for warning in caught:
        print(f"workbench: warning: {warning.message}", file=sys.stderr)
    return path


__all__ = ["ProvenanceWarning", "figures", "report", "report_command"]
