"""Plotly figures, one function per figure. Plots take results or DataFrames, never live processes."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import plotly.graph_objects as go
from plotly.subplots import make_subplots

if TYPE_CHECKING:
    from workbench.results import RunResult

FAULT_MARKERS = {"kill": ("x", "crimson"), "hang": ("square", "darkorange"), "failure": ("x-thin", "crimson"),
                 "generation": ("diamond", "royalblue"), "recovered": ("triangle-up", "seagreen"),
                 "restart": ("circle-open", "purple"), "regrow": ("star", "teal")}


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


def failure_comparison(baseline: RunResult, faulty: RunResult, title: str | None = None) -> go.Figure:
    """A no-fault run and a faulty run of the same configuration: loss and test accuracy vs step, each failure a
    vertical line with its figures in the hover text (the ANL paper's accuracy-vs-progress view)."""
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.08,
                        subplot_titles=("training loss", "test accuracy"))
    for result, name, colour in ((baseline, "no fault", "grey"), (faulty, faulty.config["strategy"], "crimson")):
        frame = result.to_dataframe()
        evals = frame[frame.test_acc.notna()]
        fig.add_trace(go.Scatter(x=frame.step, y=frame.loss, name=f"{name}: loss", line={"color": colour}), 1, 1)
        fig.add_trace(go.Scatter(x=evals.step, y=evals.test_acc, name=f"{name}: accuracy", mode="lines+markers",
                                 line={"color": colour}), 2, 1)
    for f in faulty.failures:
        text = (f"rank {f['rank']} {f['cause']} at step {f['step']}<br>detected {f['detection_s']} s, "
                f"resumed {f['resume_s']} s<br>steps redone {f['steps_redone']}, samples lost {f['samples_lost']}"
                f"<br>world size after {f['world_size_after']}")
        fig.add_vline(x=f["step"], line={"color": "crimson", "dash": "dash"})
        fig.add_trace(go.Scatter(x=[f["step"]], y=[faulty.to_dataframe().loss.max()], mode="markers",
                                 marker={"symbol": "x", "size": 12, "color": "crimson"}, name="failure",
                                 hovertext=[text], showlegend=False), 1, 1)
    fig.update_layout(title=title or f"{faulty.config['strategy']} vs no fault", template="plotly_white",
                      xaxis2_title="step", height=600)
    return fig


def bit_sensitivity(frame: Any) -> go.Figure:
    """Share of each outcome per bit (heatmap; Wilson 95 % interval in the hover), fields of the format marked.
    Takes the trials of :func:`workbench.faults.bit_sensitivity` or their :func:`~workbench.faults.outcome_shares`."""
    from workbench.faults.sensitivity import outcome_shares

    shares = frame if "share" in frame.columns else outcome_shares(frame)
    outcomes = [o for o in ("masked", "degraded", "nonfinite", "crash") if o in set(shares.outcome)]
    bits = sorted(set(shares.bit))
    table = shares.set_index(["outcome", "bit"])
    z = [[table.loc[(o, b), "share"] for b in bits] for o in outcomes]
    text = [[f"bit {b} ({table.loc[(o, b), 'field']}): {o} {table.loc[(o, b), 'share']:.0%} "
             f"[{table.loc[(o, b), 'low']:.0%}, {table.loc[(o, b), 'high']:.0%}] of {table.loc[(o, b), 'n']}"
             for b in bits] for o in outcomes]
    fig = go.Figure(go.Heatmap(z=z, x=bits, y=outcomes, text=text, hoverinfo="text", colorscale="Reds", zmin=0,
                               zmax=1, colorbar={"title": "share"}))
    fields = shares.drop_duplicates("bit").set_index("bit").field
    for field in dict.fromkeys(fields):
        span = [b for b in bits if fields[b] == field]
        fig.add_vrect(x0=min(span) - 0.5, x1=max(span) + 0.5, line_width=1, fillcolor="rgba(0,0,0,0)",
                      annotation_text=field, annotation_position="top")
    fig.update_layout(title="outcome share per flipped bit (LSB-0)", xaxis_title="bit", template="plotly_white",
                      xaxis={"dtick": 1})
    return fig
