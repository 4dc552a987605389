"""Plotly figures, one function per figure. Plots take results or DataFrames, never live processes."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from workbench.faults import events as ev
from workbench.faults.outcomes import OUTCOMES
from workbench.results import clock as clocks

if TYPE_CHECKING:
    from workbench.results.run_result import RunResult

_PALETTE = ("royalblue", "crimson", "seagreen", "darkorange", "purple", "teal")


def training_curve(result: RunResult, title: str | None = None) -> go.Figure:
    """Loss and test accuracy vs step, world size as a step line; the faults that fired and what the run did
    (generations, failures, recoveries, ...) marked as their event kinds say (:func:`events.marked
    <workbench.faults.events.marked>`)."""
    frame = result.to_dataframe()
    evals = frame[frame.test_acc.notna()]
    fig = make_subplots(specs=[[{"secondary_y": True}]])
    fig.add_trace(go.Scatter(x=frame.step, y=frame.loss, name="training loss", mode="lines"))
    fig.add_trace(go.Scatter(x=evals.step, y=evals.test_acc, name="test accuracy", mode="lines+markers"),
                  secondary_y=True)
    fig.add_trace(go.Scatter(x=frame.step, y=frame.world_size / result.summary["world_size_initial"],
                             name="world size (fraction)", mode="lines", line={"shape": "hv", "dash": "dot"}),
                  secondary_y=True)
    for kind in ev.marked(curve=True):
        marks = [e for e in ev.of(result.events, kind) if e["step"] >= 0]
        if not marks:
            continue
        fig.add_trace(go.Scatter(
            x=[e["step"] for e in marks], y=[1.02] * len(marks), mode="markers", name=kind.name,
            marker={"symbol": kind.marker.symbol, "size": 12, "color": kind.marker.colour},
            hovertext=[ev.text(e) for e in marks]), secondary_y=True)
    fig.update_layout(title=title or f"{result.config['strategy']} — {result.summary['outcome']}",
                      xaxis_title="step", hovermode="x unified", template="plotly_white")
    fig.update_yaxes(title_text="loss", secondary_y=False)
    top = max(1.08, float((frame.world_size / result.summary["world_size_initial"]).max()) + 0.05)  # a grown world
    fig.update_yaxes(title_text="accuracy / world size", range=[0, top], secondary_y=True)
    return fig


def membership_timeline(results: dict[str, RunResult], title: str = "world size and accuracy by step") -> go.Figure:
    """Runs side by side: world size (a step line, top) and test accuracy (bottom) vs step; preemption notices,
    resizes and failures marked on each run's world-size line, their detail in the hover text."""
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.08,
                        subplot_titles=("world size", "test accuracy"))
    for i, (name, result) in enumerate(results.items()):
        colour = _PALETTE[i % len(_PALETTE)]
        frame = result.to_dataframe()
        evals = frame[frame.test_acc.notna()]
        fig.add_trace(go.Scatter(x=frame.step, y=frame.world_size, name=name, mode="lines", legendgroup=name,
                                 line={"shape": "hv", "color": colour}), 1, 1)
        fig.add_trace(go.Scatter(x=evals.step, y=evals.test_acc, name=name, mode="lines+markers", legendgroup=name,
                                 showlegend=False, line={"color": colour}), 2, 1)
        sizes = dict(zip(frame.step, frame.world_size))
        for kind in (ev.PREEMPT, ev.RESIZE, ev.FAILURE):
            marks = [e for e in ev.of(result.events, kind) if e["step"] >= 0 and e["step"] in sizes]
            if marks:
                fig.add_trace(go.Scatter(
                    x=[e["step"] for e in marks], y=[sizes[e["step"]] for e in marks], mode="markers",
                    name=f"{name}: {kind.name}", legendgroup=name,
                    marker={"symbol": kind.marker.symbol, "size": 11, "color": colour},
                    hovertext=[ev.text(e) for e in marks]), 1, 1)
    fig.update_layout(title=title, template="plotly_white", hovermode="closest", height=560)
    fig.update_xaxes(title_text="step", row=2, col=1)
    fig.update_yaxes(title_text="ranks", rangemode="tozero", row=1, col=1)
    fig.update_yaxes(title_text="accuracy", range=[0, 1.02], row=2, col=1)
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
    Takes the trials of :func:`workbench.campaigns.studies.sensitivity.bit_sensitivity` or their
    :func:`~workbench.faults.outcomes.outcome_shares`."""
    from workbench.faults.outcomes import outcome_shares

    shares = frame if "share" in frame.columns else outcome_shares(frame)
    outcomes = [o for o in OUTCOMES if o in set(shares.outcome)]
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


def recovery_timeline(result: RunResult) -> go.Figure:
    """One lane per rank number: alive, dead, or held by a replacement, over the steps; generation changes as
    vertical lines. Read from the run's ``generation`` and ``failure`` events."""
    world = result.summary["world_size_initial"]
    end = max(result.summary["steps_completed"], 1)
    changes = []
    for e in ev.of(result.events, ev.GENERATION):  # its structured fields (gen, members), never its prose
        if "members" in e:  # a result saved before generation events carried them: no lanes
            changes.append((max(e["step"], 0), int(e["gen"]), {int(r) for r in e["members"]}))
    died: dict[int, int] = {}
    fig = go.Figure()
    colours = {"alive": "seagreen", "dead": "crimson", "replacement": "teal"}
    shown: set[str] = set()
    for rank in range(world):
        for i, (start, gen, members) in enumerate(changes):
            stop = changes[i + 1][0] if i + 1 < len(changes) else end
            failures = [f["step"] for f in result.failures if f["rank"] == rank and f["step"] <= start and i > 0]
            if rank not in members:
                state = "dead"
                died.setdefault(rank, start)
            else:
                state = "replacement" if failures else "alive"
            if stop <= start and i + 1 < len(changes):
                continue
            fig.add_trace(go.Scatter(
                x=[start, max(stop, start + 0.5)], y=[rank, rank], mode="lines", line={"color": colours[state],
                                                                                       "width": 14},
                name=state, legendgroup=state, showlegend=state not in shown,
                hovertext=f"rank {rank}, generation {gen}: {state} (steps {start}-{stop})", hoverinfo="text"))
            shown.add(state)
    for start, gen, _ in changes[1:]:
        fig.add_vline(x=start, line={"color": "grey", "dash": "dot"}, annotation_text=f"gen {gen}")
    for f in result.failures:
        fig.add_trace(go.Scatter(x=[f["step"]], y=[f["rank"]], mode="markers", marker={"symbol": "x", "size": 14,
                                 "color": "black"}, name="failure", legendgroup="failure",
                                 showlegend="failure" not in shown, hoverinfo="text",
                                 hovertext=f"rank {f['rank']} {f['cause']} at step {f['step']}"))
        shown.add("failure")
    fig.update_layout(title="ranks over the run", xaxis_title="step", yaxis={"title": "rank", "dtick": 1,
                      "autorange": "reversed"}, template="plotly_white", height=150 + 40 * world)
    return fig


def strategy_tradeoff(frame: Any, accuracy: str = "final_test_accuracy", overhead: str | None = None,
                      strategy: str = "config.strategy", baseline: str = "baseline_accuracy",
                      outcome: str = "outcome", clock: str | None = None, seed: str = "config.seed") -> go.Figure:
    """Accuracy loss (points) vs runtime overhead per strategy (the ANL paper's trade-off view): mean and 95 %
    t interval over the completed runs of each strategy (seeds); the grey band is the failure-free runs' own 95 %
    interval about zero loss, and a sentence under the figure says so where every strategy sits inside it.
    Overhead is in % of the failure-free run (``overhead_pct``; ``overhead_s`` in seconds for results that predate
    it). A run that failed is not a point of the trade-off: failed runs are listed under the figure, per strategy.
    Strategies are told apart by colour and marker in the legend, not by labels on the plot (which overlap).
    ``frame``: :func:`workbench.load_results` rows whose summary was completed by ``RunResult.set_baseline``.
    ``clock``: ``wall`` or ``rank`` (:mod:`workbench.results.clock`; default: rank-time where a run was oversubscribed
    or the host stole CPU); the axis says which. A strategy whose runs changed the world size says so in its legend
    entry and under the figure: fewer ranks finishing their steps sooner is not a saving of the recovery."""
    clock, overhead = _clock_column(frame, clock, overhead or ("overhead_pct" if "overhead_pct" in frame
                                                                else "overhead_s"))
    data = frame.copy()
    failed = data[data[outcome] != "completed"] if outcome in data else data.iloc[:0]
    data = data[data[outcome] == "completed"] if outcome in data else data
    # a completed run without its failure-free reference has no overhead and no loss: listed apart, never drawn
    # at (0, 0), where it would pass for the ideal strategy
    unreferenced = data[data[[baseline, overhead]].isna().any(axis=1)]
    data = data.drop(unreferenced.index)
    data["accuracy_loss"] = 100 * (data[baseline] - data[accuracy])
    data["world_changed"] = data["world_changed"].fillna(False).astype(bool) if "world_changed" in data else False
    stats = data.groupby(strategy).agg(loss=("accuracy_loss", "mean"), loss_sd=("accuracy_loss", "std"),
                                       overhead=(overhead, "mean"), overhead_sd=(overhead, "std"),
                                       runs=(accuracy, "size"), world_changed=("world_changed", "any")).reset_index()
    stats[["loss_sd", "overhead_sd"]] = stats[["loss_sd", "overhead_sd"]].fillna(0.0)  # one run: no spread
    half = [t_quantile(n - 1) / math.sqrt(n) if n > 1 else 0.0 for n in stats.runs]  # sd -> 95 % half-width
    stats["loss_ci"], stats["overhead_ci"] = stats.loss_sd * half, stats.overhead_sd * half
    # the failure-free run of each seed (every point of a seed runs the same one)
    free = 100 * data.drop_duplicates(subset=[seed if seed in data else baseline])[baseline]
    band = float(free.std() * t_quantile(len(free) - 1) / math.sqrt(len(free))) if len(free) > 1 else 0.0
    fig = go.Figure()
    if band > 0:
        fig.add_hrect(y0=-band, y1=band, fillcolor="lightgrey", opacity=0.4, line_width=0)
    symbols = ["circle", "diamond", "square", "triangle-up", "cross", "x", "star", "hexagon"]
    for k, (_, row) in enumerate(stats.iterrows()):
        fig.add_trace(go.Scatter(
            x=[row.overhead], y=[row.loss], mode="markers",
            name=f"{row[strategy]} ({int(row.runs)} runs{'; world changed' if row.world_changed else ''})",
            marker={"size": 13, "symbol": symbols[k % len(symbols)] + ("-open" if row.world_changed else "")},
            error_x={"type": "data", "array": [row.overhead_ci]}, error_y={"type": "data", "array": [row.loss_ci]}))
    unit = "% of the failure-free run" if overhead.endswith("overhead_pct") else "s"
    changed = list(stats[stats.world_changed][strategy])
    apart = [(f"runs that failed: {_tally(failed, strategy)}", failed),
             (f"no failure-free reference: {_tally(unreferenced, strategy)}", unreferenced)]
    listed = " — ".join(text for text, rows in apart if len(rows))
    if listed:
        fig.add_annotation(text=f"not trade-off points: {listed}", xref="paper", yref="paper",
                           x=0, y=-0.22, showarrow=False, xanchor="left", font={"color": "crimson"})
    if band > 0 and len(stats) and (stats.loss.abs() <= band).all():
        fig.add_annotation(text=f"every strategy's mean accuracy loss lies within the failure-free runs' own 95 % "
                           f"interval (±{band:.1f} pt over {len(free)} seeds, the grey band): here the failures cost "
                           "no accuracy that this many seeds can tell", xref="paper", yref="paper", x=0, y=-0.38,
                           showarrow=False, xanchor="left")
    if changed:
        fig.add_annotation(text=f"open markers: the world size changed ({', '.join(map(str, changed))}): their "
                           "steps ran on fewer ranks, which is not a cost or a saving of the recovery itself",
                           xref="paper", yref="paper", x=0, y=-0.3, showarrow=False, xanchor="left")
    fig.update_layout(title="accuracy loss vs runtime overhead (completed runs; mean and 95 % interval)",
                      xaxis_title=clocks.label(f"runtime overhead ({unit})", clock),
                      yaxis_title="test accuracy lost (points)", template="plotly_white", margin={"b": 150},
                      meta={"clock": clocks.NAMES[clock].removesuffix(" clock")})
    return fig


# Student's t, 97.5th percentile, by degrees of freedom (a two-sided 95 % interval); 1.96 beyond 30
_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
         2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)


def t_quantile(df: int) -> float:
    """Student's t 97.5th percentile for ``df`` degrees of freedom (>= 1)."""
    return _T975[df - 1] if df <= len(_T975) else 1.96


def _clock_column(frame: Any, clock: str | None, name: str) -> tuple[str, str]:
    """(clock, column) of figure ``name`` in ``frame``: the clock asked for, else the frame's default
    (:func:`workbench.results.clock.resolve`); tables written before rank-time existed have wall time only."""
    chosen = clocks.resolve(clock, frame)
    column = clocks.column(name.removeprefix(clocks.PREFIX), chosen)
    if column in frame:
        return chosen, column
    if clock == "rank":
        raise ValueError(f"this table has no {column} column (results written before the rank-time clock): "
                         "use clock='wall'")
    return "wall", name.removeprefix(clocks.PREFIX)


def _tally(rows: Any, by: str) -> str:
    """``shrink: 2, none: 1``: how many rows each value of ``by`` has."""
    return ", ".join(f"{name}: {len(part)}" for name, part in rows.groupby(by))


def scaling(frame: Any, x: str = "world_size", y: str = "resume_s", group: str = "strategy",
            facet: str | None = "model", clock: str | None = None) -> go.Figure:
    """A figure such as recovery time vs world size per strategy, e.g. from ``bench_recovery.py`` rows. A time
    figure ``y`` (ending in ``_s``) is shown on ``clock`` (its ``rank_`` column on the rank clock, where the frame
    has one), and the axis says which."""
    title = y
    if y.endswith("_s"):
        clock, y = _clock_column(frame, clock, y)
        title = clocks.label(f"{y.removeprefix(clocks.PREFIX)} (s)", clock)
    fig = go.Figure()
    facets = sorted(set(frame[facet])) if facet and facet in frame else [None]
    dashes = ["solid", "dash", "dot", "dashdot"]
    for k, value in enumerate(facets):
        part = frame if value is None else frame[frame[facet] == value]
        for name, rows in part.groupby(group):
            rows = rows.sort_values(x)
            fig.add_trace(go.Scatter(x=rows[x], y=rows[y], mode="lines+markers", line={"dash": dashes[k % 4]},
                                     name=f"{name}" + (f" ({value})" if value is not None else "")))
    fig.update_layout(title=f"{y} vs {x}", xaxis_title=x, yaxis_title=title, template="plotly_white")
    return fig


def gossip_vs_allreduce(frame: Any, group: str = "parallelism", clock: str | None = None) -> go.Figure:
    """Test accuracy vs step and vs time (on ``clock``: ``wall`` or ``rank``, the frame's default where None),
    one line per ``group`` value (e.g. allreduce, gossip), and the consensus distance vs step where the frame has
    it. ``frame``: per-step rows as from ``load_results(..., metrics=True)`` with columns ``step``, ``time``
    (``rank_time``), ``test_acc`` and the group column (and ``oversubscribed``, which picks the default clock)."""
    has_consensus = "consensus_distance" in frame and frame["consensus_distance"].notna().any()
    cols = 3 if has_consensus else 2
    clock, when = _clock_column(frame, clock, "time")
    titles = ["accuracy vs step", f"accuracy vs time ({clocks.NAMES[clock]})", "consensus distance"][:cols]
    fig = make_subplots(rows=1, cols=cols, subplot_titles=titles)
    palette = ["royalblue", "crimson", "seagreen", "darkorange"]
    for k, (name, rows) in enumerate(frame.groupby(group)):
        colour = palette[k % len(palette)]
        evals = rows[rows.test_acc.notna()].sort_values("step")
        fig.add_trace(go.Scatter(x=evals.step, y=evals.test_acc, name=str(name), legendgroup=str(name),
                                 line={"color": colour}), 1, 1)
        fig.add_trace(go.Scatter(x=evals[when] - (0 if when != "time" else rows.time.min()), y=evals.test_acc,
                                 name=str(name),
                                 legendgroup=str(name), showlegend=False, line={"color": colour}), 1, 2)
        if has_consensus and rows["consensus_distance"].notna().any():
            fig.add_trace(go.Scatter(x=rows.step, y=rows.consensus_distance, name=str(name), legendgroup=str(name),
                                     showlegend=False, line={"color": colour}), 1, 3)
    fig.update_xaxes(title_text="step", row=1, col=1)
    fig.update_xaxes(title_text=clocks.label("seconds", clock), row=1, col=2)
    fig.update_layout(template="plotly_white", title="gossip vs allreduce")
    return fig


def traffic(frame: Any, group: str = "parallelism", size: str = "world_size") -> go.Figure:
    """Messages and bytes one rank sends per step vs the number of ranks, one line per ``group`` (allreduce's
    grow with p, gossip's stay flat). ``frame``: per-step rows with ``messages``, ``bytes_sent``, the group and
    size columns (``load_results(..., metrics=True)``)."""
    fig = make_subplots(rows=1, cols=2, subplot_titles=["messages per rank per step", "bytes per rank per step"])
    palette = ["royalblue", "crimson", "seagreen", "darkorange"]
    per_run = frame.dropna(subset=["messages"]).groupby([group, size])[["messages", "bytes_sent"]].median()
    for k, (name, rows) in enumerate(per_run.reset_index().groupby(group)):
        rows = rows.sort_values(size)
        style = {"color": palette[k % len(palette)]}
        fig.add_trace(go.Scatter(x=rows[size], y=rows.messages, mode="lines+markers", name=str(name),
                                 legendgroup=str(name), line=style), 1, 1)
        fig.add_trace(go.Scatter(x=rows[size], y=rows.bytes_sent, mode="lines+markers", name=str(name),
                                 legendgroup=str(name), showlegend=False, line=style), 1, 2)
    fig.update_xaxes(title_text="ranks p", type="log", dtick=0.30103)
    fig.update_layout(template="plotly_white", title="communication per step (counted, not timed)")
    return fig


def outcome_comparison(frame: Any, group: str = "parallelism", by: str = "target") -> go.Figure:
    """Share of each outcome (masked / degraded / nonfinite / crash) per ``group`` and ``by`` value, stacked: the
    same injection campaign on two kinds of training side by side. ``frame``: rows of ``faults.campaign`` with
    the ``group`` column added."""
    colours = dict(zip(OUTCOMES, ("seagreen", "darkorange", "crimson", "black")))
    counts = frame.groupby([group, by, "outcome"]).size()
    totals = frame.groupby([group, by]).size()
    labels = [f"{g} · {b}" for g, b in totals.index]
    fig = go.Figure()
    for outcome, colour in colours.items():
        shares = [counts.get((g, b, outcome), 0) / totals[(g, b)] for g, b in totals.index]
        if any(shares):
            fig.add_trace(go.Bar(x=labels, y=shares, name=outcome, marker_color=colour,
                                 hovertemplate="%{x}: %{y:.0%}<extra>" + outcome + "</extra>"))
    fig.update_layout(barmode="stack", template="plotly_white", yaxis_title="share of injections",
                      yaxis_tickformat=".0%", title=f"outcomes per {group} and {by}")
    return fig


def apoptosis(runs: Any, group: str = "run", smooth: int = 10, clock: str | None = None) -> go.Figure:
    """Parameters, test accuracy and step time vs step, one line per run (e.g. with and without apoptosis);
    removals marked on the parameter panel. ``runs``: a mapping of label to :class:`RunResult`, or per-step rows
    (``load_results(..., metrics=True)``) with columns ``step``, ``parameters``, ``test_acc``, ``step_time`` and
    the ``group`` column. Step time is a rolling median over ``smooth`` steps (single steps are noisy), on
    ``clock`` (``wall`` or ``rank``; rank-time where the frame has it and None is given)."""
    import pandas as pd

    removals: dict[str, list[dict[str, Any]]] = {}
    if isinstance(runs, dict):
        frames = []
        for label, result in runs.items():
            frame = result.to_dataframe()
            frame[group] = label
            frame["oversubscribed"] = bool(result.summary.get("oversubscribed"))  # which clock by default
            frames.append(frame)
            removals[label] = ev.of(result.events, ev.APOPTOSIS)
        frame = pd.concat(frames, ignore_index=True)
    else:
        frame = runs
    clock, step_time = _clock_column(frame, clock, "step_time")
    fig = make_subplots(rows=3, cols=1, shared_xaxes=True, vertical_spacing=0.06,
                        subplot_titles=("parameters", "test accuracy",
                                        clocks.label(f"step time (median of {smooth} steps)", clock)))
    palette = ["crimson", "grey", "royalblue", "seagreen", "darkorange"]
    for k, (name, rows) in enumerate(frame.groupby(group, sort=False)):
        style = {"color": palette[k % len(palette)]}
        rows = rows.sort_values("step", kind="stable")
        evals = rows[rows.test_acc.notna()]
        fig.add_trace(go.Scatter(x=rows.step, y=rows.parameters, name=str(name), legendgroup=str(name),
                                 line={**style, "shape": "hv"}), 1, 1)
        fig.add_trace(go.Scatter(x=evals.step, y=evals.test_acc, name=str(name), legendgroup=str(name),
                                 showlegend=False, mode="lines+markers", line=style), 2, 1)
        fig.add_trace(go.Scatter(x=rows.step, y=rows[step_time].rolling(smooth, min_periods=1).median() * 1e3,
                                 name=str(name), legendgroup=str(name), showlegend=False, line=style), 3, 1)
        marks = removals.get(name, [])
        if marks:
            at = rows.drop_duplicates("step", keep="last").set_index("step").parameters
            fig.add_trace(go.Scatter(
                x=[e["step"] for e in marks], y=[at.get(e["step"], None) for e in marks], mode="markers",
                marker={"symbol": "triangle-down", "size": 9, **style}, name=f"{name}: removal",
                legendgroup=str(name), showlegend=False, hovertext=[ev.text(e) for e in marks], hoverinfo="text"),
                1, 1)
    fig.update_yaxes(title_text="parameters", rangemode="tozero", row=1, col=1)
    fig.update_yaxes(title_text="accuracy", row=2, col=1)
    fig.update_yaxes(title_text=clocks.label("ms", clock), rangemode="tozero", row=3, col=1)
    fig.update_xaxes(title_text="step", row=3, col=1)
    fig.update_layout(template="plotly_white", height=750, title="adaptive neuron apoptosis")
    return fig
