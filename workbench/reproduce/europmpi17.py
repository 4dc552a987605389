"""*What does fault tolerant deep learning need from MPI?* (EuroMPI'17): shrink-and-continue (ULFM), a global
Reinit and checkpoint-restart, against 0-3 permanent failures of the ranks of a data-parallel run.

The finding, in our words: every survivor holds a full replica, so the job can shrink and continue with the
accuracy of a failure-free run; Reinit and checkpoint-restart bring the world back but redo the steps since the
saved state. The campaign: ``k`` = 0..3 ranks killed at evenly spaced steps under ``shrink``, ``reinit`` and
``checkpoint_restart``, per seed; the MPI layer is our gloo generations. Details: docs/reproduce.md.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from workbench import strategies
from workbench.reproduce.common import Verdict, cached_run, fmt, mean_interval, one_sided, scale_settings

KEY = "europmpi17"
TITLE = "What fault-tolerant DL needs from MPI (EuroMPI'17)"
PAPER = ("Data-parallel training survives permanent failures by shrinking the communicator and continuing: no "
         "checkpoint is needed (every survivor holds the model) and accuracy stays that of the failure-free run "
         "after several failures; Reinit and checkpoint-restart restore the world but redo the steps since the "
         "last saved state.")
STRATEGIES = ("shrink", "reinit", "checkpoint_restart")

SCALES: dict[str, dict[str, Any]] = {
    "small": {"world": 4, "failures": [0, 2], "seeds": [0, 1], "steps": 100, "snapshot_every": 30},
    "paper": {"world": 8, "failures": [0, 1, 2, 3], "seeds": [0, 1, 2, 3, 4], "steps": 200, "snapshot_every": 50},
}


def kills(world: int, steps: int, k: int, offset: int = 0) -> list[str]:
    """``k`` distinct ranks killed at evenly spaced steps, shifted by ``offset`` (rank 0 among them from the second
    on: any rank may die). The campaign shifts them by half a snapshot interval: a kill that lands exactly on a
    snapshot would redo nothing and hide what Reinit and checkpoint-restart cost."""
    ranks = [world - 1 - i for i in range(k)]
    if k >= 2:
        ranks[1] = 0
    return [f"kill:rank={r},step={steps * (i + 1) // (k + 1) + offset}" for i, r in enumerate(ranks)]


def campaign(scale: str = "small", out: str | Path = "runs/reproduce/europmpi17", model: str = "mlp",
             dataset: str = "digits", **overrides: Any) -> Any:
    """Every (strategy, failures, seed) of the scale, run or loaded; one row per run."""
    import pandas as pd

    settings = scale_settings(SCALES, scale, overrides)
    world, steps = settings["world"], settings["steps"]
    rows = []
    for seed in settings["seeds"]:
        common = {"world_size": world, "steps": steps, "seed": seed, "model": model, "dataset": dataset,
                  "eval_interval": max(steps // 10, 1)}
        for strategy in STRATEGIES:
            snapshots = strategies.get(strategy).checkpoint_every is not None  # then every snapshot_every steps
            extra = {"checkpoint_every": settings["snapshot_every"]} if snapshots else {}
            for k in settings["failures"]:
                result = cached_run(Path(out) / "runs" / f"s{seed}-{strategy}-k{k}", **common, strategy=strategy,
                                    faults=kills(world, steps, k, settings["snapshot_every"] // 2), **extra)
                s = result.summary
                rows.append({"strategy": strategy, "failures": k, "seed": seed, "world_size": world,
                             "outcome": result.outcome, "reason": s["reason"],
                             "final_test_accuracy": s["final_test_accuracy"], "wall_train_s": s["train_s"],
                             "train_s": s.get("rank_train_s", s["train_s"]),  # rank-time: 8 ranks on the cores
                             "world_size_final": s["world_size_final"], "steps_redone": s["steps_redone_total"],
                             "samples_lost": s["samples_lost_total"], "checkpoints": s["checkpoints"]})
    return pd.DataFrame(rows)


def statistics(frame: Any) -> Any:
    """Per strategy and number of failures: completed runs, accuracy and training time on the rank-time clock
    (mean, 95 % interval)."""
    import pandas as pd

    rows = []
    for (strategy, k), part in frame.groupby(["strategy", "failures"], sort=False):
        done = part[part.outcome == "completed"]
        acc, time = mean_interval(100 * done.final_test_accuracy), mean_interval(done.train_s)
        rows.append({"strategy": strategy, "failures": k, "runs": len(part), "completed": len(done),
                     "accuracy_pct": acc[0], "accuracy_low": acc[1], "accuracy_high": acc[2], "train_s": time[0],
                     "train_low": time[1], "train_high": time[2], "steps_redone": done.steps_redone.mean(),
                     "world_size_final": done.world_size_final.mean(), "checkpoints": done.checkpoints.mean()})
    return pd.DataFrame(rows)


def _loss_vs_none(frame: Any, strategy: str, k: int) -> list[float]:
    """Accuracy (points) of the failure-free run minus that of the run with ``k`` failures, paired by seed."""
    done = frame[(frame.outcome == "completed") & (frame.strategy == strategy)].set_index(["failures", "seed"])
    base, hit = done.loc[0].final_test_accuracy, done.loc[k].final_test_accuracy
    both = base.index.intersection(hit.index)
    return (100 * (base[both] - hit[both])).tolist()


def verdict(frame: Any, scale: str) -> Verdict:
    v = Verdict(KEY, TITLE, PAPER, scale)
    v.statistics = {"runs": len(frame), "completed": int((frame.outcome == "completed").sum()),
                    "seeds": sorted(frame.seed.unique().tolist()), "world_size": int(frame.world_size.iloc[0]),
                    "failures": sorted(frame.failures.unique().tolist())}
    failed = frame[frame.outcome != "completed"]
    if len(failed):
        v.check("every run completes", False, "; ".join(f"{r.strategy} k={r.failures} seed {r.seed}: {r.reason}"
                                                         for r in failed.itertuples()))
    if 0 not in set(frame.failures) or frame.failures.max() == 0:
        v.comparable, v.reason = False, "the campaign needs failure-free runs and runs with failures"
        return v
    world = int(frame.world_size.iloc[0])
    for k in sorted(set(frame.failures) - {0}):
        shrink = frame[(frame.strategy == "shrink") & (frame.failures == k) & (frame.outcome == "completed")]
        continued = len(shrink) and (shrink.world_size_final == world - k).all()
        v.check(f"shrink continues on the survivors (k={k})",
                continued and (shrink.steps_redone == 0).all() and (shrink.checkpoints == 0).all(),
                f"world {world} -> {sorted(shrink.world_size_final.unique().tolist())}, steps redone "
                f"{int(shrink.steps_redone.sum())}, checkpoints written {int(shrink.checkpoints.sum())}")
        loss = one_sided(_loss_vs_none(frame, "shrink", k))
        v.check(f"shrink keeps the failure-free accuracy (k={k})", loss[0] <= 1.0,
                f"accuracy lost vs the failure-free run, paired by seed: {fmt(loss, ' pt')} (mean <= 1 pt)")
        for strategy in ("reinit", "checkpoint_restart"):
            runs = frame[(frame.strategy == strategy) & (frame.failures == k) & (frame.outcome == "completed")]
            v.check(f"{strategy} restores the world and redoes steps (k={k})",
                    len(runs) and (runs.world_size_final == world).all() and (runs.steps_redone > 0).all(),
                    f"world -> {sorted(runs.world_size_final.unique().tolist())}, mean steps redone "
                    f"{runs.steps_redone.mean():.1f}")
    return v


def figure(frame: Any) -> Any:
    """Accuracy and training time against the number of failures, one line per strategy (mean, 95 % interval)."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    stats = statistics(frame)
    fig = make_subplots(rows=1, cols=2, subplot_titles=("test accuracy (%)", "training time (s, rank-time clock)"))
    for i, (strategy, part) in enumerate(stats.groupby("strategy", sort=False)):
        part = part.sort_values("failures")
        for col, (y, low, high) in enumerate([("accuracy_pct", "accuracy_low", "accuracy_high"),
                                               ("train_s", "train_low", "train_high")], start=1):
            fig.add_trace(go.Scatter(x=part.failures, y=part[y], mode="lines+markers", name=strategy,
                                     legendgroup=strategy, showlegend=col == 1, line={"color": _COLORS[i % 3]},
                                     error_y={"type": "data", "symmetric": False, "array": part[high] - part[y],
                                              "arrayminus": part[y] - part[low]}), row=1, col=col)
    fig.update_xaxes(title_text="ranks failed", dtick=1)
    fig.update_layout(title=f"{int(frame.world_size.iloc[0])} ranks: shrink vs reinit vs checkpoint-restart",
                      template="plotly_white", height=420)
    return fig


_COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c")
