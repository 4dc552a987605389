"""*A Characterization of Soft-error Sensitivity in Data-parallel and Model-parallel Distributed Deep Learning*
(JPDC 2024): checkpoint alteration — bit flips written into a training checkpoint, which is then resumed.

One model trained per seed and platform (data-parallel, pipeline); its checkpoint altered (1-100 flips into a
state group, the same flips on both platforms) and resumed by that platform, against the unaltered resume; single
flips of every exponent bit 23-30 and of every mantissa bit 0-22 resumed in-process (bit 30 alone before the
2026-11-28 deviation), reported per bit: which exponent bits wreck, which are masked. The registered findings
(registry.yaml, ``jpdc24``) are decided over the models; the mechanism is checked, counted, at every scale.
Details: docs/reproduce.md.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import zlib
from pathlib import Path
from typing import Any

from workbench.campaigns.reproduce.common import (
    Verdict,
    cached_run,
    campaign_settings,
    fewer_runs,
    preflight,
    progress,
    wilson,
)
from workbench.faults import outcomes

KEY = "jpdc24"
TITLE = "Soft errors in data- and model-parallel DL (JPDC'24)"
PAPER = ("Checkpoint alteration: flips of the high exponent bits wreck training (non-finite or lasting accuracy "
         "loss), mantissa flips are masked; more flips per checkpoint, more damage; data- and model-parallel "
         "platforms differ in sensitivity (no direction given in the abstract).")
GROUPS = {"weights": lambda n: n.startswith("model/") and "running_" not in n,
          "optimizer": lambda n: n.startswith("optimizer/"),
          "buffers": lambda n: n.startswith("model/") and "running_" in n}
TOP_BIT, EXPONENT_BITS, MANTISSA_BITS = 30, tuple(range(23, 31)), tuple(range(23))  # fp32, LSB-0
WRECKS, MASKED = 0.5, 0.05  # a bit whose flips are not masked in more than half / fewer than 5 % of trials

# the small scale: the mechanism, in seconds (two models per platform: tuning seeds); the paper scale is the
# registry's workload (registry.yaml, jpdc24) with its reporting seeds
SCALES: dict[str, dict[str, Any]] = {
    "small": {"model": "lenet5", "dataset": "digits", "synthetic_size": 4096, "seeds": [0, 1], "worlds": [2],
              "platforms": ["data", "pipeline"], "steps": 40, "resume_steps": 10, "flips": [1, 100],
              "groups": ["weights"], "trials": 1, "exponent_trials": 2, "mantissa_trials": 1, "bit_steps": 5,
              "tolerance": 0.01},
    "paper": {"seeds": None},  # None: the reporting seeds, drawn when the campaign first runs; a list: tuning seeds
}


def campaign(scale: str = "small", out: str | Path = "runs/reproduce/jpdc24", model: str | None = None,
             dataset: str | None = None, **overrides: Any) -> tuple[Any, Any]:
    """(alteration trials, single-bit trials) of every model (one per seed and platform) of the scale: one row
    per altered-checkpoint resume, one per single-bit trial. ``model``/``dataset`` default to the scale's."""
    import pandas as pd

    overrides.update({k: v for k, v in (("model", model), ("dataset", dataset)) if v is not None})
    settings = campaign_settings(KEY, SCALES, scale, out, overrides)
    out = Path(out)
    preflight(*[{"world_size": world, "parallelism": platform, "model": settings["model"],
                 "dataset": settings["dataset"]}
                for world in settings["worlds"] for platform in settings["platforms"]])  # e.g. a model without stages
    rows, bit_frames = [], []
    per_model = 2 + len(settings["groups"]) * len(settings["flips"]) * settings["trials"]  # at most: a group
    progress(KEY, len(settings["seeds"]) * len(settings["platforms"]) * len(settings["worlds"]) * per_model, into=out)
    for seed in settings["seeds"]:
        for platform in settings["platforms"]:
            originals = {}
            for world in settings["worlds"]:
                originals[world], part = _alterations(out / "runs" / f"s{seed}-{platform}-w{world}", settings,
                                                      seed, platform, world)
                rows += part
            # per bit: the in-process resume does not depend on the world
            bits = _bits(originals[min(originals)], settings, seed)
            bit_frames.append(bits.assign(platform=platform, seed=seed))
    alterations = pd.DataFrame(rows)
    alterations.attrs["reporting"] = settings["reporting"]  # reporting seeds (drawn at run time) or tuning seeds
    return alterations, pd.concat(bit_frames, ignore_index=True)


def _alterations(where: Path, settings: dict[str, Any], seed: int, platform: str,
                 world: int) -> tuple[str, list[dict[str, Any]]]:
    """Train one model on ``platform``, resume its checkpoint unaltered and altered: (checkpoint, rows)."""
    from workbench.base.errors import WorkbenchError
    from workbench.faults.hdf5 import alter_checkpoint, float_datasets

    common = {"world_size": world, "parallelism": platform, "model": settings["model"],
              "dataset": settings["dataset"], "synthetic_size": settings["synthetic_size"], "seed": seed}
    trained = cached_run(where / "train", **common, steps=settings["steps"], out=str(where / "train"))
    original = trained.summary["final_checkpoint"]
    if trained.outcome != "completed" or not original:
        raise WorkbenchError(f"jpdc24: the {platform} model of seed {seed} did not train: {trained.summary['reason']}")
    resume = {**common, "steps": settings["steps"] + settings["resume_steps"],
              "eval_interval": max(settings["resume_steps"] // 5, 1)}
    clean = cached_run(where / "clean", **resume, resume=original)
    source = hashlib.sha256(Path(original).read_bytes()).hexdigest()
    sizes = {name: count for name, (count, _) in float_datasets(original).items()}
    rows = []
    for group in settings["groups"]:
        targets = [n for n in sizes if GROUPS[group](n)]
        if not targets:
            fewer_runs(len(settings["flips"]) * settings["trials"])  # its runs are not run
            continue  # e.g. buffers of a model without batch norm
        for k in settings["flips"]:
            flipped = min(k, sum(sizes[n] for n in targets))  # lenet5's buffers: 44 values in all
            for trial in range(settings["trials"]):
                # the same flips on both platforms (paired by model seed): the seed names no platform
                flip_seed = zlib.crc32(f"{seed}-{world}-{group}-{k}-{trial}".encode())
                # named by what it is made of (the original's content, the datasets, the count, the seed): another
                # model or scale never finds a stale copy under the same name, nor its cached resume
                recipe = hashlib.sha256(json.dumps([source, targets, flipped, flip_seed]).encode())
                altered = where / f"{group}-k{k}-t{trial}-{recipe.hexdigest()[:12]}.h5"
                if not altered.is_file():  # altered aside, then renamed: never a half-altered copy
                    partial = altered.with_name(f".{altered.name}.tmp")
                    alter_checkpoint(original, datasets=targets, count=flipped, seed=flip_seed, out=partial)
                    os.replace(partial, altered)
                result = cached_run(where / f"{group}-k{k}-t{trial}", **resume, resume=str(altered),
                                    resume_verify=False)
                rows.append({"platform": platform, "seed": seed, "world_size": world, "group": group, "flips": k,
                             "flipped": flipped, "landed": _landed(original, altered, targets), "trial": trial,
                             "clean_outcome": clean.outcome,
                             **_outcome(result, clean, settings["tolerance"], settings["steps"])})
    return original, rows


def _landed(original: str | Path, altered: Path, targets: list[str]) -> int:
    """Values of the altered checkpoint whose bits differ from the original's: in the targets, or -1 elsewhere."""
    from workbench.faults.hdf5 import compare_checkpoints

    changed = {row["dataset"]: row["changed"] for row in compare_checkpoints(original, altered) if row["changed"]}
    return -1 if set(changed) - {n for n in targets} else int(sum(changed.values()))


def _bits(original: str, settings: dict[str, Any], seed: int) -> Any:
    """Single flips of every exponent bit (``exponent_trials`` each) and of every mantissa bit in the weights,
    resumed in-process as the platform computes (:func:`workbench.campaigns.studies.sensitivity.bit_sensitivity`)."""
    import pandas as pd

    from workbench.campaigns.studies.sensitivity import bit_sensitivity
    from workbench.faults.hdf5 import float_datasets

    weights = [n[len("model/"):] for n in float_datasets(original) if GROUPS["weights"](n)]  # state-dict names
    common = {"steps": settings["bit_steps"], "datasets": weights, "tolerance": settings["tolerance"], "seed": seed}
    return pd.concat([bit_sensitivity(original, bits=EXPONENT_BITS, trials=settings["exponent_trials"], **common),
                      bit_sensitivity(original, bits=MANTISSA_BITS, trials=settings["mantissa_trials"], **common)],
                     ignore_index=True)


def _outcome(result: Any, clean: Any, tolerance: float, start: int) -> dict[str, Any]:
    outcome = outcomes.classify(result, clean, tolerance)
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
        share, low, high = wilson(int((part.outcome != outcomes.MASKED).sum()), len(part))
        key = key if isinstance(key, tuple) else (key,)
        rows.append({**dict(zip(by, key)), "trials": len(part), "not_masked": share, "low": low, "high": high,
                     **{f"share_{o}": float((part.outcome == o).mean()) for o in outcomes.OUTCOMES[1:]}})
    return pd.DataFrame(rows)


def not_masked(frame: Any, by: Any) -> Any:
    """The share of ``frame``'s trials not masked per ``by`` (a Series; e.g. one value per model seed)."""
    return (frame.outcome != outcomes.MASKED).groupby([frame[b] for b in ([by] if isinstance(by, str) else by)]).mean()


def exponent_bits(bits: Any) -> dict[str, dict[int, float]]:
    """Per platform, each exponent bit's share of single flips not masked (pooled over the models)."""
    part = bits[bits.bit.isin(EXPONENT_BITS)]
    return {platform: {int(b): float(share)
                       for b, share in (one.outcome != outcomes.MASKED).groupby(one.bit).mean().items()}
            for platform, one in part.groupby("platform")}


def describe_bits(per_bit: dict[int, float]) -> str:
    """Which exponent bits wreck (not masked in more than half their trials), which are masked (in all but 5 %),
    which fall between: e.g. "wreck 30; masked 26-29; between 23-25"."""
    groups = {"wreck": [b for b, s in per_bit.items() if s > WRECKS],
              "masked": [b for b, s in per_bit.items() if s < MASKED]}
    groups["between"] = [b for b in per_bit if b not in groups["wreck"] + groups["masked"]]
    return "; ".join(f"{name} {', '.join(map(str, sorted(found, reverse=True)))}"
                     for name, found in groups.items() if found) or "none flipped"


def verdict(alterations: Any, bits: Any, scale: str) -> Verdict:
    """The mechanism, counted at every scale (:func:`mechanism`), and the registered findings decided over the
    models (:func:`decide`); not comparable without both platforms, two flip counts, the exponent's eight bits and
    the mantissa."""
    v = Verdict(KEY, TITLE, PAPER, scale)
    v.statistics = {"alteration_resumes": len(alterations), "bit_trials": len(bits),
                    "reporting_seeds": bool(alterations.attrs.get("reporting", False))}
    if not (len(alterations) and len(bits) and alterations.platform.nunique() >= 2
            and alterations.flips.nunique() >= 2 and set(EXPONENT_BITS) <= set(bits.bit)
            and bits.bit.isin(MANTISSA_BITS).any()):
        v.comparable, v.reason = False, ("needs altered resumes on two platforms with two flip counts, and single "
                                         "flips of every exponent bit 23-30 and of the mantissa")
        return v
    v.statistics.update({
        "seeds": sorted(alterations.seed.unique().tolist()),
        "models_per_platform": alterations.groupby("platform").seed.nunique().to_dict(),
        "worlds": sorted(alterations.world_size.unique().tolist()),
        "not_masked_by_platform": shares(alterations, ["platform"]).set_index("platform")[
            ["trials", "not_masked", "low", "high"]].to_dict("index"),
        "exponent_bits": exponent_bits(bits)})
    mechanism(v, alterations, bits)
    decide(v, alterations, bits)
    return v


def mechanism(v: Verdict, alterations: Any, bits: Any) -> None:
    """The checks every scale must pass, counted: the references ran, each flip landed once where aimed, each
    single flip's outcome is one its value allows, mantissa flips are masked in a clear majority, the top exponent
    bit wrecks (and which of the others wreck or are masked is told, not checked: the paper names no bit)."""
    bad = alterations[alterations.clean_outcome != "completed"][["seed", "platform", "world_size"]].drop_duplicates()
    v.check("every unaltered resume completes", bad.empty,
            f"{len(bad)} failed: " + ", ".join(f"seed {r.seed} {r.platform} w{r.world_size}" for r in bad.itertuples())
            if len(bad) else f"{alterations.groupby(['seed', 'platform', 'world_size']).ngroups} references")
    missed = alterations[alterations.landed != alterations.flipped]
    v.check("every flip landed once, in its state group", missed.empty,
            f"{len(alterations) - len(missed)} of {len(alterations)} altered checkpoints differ from their original "
            f"in exactly their {int(alterations.flipped.sum())} flips"
            + ("" if missed.empty else f"; not: {missed[['seed', 'platform', 'group', 'flips', 'landed']].values}"))
    allowed = [o in outcomes.possible_outcomes(a, b) for o, a, b in zip(bits.outcome, bits.old, bits.new)]
    v.check("every single flip's outcome is one its value allows", all(allowed),
            f"{sum(allowed)} of {len(allowed)} (non-finite weight: non-finite; a change <= 2^-13 of it: masked)")
    for platform, part in bits.groupby("platform"):
        mantissa = part[part.bit.isin(MANTISSA_BITS)]
        share, low, high = wilson(int((mantissa.outcome == outcomes.MASKED).sum()), len(mantissa))
        v.check(f"mantissa flips (bits 0-22) masked in a clear majority ({platform})", low > 0.5,
                f"{share:.0%} [{low:.0%}, {high:.0%}] of {len(mantissa)} masked (Wilson lower bound > 50 %)")
        wrecked = int((part[part.bit == TOP_BIT].outcome != outcomes.MASKED).sum())
        v.check(f"flips of the top exponent bit (30) wreck training ({platform})", wrecked > 0,
                f"{wrecked} of {int((part.bit == TOP_BIT).sum())} not masked; per exponent bit: "
                + describe_bits(v.statistics.get("exponent_bits", {}).get(platform, {})))


def decide(v: Verdict, alterations: Any, bits: Any) -> None:
    """The registered findings (registry.yaml, jpdc24): intervals over the models, a Wilson one for the
    mantissa's small share (a t interval over models of shares near 0 would collapse)."""
    for platform, part in bits.groupby("platform"):
        mantissa = part[part.bit.isin(MANTISSA_BITS)]
        # the exponent's 8 bits with equal trials each: its share is the mean of the bits' shares
        wrecks = not_masked(part[part.bit.isin(EXPONENT_BITS)], "seed") - not_masked(mantissa, "seed")
        v.decide(f"{KEY}.exponent_wrecks", wrecks.dropna(), platform)
        v.decide_share(f"{KEY}.low_mantissa_masked", int((mantissa.outcome != outcomes.MASKED).sum()), len(mantissa),
                       platform, sign=-1)
    per_model = not_masked(alterations, ["seed", "platform"]).unstack("platform")
    a, b = sorted(per_model.columns)[:2]
    v.decide(f"{KEY}.data_vs_model_parallel", (per_model[a] - per_model[b]).dropna(), f"{a} - {b}")
    for platform, part in alterations.groupby("platform"):
        per_k = not_masked(part, ["seed", "flips"]).unstack("flips")
        most, least = per_k.columns.max(), per_k.columns.min()
        v.decide(f"{KEY}.more_flips_more_damage", (per_k[most] - per_k[least]).dropna(),
                 f"{platform}: {most} vs {least} flips")


def figures(alterations: Any, bits: Any) -> list[Any]:
    """The paper's views: non-masked share per bit (both platforms), per flips per checkpoint and state group
    (both platforms), and per layer (the top exponent bit, 30)."""
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
    layers = shares(bits[bits.bit == TOP_BIT], ["platform", "dataset"])
    fig_layers = go.Figure()
    for platform, part in layers.groupby("platform"):
        fig_layers.add_trace(go.Bar(x=part.dataset, y=part.not_masked, name=platform))
    fig_layers.update_layout(title="bit 30 flips per layer: share not masked", yaxis_tickformat=".0%",
                             template="plotly_white", barmode="group")
    return [fig_bits, fig_k, fig_layers]
