"""Plotly figures, one function per figure. Plots take results or DataFrames, never live processes."""

from __future__ import annotations

from typing import TYPE_CHECKING

import plotly.graph_objects as go
from plotly.subplots import make_subplots

if TYPE_CHECKING:
    from workbench.results import RunResult

FAULT_MARKERS = {"kill": ("x", "crimson"), "hang": ("square", "darkorange"), "failure": ("x-thin", "crimson"),
                 "generation": ("diamond", "royalblue")}


def training_curve(result: RunResult, title: str | None = None) -> go.Figure:
    """Loss and test accuracy vs step, world size as a step line, faults and generation changes marked."""
    frame = result.to_dataframe()
    evals = frame[frame.test_acc.notna()]
    fig = make_subplots(specs=[[{"secondary_y": True}]])
    fig.add_trace(go.Scatter(x=frame.step, y=frame.loss, name="training loss", mode="lines"))
    fig.add_trace(go.Scatter(x=evals.step, y=evals.test_acc, name="test accuracy", mode="lines+markers"),
                  secondary_y=True)
    fig.add_trace(go.Scatter(x=frame.step, y=frame.world_size / result.summary["world_size_initial"],
                             name="world size (fraction)", mode="lines", line={"shape": "hv", "dash": "dot"}),
                  secondary_y=True)
    for kind, (symbol, colour) in FAULT_MARKERS.items():
        marks = [e for e in result.events if e["kind"] == kind and e["step"] >= 0]
        if not marks:
            continue
        fig.add_trace(go.Scatter(
            x=[e["step"] for e in marks], y=[1.02] * len(marks), mode="markers", name=kind,
            marker={"symbol": symbol, "size": 12, "color": colour},
            hovertext=[f"rank {e['rank']}: {e['detail']}" if e["rank"] >= 0 else e["detail"] for e in marks]),
            secondary_y=True)
    fig.update_layout(title=title or f"{result.config['strategy']} — {result.summary['outcome']}",
                      xaxis_title="step", hovermode="x unified", template="plotly_white")
    fig.update_yaxes(title_text="loss", secondary_y=False)
    fig.update_yaxes(title_text="accuracy / world size", range=[0, 1.08], secondary_y=True)
    return fig
