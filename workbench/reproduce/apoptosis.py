"""*Adaptive neuron apoptosis for accelerating deep learning on large scale systems* (Siegel, Daily, Vishnu,
arXiv 1610.00790): neurons that stop contributing are removed while training runs.

The paper's finding, in our words: removing the neurons whose weights no longer contribute, with a threshold
that adapts to the accuracy, makes the network several times smaller, and training faster, at little or no
cost in accuracy (the paper: up to ~4x faster training on its MLPs/CNNs with accuracy within about a point).

The campaign: per seed and world size, the same run without apoptosis, with it (``apoptosis="on"``: our
reading, the threshold rule plus a fading group-lasso pressure, docs/apoptosis.md) and with the threshold rule
alone (``lasso=0``: the ablation that shows what the pressure adds). The rule decides on a validation split
carved from the training data; the accuracy reported is the test set's, which the rule never sees.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from workbench.reproduce.common import Verdict, cached_run

KEY = "apoptosis"
TITLE = "Adaptive neuron apoptosis"
PAPER = ("Removing neurons that no longer contribute, with a threshold adapted to the accuracy, shrinks the network "
         "several-fold and speeds training up (the paper: up to ~4x) while the accuracy stays within about a point.")
ARMS = {"off": None, "on": "on", "threshold only (lasso=0)": "lasso=0"}
AIMS = {"reduction": 3.0, "median_pt": -0.5, "worst_pt": -1.5}  # the aims for our reading (README)

SCALES: dict[str, dict[str, Any]] = {
    "small": {"worlds": [2], "seeds": [0, 1], "steps": 300},
    "paper": {"worlds": [2, 4], "seeds": list(range(10)), "steps": 400},
}


def campaign(scale: str = "small", out: str | Path = "runs/reproduce/apoptosis", model: str = "mlp",
             dataset: str = "digits", **overrides: Any) -> Any:
    """Every (world size, seed, arm) of the scale, run or loaded; one row per apoptosis run with the paired
    run without it (parameter reduction, accuracy change in points, training time ratio)."""
    import pandas as pd

    settings = {**SCALES[scale], **overrides}
    rows = []
    for world in settings["worlds"]:
        for seed in settings["seeds"]:
            runs = {}
            for arm, rule in ARMS.items():
                name = arm.split(" ")[0]
                runs[arm] = cached_run(Path(out) / "runs" / f"w{world}-s{seed}-{name}", world_size=world, seed=seed,
                                       steps=settings["steps"], model=model, dataset=dataset,
                                       eval_interval=max(settings["steps"] // 20, 1), apoptosis=rule)
            off = runs["off"].summary
            for arm, result in runs.items():
                s = result.summary
                size = s.get("parameters") or {}
                ok = result.completed and runs["off"].completed
                rows.append({"arm": arm, "world_size": world, "seed": seed, "outcome": result.outcome,
                             "reason": s["reason"], "parameters_start": size.get("start"),
                             "parameters_end": size.get("end"),
                             "reduction": size["start"] / size["end"] if size.get("end") else None,
                             "accuracy": s["final_test_accuracy"],
                             "accuracy_change_pt": 100 * (s["final_test_accuracy"] - off["final_test_accuracy"])
                             if ok else None,
                             "train_s": s["train_s"], "time_ratio": s["train_s"] / off["train_s"] if ok else None})
    return pd.DataFrame(rows)


def table(frame: Any) -> Any:
    """Per arm and world size: parameter reduction (min, median), accuracy change (median, worst) and training
    time against the run without apoptosis (median ratio)."""
    arms = frame[frame.arm != "off"].groupby(["arm", "world_size"])
    return arms.agg(runs=("seed", "size"), reduction_min=("reduction", "min"),
                    reduction_median=("reduction", "median"), accuracy_median_pt=("accuracy_change_pt", "median"),
                    accuracy_worst_pt=("accuracy_change_pt", "min"), time_ratio_median=("time_ratio", "median")
                    ).reset_index()


def verdict(frame: Any, scale: str) -> Verdict:
    v = Verdict(KEY, TITLE, PAPER, scale)
    v.statistics = {"runs": len(frame), "completed": int((frame.outcome == "completed").sum()),
                    "seeds": sorted(frame.seed.unique().tolist()), "worlds": sorted(frame.world_size.unique().tolist())}
    bad = frame[frame.outcome != "completed"]
    if len(bad):
        v.check("every run completes", False, "; ".join(f"{r.arm} w{r.world_size} seed {r.seed}: {r.reason}"
                                                         for r in bad.itertuples()))
    stats = table(frame).set_index(["arm", "world_size"])
    for world in sorted(frame.world_size.unique()):
        on = stats.loc[("on", world)]
        v.check(f"the network shrinks >= {AIMS['reduction']:g}x (world {world})", on.reduction_min >= AIMS["reduction"],
                f"parameters / {on.reduction_min:.2f} at least, / {on.reduction_median:.2f} median")
        v.check(f"accuracy stays: median >= {AIMS['median_pt']} pt, worst >= {AIMS['worst_pt']} pt (world {world})",
                on.accuracy_median_pt >= AIMS["median_pt"] and on.accuracy_worst_pt >= AIMS["worst_pt"],
                f"median {on.accuracy_median_pt:+.2f} pt, worst {on.accuracy_worst_pt:+.2f} pt")
        v.check(f"training gets faster (world {world})", on.time_ratio_median < 1.0,
                f"training time with / without apoptosis: {on.time_ratio_median:.2f} (median)")
        alone = stats.loc[("threshold only (lasso=0)", world)]
        v.statistics[f"threshold_only_w{world}"] = {"reduction_median": float(alone.reduction_median),
                                                    "accuracy_median_pt": float(alone.accuracy_median_pt)}
    return v


def figure(frame: Any) -> Any:
    """Parameter reduction against accuracy change per run, one colour per arm, one marker per world size."""
    import plotly.graph_objects as go

    fig = go.Figure()
    symbols = ["circle", "diamond", "square"]
    for arm in [a for a in ARMS if a != "off"]:
        for k, world in enumerate(sorted(frame.world_size.unique())):
            part = frame[(frame.arm == arm) & (frame.world_size == world)]
            fig.add_trace(go.Scatter(x=part.reduction, y=part.accuracy_change_pt, mode="markers",
                                     name=f"{arm} (world {world})", marker={"size": 10, "symbol": symbols[k % 3]},
                                     text=[f"seed {s}" for s in part.seed], hoverinfo="text+x+y"))
    fig.add_hline(y=AIMS["median_pt"], line={"dash": "dot", "color": "grey"})
    fig.add_vline(x=AIMS["reduction"], line={"dash": "dot", "color": "grey"})
    fig.update_layout(title="apoptosis per seed: parameters removed vs accuracy change (test set)",
                      xaxis_title="parameters: without / with apoptosis (x)",
                      yaxis_title="test accuracy change (points)", template="plotly_white", height=440)
    return fig
