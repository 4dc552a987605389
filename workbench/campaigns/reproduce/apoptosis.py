"""*Adaptive neuron apoptosis for accelerating deep learning on large scale systems* (Siegel, Daily, Vishnu,
arXiv 1610.00790): neurons that stop contributing are removed while training runs.

The finding, in our words: the network becomes several times smaller, and trains faster, at little or no cost
in accuracy. The campaign: per seed and world size, runs without apoptosis, with the frozen setting, and with the
threshold rule alone (``lasso=0``), every arm flushing subnormals alike and training on the same data (the run
without apoptosis holds out and folds back the rule's validation split as the others do: :func:`arm_setting`); the
rule decides on a validation split, the accuracy is the test set's. The paper scale is the registry's workload (or
its replication's, ``entry``), on reporting seeds drawn at run time; the registered findings decide (docs/apoptosis.md).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from workbench.campaigns.reproduce.common import (
    Verdict,
    cached_run,
    campaign_settings,
    fmt,
    mean_interval,
    preflight,
    progress,
    run_extras,
)

KEY = "apoptosis"
TITLE = "Adaptive neuron apoptosis"
PAPER = ("Removing neurons that no longer contribute, with a threshold adapted to the accuracy, shrinks the network "
         "several-fold and speeds training up (the paper: 2-3x) while the accuracy stays within about a point.")
ARMS = ("off", "on", "threshold only (lasso=0)")

SCALES: dict[str, dict[str, Any]] = {
    # the mechanism only, cheap (nbval): the digits MLP, world 2, two tuning seeds
    "small": {"model": "mlp", "dataset": "digits", "synthetic_size": 4096, "worlds": [2], "seeds": [10, 11],
              "steps": 400, "apoptosis": "on", "width": 1.0, "lr_schedule": "constant", "ablation": True,
              "flush_denormal": True},
    # the registry's apoptosis.workload (vgg11 on synthetic_noisy, the frozen setting) replaces these; the seeds
    # are the reporting seeds drawn when the campaign first runs, unless given (then it is a tuning run)
    "paper": {"seeds": []},
}


# the design's dataset (benchmarks/apoptosis_design_cnn.py)
DESIGN_DATA = "workbench.campaigns.reproduce.apoptosis:design_data"


def design_data(size: int = 8192, held: float = 0.125) -> tuple[Any, Any, Any, Any]:
    """synthetic_image(``size``)'s *training* data split for the design: (x, y) to train on and (x, y) of a
    held-out validation split (a fixed ``held`` share) in the place of the test split, which is never loaded;
    normalised as ``synthetic_image`` normalises, by the design's training part."""
    import numpy as np

    from workbench.workloads.datasets import image_dataset, synthetic_image

    data = synthetic_image(size)
    x, y = data.x_train.numpy(), data.y_train.numpy()
    order = np.random.default_rng(20261126).permutation(len(y))
    val, train = np.sort(order[:round(held * len(y))]), np.sort(order[round(held * len(y)):])
    part = image_dataset(x[train], y[train], x[val], y[val])
    return part.normalise(part.x_train), part.y_train, part.normalise(part.x_test), part.y_test


# more units than any layer has: a rule with this ``min`` keeps every unit (it removes what exceeds a layer's min)
KEEP_EVERY_UNIT = 10**9


def arm_setting(arm: str, frozen: str) -> str:
    """The ``--apoptosis`` setting of ``arm``: the frozen setting (``on``), the frozen setting without pressure
    (threshold only), or (``off``) the frozen setting with neither pressure nor removal. The run without apoptosis
    still runs the rule's schedule so that it trains on the same data as the other arms: the same validation split
    held out, folded back at the same step (``val``, ``fold``, ``until``, ``window`` as frozen); it removes
    nothing and presses nothing."""
    if arm == "on":
        return frozen
    kept = [] if frozen == "on" else [p for p in frozen.split(",") if p.split("=", 1)[0] not in ("lasso", "min")]
    return ",".join([*kept, "lasso=0", *([f"min={KEEP_EVERY_UNIT}"] if arm == "off" else [])])


def _data(settings: dict[str, Any]) -> dict[str, Any]:
    return {"model": settings["model"], "dataset": settings["dataset"], "synthetic_size": settings["synthetic_size"],
            **run_extras(settings)}


def arm_run(settings: dict[str, Any], world: int, apoptosis: str | None) -> dict[str, Any]:
    """An arm's run at ``world`` (settings but the seed), with the apoptosis setting ``apoptosis``
    (:func:`arm_setting`)."""
    return {"world_size": world, "steps": settings["steps"], "eval_interval": max(settings["steps"] // 20, 1),
            "apoptosis": apoptosis, **_data(settings)}


def failure_free_runs(settings: dict[str, Any]) -> list[tuple[int, dict[str, Any]]]:
    """(world, run settings but the seed) of the runs without apoptosis that ``accuracy_kept`` compares against."""
    off = arm_setting("off", settings["apoptosis"])
    return [(world, arm_run(settings, world, off)) for world in settings["worlds"]]


def campaign(scale: str = "small", out: str | Path = "runs/reproduce/apoptosis", entry: str = KEY,
             **overrides: Any) -> Any:
    """Every (world size, seed, arm) of the scale, run or loaded; one row per run with the paired run without
    apoptosis (parameter reduction, accuracy change in points, training time ratio on the rank-time clock).
    Settings: :func:`workbench.campaigns.reproduce.common.campaign_settings` (at "paper" the registry's workload of
    ``entry``: ``apoptosis`` or its replication, ``apoptosis_replication``). Every arm runs with the same
    ``flush_denormal`` (subnormals flushed to zero with and without apoptosis: the flush is no part of the speed-up)."""
    import pandas as pd

    settings = campaign_settings(entry, SCALES, scale, out, overrides)
    data = _data(settings)
    arms = ARMS if settings["ablation"] else ARMS[:2]  # the threshold-only ablation, where the scale runs it
    setting = {arm: arm_setting(arm, settings["apoptosis"]) for arm in arms}
    runs = [(world, seed, arm) for world in settings["worlds"] for seed in settings["seeds"] for arm in arms]
    # every kind of run checked first (a model apoptosis cannot shrink is refused before the runs without it)
    preflight(*[{"world_size": world, "apoptosis": setting[arm], **data} for world in settings["worlds"]
                for arm in arms])
    results = {}
    progress(entry, len(runs), into=out)
    for world, seed, arm in runs:
        results[world, seed, arm] = cached_run(
            Path(out) / "runs" / f"w{world}-s{seed}-{arm.split(' ')[0]}", seed=seed,
            **arm_run(settings, world, setting[arm]))
    rows = []
    for (world, seed, arm), result in results.items():
        off = results[world, seed, "off"]
        s, size = result.summary, result.summary.get("parameters") or {}
        ok = result.completed and off.completed
        ratio = _ratio(s.get("rank_train_s"), off.summary.get("rank_train_s")) if ok else None
        rows.append({"arm": arm, "world_size": world, "seed": seed, "outcome": result.outcome,
                     "reason": s["reason"], "reporting": settings["reporting"],
                     "parameters_start": size.get("start"), "parameters_end": size.get("end"),
                     "reduction": size["start"] / size["end"] if size.get("end") else None,
                     "accuracy": s["final_test_accuracy"],
                     "accuracy_change_pt": 100 * (s["final_test_accuracy"] - off.summary["final_test_accuracy"])
                     if ok else None,
                     "train_s": s["train_s"], "rank_train_s": s.get("rank_train_s"),
                     # training time on the rank-time clock: world 4 shares the machine's cores
                     "time_ratio": ratio, "log_speedup": -math.log(ratio) if ratio else None})
    return pd.DataFrame(rows)


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def table(frame: Any) -> Any:
    """Per arm and world size: parameter reduction (min, median), accuracy change (mean with its 95 % interval
    over seeds, worst) and training time against the run without apoptosis (median ratio, rank-time clock)."""
    arms = frame[frame.arm != "off"].groupby(["arm", "world_size"])
    stats = arms.agg(runs=("seed", "size"), reduction_min=("reduction", "min"),
                     reduction_median=("reduction", "median"), accuracy_worst_pt=("accuracy_change_pt", "min"),
                     time_ratio_median=("time_ratio", "median"))
    interval = arms.accuracy_change_pt.apply(lambda v: mean_interval(v))
    stats["accuracy_mean_pt"] = [i[0] for i in interval]
    stats["accuracy_mean_low"] = [i[1] for i in interval]
    stats["accuracy_mean_high"] = [i[2] for i in interval]
    return stats.reset_index()


def verdict(frame: Any, scale: str, entry: str = KEY) -> Verdict:
    """The registered findings (registry.yaml, ``entry``: ``apoptosis`` or its replication): fewer_parameters
    (exact: a check over every run), accuracy_kept and training_faster (decided from their intervals, pairs of every
    world and seed), the secondary paper_magnitude (the same log speed-ups against log 2: the paper's >= 2x); and
    the mechanism: every run completes, the rule removed units, the threshold-only ablation reported (at the paper
    scale where the registered workload runs it: ``ablation``)."""
    v = Verdict(entry, TITLE, PAPER, scale)
    v.statistics = {"runs": len(frame), "completed": int((frame.outcome == "completed").sum()),
                    "seeds": sorted(frame.seed.unique().tolist()), "worlds": sorted(frame.world_size.unique().tolist())}
    bad = frame[frame.outcome != "completed"]
    v.check("every run completes", not len(bad), "; ".join(f"{r.arm} w{r.world_size} seed {r.seed}: {r.reason}"
                                                           for r in bad.itertuples()) or f"{len(frame)} runs")
    on = frame[(frame.arm == "on") & (frame.outcome == "completed")]
    if on.empty:
        v.comparable, v.reason = False, "no run with apoptosis completed"
        return v
    v.check("the rule removed units in every run with apoptosis", bool((on.reduction > 1).all()),
            f"parameters / {on.reduction.min():.2f} at least")
    worst, reduction = on.loc[on.reduction.idxmin()], _margin(entry, "fewer_parameters")
    v.check(f"fewer_parameters: the parameters shrink >= {reduction:g}x in every run",
            bool((on.reduction >= reduction).all()) and len(on) == int((frame.arm == "on").sum()),
            f"/ {on.reduction.min():.2f} at least (world {worst.world_size}, seed {worst.seed}), "
            f"/ {on.reduction.median():.2f} median over {len(on)} runs")
    off = frame[(frame.arm == ARMS[0]) & (frame.outcome == "completed")]
    v.decide(f"{entry}.accuracy_kept", on.accuracy_change_pt.dropna(), "apoptosis - none, pt",
             reference=float(off.accuracy.mean()) if "accuracy" in off and len(off) else None)
    v.decide(f"{entry}.training_faster", on.log_speedup.dropna(), "log(none / apoptosis), rank-time clock")
    # secondary: the paper's magnitude, from the same runs (where the registry holds it)
    if f"{entry}.paper_magnitude" in _registered():
        v.decide(f"{entry}.paper_magnitude", on.log_speedup.dropna(), "log(none / apoptosis) against log 2")
    alone = frame[(frame.arm == ARMS[2]) & (frame.outcome == "completed")]
    if not (frame.arm == ARMS[2]).any() and scale == "paper" and not _registered_workload(entry).get("ablation"):
        return v  # a registration may leave the ablation out (registry: <entry>.workload.ablation)
    v.statistics["threshold_only"] = {  # the paper's rule alone: what it removes, costs and saves here
        "reduction_median": float(alone.reduction.median()) if len(alone) else None,
        "accuracy_mean_pt": fmt(mean_interval(alone.accuracy_change_pt.dropna()), " pt") if len(alone) else None,
        "time_ratio_median": float(alone.time_ratio.median()) if len(alone) and "time_ratio" in alone else None}
    v.check("the threshold-only ablation (lasso=0) is reported", len(alone) == int((frame.arm == "on").sum()),
            f"{len(alone)} runs: parameters / {v.statistics['threshold_only']['reduction_median'] or 0:.2f} median, "
            f"accuracy {v.statistics['threshold_only']['accuracy_mean_pt']}, time with / without "
            f"{v.statistics['threshold_only']['time_ratio_median'] or math.nan:.2f} median")
    return v


def _registered() -> dict[str, Any]:
    from workbench.campaigns.reproduce import registry

    return registry.load().findings


def _margin(entry: str, finding: str) -> float:
    """The margin ``entry``'s registered ``finding`` is decided at (registry.yaml): read, never restated."""
    from workbench.campaigns.reproduce import registry

    return registry.load().finding(f"{entry}.{finding}").margin


def _registered_workload(entry: str) -> dict[str, Any]:
    from workbench.campaigns.reproduce import registry

    return registry.load().workload(entry)


def figure(frame: Any, entry: str = KEY) -> Any:
    """Parameter reduction against accuracy change per run, one colour per arm, one marker per world size; the
    registered margins (``entry``'s fewer_parameters and accuracy_kept) drawn as dotted lines."""
    import plotly.graph_objects as go

    fig = go.Figure()
    symbols = ["circle", "diamond", "square"]
    for arm in ARMS[1:]:
        for k, world in enumerate(sorted(frame.world_size.unique())):
            part = frame[(frame.arm == arm) & (frame.world_size == world)]
            fig.add_trace(go.Scatter(x=part.reduction, y=part.accuracy_change_pt, mode="markers",
                                     name=f"{arm} (world {world})", marker={"size": 10, "symbol": symbols[k % 3]},
                                     text=[f"seed {s}" for s in part.seed], hoverinfo="text+x+y"))
    fig.add_hline(y=-_margin(entry, "accuracy_kept"), line={"dash": "dot", "color": "grey"})
    fig.add_vline(x=_margin(entry, "fewer_parameters"), line={"dash": "dot", "color": "grey"})
    fig.update_layout(title="apoptosis per seed: parameters removed vs accuracy change (test set)",
                      xaxis_title="parameters: without / with apoptosis (x)",
                      yaxis_title="test accuracy change (points)", template="plotly_white", height=440)
    return fig
