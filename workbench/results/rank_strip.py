"""The per-rank strip: every member's own step time (its CPU per step, the rank-time clock's stamps) over the step's
median across ranks, rank x step, so a straggler is a bright row (docs/permanent-faults.md, "Slow ranks and
stragglers"). Beside :mod:`workbench.results.plots`; its marks are the event kinds' markers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import plotly.graph_objects as go

from workbench.faults import events as ev

if TYPE_CHECKING:
    from workbench.results.run_result import RunResult


def rank_strip(result: RunResult, title: str | None = None) -> go.Figure:
    """Per-rank step times as a strip (heatmap rank x step): each rank's own CPU for the step (what it computes
    while the others wait for it; the rank-time clock's stamps) over the step's median across ranks, so a straggler
    is a bright row; its slow-downs and the detector's flags are marked where they happened."""
    import pandas as pd

    table = pd.DataFrame(result.rank_steps or {"step": [], "rank": [], "cpu_s": []})
    fig = go.Figure()
    if not table.empty:
        table = table.drop_duplicates(["step", "rank"], keep="last")  # a redone step: its last run
        table["relative"] = table.cpu_s / table.groupby("step").cpu_s.transform("median")
        grid = table.pivot(index="rank", columns="step", values="relative")
        ms = table.pivot(index="rank", columns="step", values="cpu_s") * 1e3
        fig.add_trace(go.Heatmap(z=grid.values, x=list(grid.columns), y=[f"rank {r}" for r in grid.index],
                                 customdata=ms.values, colorscale="YlOrRd", zmin=0.5, zmax=max(3.0, grid.max().max()),
                                 colorbar={"title": "x step median"},
                                 hovertemplate="%{y}, step %{x}: %{customdata:.2f} ms (%{z:.2f}x)<extra></extra>"))
    for kind in (ev.SLOW, ev.STRAGGLER):
        marks = [e for e in ev.of(result.events, kind) if e["rank"] >= 0]
        fig.add_trace(go.Scatter(x=[e["step"] for e in marks], y=[f"rank {e['rank']}" for e in marks],
                                 name=kind.name, mode="markers",
                                 marker={"symbol": kind.marker.symbol, "size": 13, "color": kind.marker.colour,
                                         "line": {"width": 1, "color": "black"}},
                                 hovertext=[ev.text(e, rank=False) for e in marks]))
    fig.update_layout(title=title or "per-rank step time (own CPU per step, x the step's median)",
                      xaxis_title="step", template="plotly_white", height=180 + 30 * table["rank"].nunique()
                      if not table.empty else 240, legend={"orientation": "h", "y": -0.35})
    return fig
