"""Plots from saved results and frames (never from live processes)."""

import pandas as pd
import plotly.graph_objects as go
import pytest
from test_results import make_result

from workbench.results import plots


def timeline_result():
    result = make_result()
    result.events = [
        {"time": 0.0, "step": 0, "rank": -1, "kind": "generation", "detail": "generation 0: ranks [0, 1, 2, 3]",
         "gen": 0, "members": [0, 1, 2, 3], "recovery": None},
        {"time": 1.0, "step": 1, "rank": 2, "kind": "failure", "detail": "rank 2 died (SIGKILL)",
         "cause": "died (SIGKILL)", "world_after": 3},
        {"time": 1.0, "step": 1, "rank": -1, "kind": "generation", "detail": "generation 1: ranks [0, 1, 3] (shrink)",
         "gen": 1, "members": [0, 1, 3], "recovery": "shrink"},
        {"time": 2.0, "step": 2, "rank": -1, "kind": "generation", "detail": "generation 2: ranks [0, 1, 2, 3]",
         "gen": 2, "members": [0, 1, 2, 3], "recovery": None},
    ]
    return result


def test_recovery_timeline_lanes():
    fig = plots.recovery_timeline(timeline_result())
    assert isinstance(fig, go.Figure)
    states = {(t.y[0], t.name) for t in fig.data if t.mode == "lines"}
    assert (2, "dead") in states and (2, "replacement") in states and (0, "alive") in states
    assert any(t.name == "failure" and t.y[0] == 2 for t in fig.data)


def test_strategy_tradeoff_error_bars():
    frame = pd.DataFrame({"config.strategy": ["rollback", "rollback", "forward", "forward"],
                          "final_test_accuracy": [0.95, 0.96, 0.93, 0.91], "baseline_accuracy": [0.96] * 4,
                          "overhead_s": [0.5, 0.7, 0.2, 0.1]})
    fig = plots.strategy_tradeoff(frame)
    forward = next(t for t in fig.data if t.name.startswith("forward"))
    assert abs(forward.y[0] - 4.0) < 1e-9 and forward.error_y.array[0] > 0 and abs(forward.x[0] - 0.15) < 1e-9
    assert fig.layout.xaxis.title.text == "runtime overhead (s, wall clock)"  # no overhead_pct, no rank columns


def test_strategy_tradeoff_on_the_clock_the_runs_call_for_with_changed_worlds_marked():
    frame = pd.DataFrame({"config.strategy": ["shrink", "shrink", "checkpoint_restart", "checkpoint_restart"],
                          "outcome": ["completed"] * 4, "final_test_accuracy": [0.95] * 4,
                          "baseline_accuracy": [0.96] * 4, "overhead_pct": [-40.0, -44.0, 30.0, 34.0],
                          "rank_overhead_pct": [8.0, 12.0, 60.0, 64.0], "world_changed": [True, True, False, False],
                          "oversubscribed": [True] * 4})
    fig = plots.strategy_tradeoff(frame)  # oversubscribed: rank-time by default
    shrink = next(t for t in fig.data if t.name.startswith("shrink"))
    assert shrink.x[0] == 10.0 and "world changed" in shrink.name and shrink.marker.symbol.endswith("-open")
    assert fig.layout.xaxis.title.text == "runtime overhead (% of the failure-free run, rank-time clock)"
    assert any("world size changed (shrink)" in a.text for a in fig.layout.annotations)
    restart = next(t for t in fig.data if t.name.startswith("checkpoint_restart"))
    assert "world changed" not in restart.name and not restart.marker.symbol.endswith("-open")
    wall = plots.strategy_tradeoff(frame, clock="wall")
    assert next(t for t in wall.data if t.name.startswith("shrink")).x[0] == -42.0
    assert wall.layout.xaxis.title.text.endswith("wall clock)")
    assert plots.strategy_tradeoff(frame.assign(oversubscribed=False)).layout.xaxis.title.text.endswith("wall clock)")
    with pytest.raises(ValueError, match="no rank_overhead_pct column"):
        plots.strategy_tradeoff(frame.drop(columns="rank_overhead_pct"), clock="rank")
    with pytest.raises(ValueError, match="clock must be one of wall, rank"):
        plots.strategy_tradeoff(frame, clock="cpu")


def test_strategy_tradeoff_in_percent_with_failed_runs_apart():
    frame = pd.DataFrame({"config.strategy": ["rollback", "rollback", "none", "none"],
                          "outcome": ["completed", "completed", "failed", "failed"],
                          "final_test_accuracy": [0.95, 0.96, None, None], "baseline_accuracy": [0.96] * 4,
                          "overhead_s": [0.5, 0.7, None, None], "overhead_pct": [5.0, 7.0, None, None]})
    fig = plots.strategy_tradeoff(frame)
    assert [t.name for t in fig.data] == ["rollback (2 runs)"]  # the failed runs are no trade-off point
    assert fig.data[0].x[0] == 6.0 and "%" in fig.layout.xaxis.title.text
    assert "runs that failed: none: 2" in fig.layout.annotations[0].text
    assert all(t.mode == "markers" for t in fig.data)  # no text labels to overlap: the legend names them


def test_strategy_tradeoff_lists_runs_without_a_reference_apart_instead_of_drawing_them_at_zero():
    frame = pd.DataFrame({"config.strategy": ["rollback", "rollback", "shrink", "shrink"],
                          "outcome": ["completed"] * 4, "final_test_accuracy": [0.95, 0.96, 0.97, 0.97],
                          "baseline_accuracy": [0.96, 0.96, None, None], "overhead_s": [0.5, 0.7, None, None],
                          "overhead_pct": [5.0, 7.0, None, None]})
    fig = plots.strategy_tradeoff(frame)
    assert [t.name for t in fig.data] == ["rollback (2 runs)"]
    assert fig.layout.annotations[0].text == "not trade-off points: no failure-free reference: shrink: 2"


def test_bit_sensitivity_heatmap_and_scaling():
    trials = pd.DataFrame({"bit": [0, 0, 30, 30], "field": ["mantissa"] * 2 + ["exponent"] * 2,
                           "outcome": ["masked", "masked", "nonfinite", "degraded"]})
    fig = plots.bit_sensitivity(trials)
    (heat,) = fig.data
    assert list(heat.x) == [0, 30] and "nonfinite" in heat.y
    rows = pd.DataFrame({"model": ["small"] * 4, "strategy": ["shrink", "shrink", "reinit", "reinit"],
                         "world_size": [2, 4, 2, 4], "resume_s": [0.02, 0.05, 0.06, 0.08]})
    assert len(plots.scaling(rows).data) == 2


def test_gossip_vs_allreduce_panels():
    rows = []
    for name, speed in (("allreduce", 1.0), ("gossip", 0.7)):
        for step in range(0, 50, 10):
            rows.append({"parallelism": name, "step": step, "time": step * 0.01 * speed, "test_acc": step / 60,
                         "consensus_distance": 0.0 if name == "allreduce" else 1 / (step + 1)})
    fig = plots.gossip_vs_allreduce(pd.DataFrame(rows))
    assert len(fig.data) == 6 and {t.name for t in fig.data} == {"allreduce", "gossip"}
    two = plots.gossip_vs_allreduce(pd.DataFrame(rows).drop(columns="consensus_distance"))
    assert len(two.data) == 4


def test_traffic_lines_per_parallelism():
    rows = [{"parallelism": m, "world_size": p, "step": s, "messages": (2 * (p - 1) if m == "data" else 3),
             "bytes_sent": 100.0 * p} for m in ("data", "gossip") for p in (2, 4, 8) for s in range(3)]
    fig = plots.traffic(pd.DataFrame(rows))
    data = {t.name: list(t.y) for t in fig.data if t.showlegend is not False}
    assert data == {"data": [2, 6, 14], "gossip": [3, 3, 3]}


def test_outcome_comparison_stacks_shares():
    frame = pd.DataFrame({"parallelism": ["data"] * 4 + ["pipeline"] * 2, "target": ["weight"] * 6,
                          "outcome": ["masked", "masked", "masked", "nonfinite", "degraded", "masked"]})
    fig = plots.outcome_comparison(frame)
    shares = {t.name: list(t.y) for t in fig.data}
    assert shares == {"masked": [0.75, 0.5], "degraded": [0.0, 0.5], "nonfinite": [0.25, 0.0]}


def test_apoptosis_panels_and_removal_marks():
    from workbench.results.run_result import RunResult

    def result(shrinks):
        metrics = [{"step": s, "time": s * 0.01, "loss": 1.0, "train_acc": 0.5, "samples": 64,
                    "test_acc": 0.9 if s % 5 == 4 else float("nan"), "step_time": 0.01 - 0.005 * (s > 5 and shrinks),
                    "parameters": 1000 - 600 * (s > 5 and shrinks), "hidden_units": 100} for s in range(10)]
        events = [{"time": 0.05, "step": 5, "rank": -1, "kind": "apoptosis", "detail": "fc1: 6 units removed"}] \
            if shrinks else []
        return RunResult({}, metrics, events, [], {})

    fig = plots.apoptosis({"apoptosis": result(True), "baseline": result(False)})
    lines = [t for t in fig.data if t.mode != "markers"]
    assert len(lines) == 6 and {t.name for t in lines} == {"apoptosis", "baseline"}
    (mark,) = [t for t in fig.data if t.mode == "markers"]
    assert list(mark.x) == [5] and list(mark.y) == [1000] and "6 units" in mark.hovertext[0]
    assert list(lines[0].y)[-1] == 400 and list(lines[3].y)[-1] == 1000


def _tradeoff_frame(forward_loss: float) -> pd.DataFrame:
    """Three seeds whose failure-free runs end at 60, 62 and 64 %; rollback loses nothing, forward ``forward_loss``."""
    free = {0: 0.60, 1: 0.62, 2: 0.64}
    rows = [{"config.strategy": strategy, "config.seed": s, "outcome": "completed", "baseline_accuracy": a,
             "final_test_accuracy": a - loss / 100, "overhead_pct": 5.0 + s}
            for strategy, loss in (("rollback", 0.0), ("forward", forward_loss)) for s, a in free.items()]
    return pd.DataFrame(rows)


def test_the_tradeoff_draws_95_percent_intervals_and_the_failure_free_band():
    fig = plots.strategy_tradeoff(_tradeoff_frame(forward_loss=12.0))
    forward = next(t for t in fig.data if t.name.startswith("forward"))
    assert abs(forward.y[0] - 12.0) < 1e-9 and abs(forward.error_y.array[0]) < 1e-9  # the same loss every seed
    rollback = next(t for t in fig.data if t.name.startswith("rollback"))
    assert abs(rollback.error_x.array[0] - 4.303 * 1.0 / 3 ** 0.5) < 1e-6  # overheads 5, 6, 7: sd 1, t(2) = 4.303
    band = fig.layout.shapes[0]
    assert abs(band.y1 - 4.303 * 2.0 / 3 ** 0.5) < 1e-6 and band.y0 == -band.y1  # accuracies 60, 62, 64: sd 2
    assert not any("within the failure-free" in (a.text or "") for a in fig.layout.annotations)


def test_the_tradeoff_says_so_when_every_strategy_sits_inside_the_failure_free_band():
    fig = plots.strategy_tradeoff(_tradeoff_frame(forward_loss=1.0))  # 1 pt, inside +-5.0
    said = [a.text for a in fig.layout.annotations if "within the failure-free" in (a.text or "")]
    assert len(said) == 1 and "±5.0 pt over 3 seeds" in said[0]
