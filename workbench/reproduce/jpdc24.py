"""*A Characterization of Soft-error Sensitivity in Data-parallel and Model-parallel Distributed Deep Learning*
(JPDC 2024): checkpoint alteration — bit flips written into a training checkpoint, which is then resumed.

The finding, in our words: high exponent bits wreck training, mantissa flips are almost always masked, more
flips do more damage, and data- and model-parallel training differ in sensitivity (reported, not checked). Two
parts, each on every platform's own checkpoint resumed by that platform: an alteration campaign (1, 10 or 100
flips into one state group, outcome against the unaltered resume) and per-bit sensitivity with Wilson
intervals. Details: docs/reproduce.md and docs/internals.md.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import zlib
from pathlib import Path
from typing import Any

from workbench.reproduce.common import Verdict, cached_run, preflight, scale_settings, wilson

KEY = "jpdc24"
TITLE = "Soft errors in data- and model-parallel DL (JPDC'24)"
PAPER = ("Checkpoint alteration: flips of the high exponent bits wreck training (non-finite or lasting accuracy "
         "loss), mantissa flips are masked; more flips per checkpoint, more damage; data- and model-parallel "
         "platforms differ in sensitivity (no direction given in the abstract: reported as measured).")
GROUPS = {"weights": lambda n: n.startswith("model/") and "running_" not in n,
          "optimizer": lambda n: n.startswith("optimizer/"),
          "buffers": lambda n: n.startswith("model/") and "running_" in n}

SCALES: dict[str, dict[str, Any]] = {
    "small": {"worlds": [2], "platforms": ["data", "pipeline"], "steps": 60, "resume_steps": 20, "flips": [1, 100],
              "groups": ["weights"], "trials": 2, "bits": [30, 22, 0], "per_bit": 10, "bit_steps": 10},
    "paper": {"worlds": [2, 4], "platforms": ["data", "pipeline"], "steps": 300, "resume_steps": 100,
              "flips": [1, 10, 100], "groups": ["weights", "optimizer", "buffers"], "trials": 5,
              "bits": [31, 30, 29, 28, 27, 26, 25, 24, 23, 22, 20, 16, 8, 0], "per_bit": 100, "bit_steps": 20},
}


def campaign(scale: str = "small", out: str | Path = "runs/reproduce/jpdc24", model: str = "lenet5",
             dataset: str = "digits", tolerance: float = 0.01, seed: int = 0, **overrides: Any) -> tuple[Any, Any]:
    """(alteration trials, per-bit trials): one row per altered-checkpoint resume, one per single-bit trial."""
    import pandas as pd

    from workbench.faults.hdf5 import alter_checkpoint, float_datasets
    from workbench.studies.sensitivity import bit_sensitivity

    settings = scale_settings(SCALES, scale, overrides)
    out = Path(out)
    preflight(*[{"world_size": world, "parallelism": platform, "model": model, "dataset": dataset, "seed": seed}
                for world in settings["worlds"] for platform in settings["platforms"]])  # e.g. a model without stages
    rows, bit_frames = [], []
    for world in settings["worlds"]:
        for platform in settings["platforms"]:
            common = {"world_size": world, "parallelism": platform, "model": model, "dataset": dataset, "seed": seed}
            where = out / "runs" / f"{platform}-w{world}"
            trained = cached_run(where / "train", **common, steps=settings["steps"], out=str(where / "train"))
            original = trained.summary["final_checkpoint"]
            resume = {**common, "steps": settings["steps"] + settings["resume_steps"],
                      "eval_interval": max(settings["resume_steps"] // 5, 1)}
            clean = cached_run(where / "clean", **resume, resume=original)
            source = hashlib.sha256(Path(original).read_bytes()).hexdigest()
            sizes = {name: count for name, (count, _) in float_datasets(original).items()}
            names = list(sizes)
            for group in settings["groups"]:
                targets = [n for n in names if GROUPS[group](n)]
                if not targets:
                    continue  # e.g. buffers of a model without batch norm
                for k in settings["flips"]:
                    flipped = min(k, sum(sizes[n] for n in targets))  # lenet5's buffers: 44 values in all
                    for trial in range(settings["trials"]):
                        flip_seed = zlib.crc32(f"{seed}-{world}-{platform}-{group}-{k}-{trial}".encode())
                        # named by what it is made of (the original's content, the datasets, the count, the
                        # seed): another model or scale never finds a stale copy under the same name, and the
                        # cached resume of it (keyed by its path) goes with it
                        recipe = hashlib.sha256(json.dumps([source, targets, flipped, flip_seed]).encode())
                        altered = where / f"{group}-k{k}-t{trial}-{recipe.hexdigest()[:12]}.h5"
                        if not altered.is_file():  # altered aside, then renamed: never a half-altered copy
                            partial = altered.with_name(f".{altered.name}.tmp")
                            alter_checkpoint(original, datasets=targets, count=flipped, seed=flip_seed, out=partial)
                            os.replace(partial, altered)
                        result = cached_run(where / f"{group}-k{k}-t{trial}", **resume, resume=str(altered),
                                            resume_verify=False)
                        rows.append({"platform": platform, "world_size": world, "group": group, "flips": k,
                                     "flipped": flipped, "trial": trial,
                                     **_outcome(result, clean, tolerance, settings["steps"])})
            if world == min(settings["worlds"]):  # per bit: the in-process resume does not depend on the world
                weights = [n[len("model/"):] for n in names if GROUPS["weights"](n)]  # state-dict names
                bits = bit_sensitivity(original, bits=settings["bits"], trials=settings["per_bit"],
                                       steps=settings["bit_steps"], datasets=weights, tolerance=tolerance, seed=seed)
                bit_frames.append(bits.assign(platform=platform))
    return pd.DataFrame(rows), pd.concat(bit_frames, ignore_index=True)


def _outcome(result: Any, clean: Any, tolerance: float, start: int) -> dict[str, Any]:
    from workbench.faults.outcomes import classify

    outcome = classify(result, clean, tolerance)
    golden = {r["step"]: r["loss"] for r in clean.metrics}
    diverged = None
    for r in result.metrics:
        ref = golden.get(r["step"])
        if ref is not None and (not math.isfinite(r["loss"]) or abs(r["loss"] - ref) > 0.1 * abs(ref)):
            diverged = r["step"] - start
            break
    return {"outcome": outcome["outcome"], "accuracy": outcome["accuracy"],
            "accuracy_delta": outcome["accuracy_delta"], "steps_to_divergence": diverged}


def shares(frame: Any, by: list[str]) -> Any:
    """Non-masked share (degraded + non-finite + crash) per ``by`` group, with Wilson intervals."""
    import pandas as pd

    rows = []
    for key, part in frame.groupby(by):
        share, low, high = wilson(int((part.outcome != "masked").sum()), len(part))
        key = key if isinstance(key, tuple) else (key,)
        rows.append({**dict(zip(by, key)), "trials": len(part), "not_masked": share, "low": low, "high": high,
                     **{f"share_{o}": float((part.outcome == o).mean()) for o in ("degraded", "nonfinite", "crash")}})
    return pd.DataFrame(rows)


def verdict(alterations: Any, bits: Any, scale: str) -> Verdict:
    v = Verdict(KEY, TITLE, PAPER, scale)
    v.statistics = {"alteration_resumes": len(alterations), "bit_trials": len(bits),
                    "trials_per_bit": int(bits.groupby(["platform", "bit"]).size().min()) if len(bits) else 0,
                    "platforms": sorted(alterations.platform.unique().tolist()),
                    "worlds": sorted(alterations.world_size.unique().tolist())}
    per_platform = shares(alterations, ["platform"]).set_index("platform")
    v.statistics["not_masked_by_platform"] = per_platform[["trials", "not_masked", "low", "high"]].to_dict("index")
    for platform, part in bits.groupby("platform"):
        hi = part[part.bit == 30]
        mantissa = part[part.bit <= 22]
        if not len(hi) or not len(mantissa):
            v.comparable, v.reason = False, "the per-bit campaign needs bit 30 and mantissa bits"
            return v
        h = wilson(int((hi.outcome != "masked").sum()), len(hi))
        m = wilson(int((mantissa.outcome != "masked").sum()), len(mantissa))
        v.check(f"exponent bit 30 wrecks more often than mantissa bits ({platform})", h[1] > m[2],
                f"not masked: bit 30 {h[0]:.0%} [{h[1]:.0%}, {h[2]:.0%}] of {len(hi)}, mantissa bits {m[0]:.0%} "
                f"[{m[1]:.0%}, {m[2]:.0%}] of {len(mantissa)} (Wilson intervals apart)")
        low_bits = part[part.bit <= 20]
        lo = wilson(int((low_bits.outcome != "masked").sum()), len(low_bits))
        v.check(f"low mantissa flips are masked ({platform})", len(low_bits) and lo[0] <= 0.05,
                f"{lo[0]:.1%} [{lo[1]:.1%}, {lo[2]:.1%}] of {len(low_bits)} flips of bits 0-20 not masked (<= 5 %)")
    per_k = shares(alterations, ["platform", "flips"])
    for platform, part in per_k.groupby("platform"):
        part = part.sort_values("flips")
        first, last = part.iloc[0], part.iloc[-1]
        v.check(f"more flips, more damage ({platform})", last.not_masked > first.not_masked,
                ", ".join(f"{int(r.flips)} flips: {r.not_masked:.0%} of {int(r.trials)} not masked"
                          for r in part.itertuples()))
    return v


def figures(alterations: Any, bits: Any) -> list[Any]:
    """The paper's views: non-masked share per bit (both platforms), per flips per checkpoint and state group
    (both platforms), and per layer (bit 30)."""
    import plotly.graph_objects as go

    per_bit = shares(bits, ["platform", "bit"])
    fig_bits = go.Figure()
    for platform, part in per_bit.groupby("platform"):
        fig_bits.add_trace(go.Bar(x=part.bit.astype(str), y=part.not_masked, name=platform,
                                  error_y={"type": "data", "symmetric": False, "array": part.high - part.not_masked,
                                           "arrayminus": part.not_masked - part.low}))
    fig_bits.update_layout(title="single flips in weights: share not masked per bit (95 % Wilson)",
                           xaxis_title="bit (31 sign, 30-23 exponent, 22-0 mantissa)", yaxis_tickformat=".0%",
                           template="plotly_white", barmode="group")
    per_k = shares(alterations, ["platform", "group", "flips"])
    fig_k = go.Figure()
    for (platform, group), part in per_k.groupby(["platform", "group"]):
        fig_k.add_trace(go.Scatter(x=part.flips, y=part.not_masked, mode="lines+markers", name=f"{platform} · {group}",
                                   error_y={"type": "data", "symmetric": False, "array": part.high - part.not_masked,
                                            "arrayminus": part.not_masked - part.low}))
    fig_k.update_layout(title="altered checkpoints resumed by their platform: share not masked",
                        xaxis={"title": "flips per checkpoint", "type": "log"}, yaxis_tickformat=".0%",
                        template="plotly_white")
    layers = shares(bits[bits.bit == 30], ["platform", "dataset"])
    fig_layers = go.Figure()
    for platform, part in layers.groupby("platform"):
        fig_layers.add_trace(go.Bar(x=part.dataset, y=part.not_masked, name=platform))
    fig_layers.update_layout(title="bit 30 flips per layer: share not masked", yaxis_tickformat=".0%",
                             template="plotly_white", barmode="group")
    return [fig_bits, fig_k, fig_layers]
