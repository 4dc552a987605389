"""*GossipGraD* (Daily et al., arXiv 1803.05880): gossip SGD with O(1) communication per step against allreduce.

The finding, in our words: one partner per step (rotating, so updates diffuse within log2(p) steps) keeps a
rank's communication constant in the number of ranks, at the accuracy of allreduce SGD. The campaign: the same
run under ``parallelism="data"`` and ``"gossip"`` at each ``p``, per seed: accuracy, consensus distance,
messages and bytes per step (counted, not timed). Details: docs/reproduce.md and docs/internals.md.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from workbench.base import modes
from workbench.campaigns.reproduce.common import (
    RUN_KEYS,
    Verdict,
    cached_run,
    campaign_settings,
    preflight,
    progress,
    run_extras,
)

KEY = "gossipgrad"
TITLE = "GossipGraD: O(1) gossip SGD vs allreduce"
PAPER = ("A rank's communication per step is constant in the number of ranks p (one partner per step, rotating), "
         "against allreduce's that grows with p; the accuracy reached matches allreduce SGD (ResNet-50/ImageNet "
         "top-1 as published); replicas stay close because partners rotate (diffusion in log2 p steps).")

SCALES: dict[str, dict[str, Any]] = {  # the paper scale is the registry's workload (registry.yaml)
    "small": {"model": "mlp", "dataset": "digits", "worlds": [2, 4], "seeds": [0, 1], "steps": 100,
              "lr_schedule": "cosine", "accuracy": "consensus_accuracy", "per_rank_batch": None},
    "paper": {"seeds": None},
}
ALLREDUCE, GOSSIP = modes.DATA.name, modes.GOSSIP.name  # the two arms, named in the result rows as parallelism
MODES = (ALLREDUCE, GOSSIP)
PLATEAU_EVALUATIONS = 3  # the plateau accuracy: the mean of the last 3 of a run's 10 evaluations
READINGS = ("plateau_accuracy", "final_test_accuracy", "consensus_accuracy")  # a workload's ``accuracy`` names one


PREFLIGHT = ("world_size", "parallelism", "model", "dataset", "synthetic_size", "batch_size", *RUN_KEYS)


def mode_run(settings: dict[str, Any], p: int, mode: str) -> dict[str, Any]:
    """The run of ``mode`` at ``p`` (settings but the seed): the global batch ``per_rank_batch`` x p where the
    workload sets it (weak scaling), gossip's consensus measured every 5 steps."""
    per_rank = settings.get("per_rank_batch")  # each rank's batch, the global batch per_rank x p (weak scaling)
    return {"world_size": p, "steps": settings["steps"], "parallelism": mode, "model": settings["model"],
            "dataset": settings["dataset"], "eval_interval": max(settings["steps"] // 10, 1),
            "synthetic_size": settings["synthetic_size"], **run_extras(settings),
            **({"batch_size": per_rank * p} if per_rank else {}),
            **({"consensus_every": 5} if mode == GOSSIP else {})}


def failure_free_runs(settings: dict[str, Any]) -> list[tuple[int, dict[str, Any]]]:
    """(p, run settings but the seed) of the runs gossip's accuracy is compared against: allreduce at every p."""
    return [(p, mode_run(settings, p, ALLREDUCE)) for p in settings["worlds"]]


def campaign(scale: str = "small", out: str | Path = "runs/reproduce/gossipgrad", entry: str = KEY,
             **overrides: Any) -> tuple[Any, Any]:
    """(one row per run, per-step rows of every run) for every (p, seed, mode) of the scale; at the paper scale
    on the registry's workload of ``entry`` (``gossipgrad`` or its replication, ``gossipgrad_replication``) and
    the reporting seeds drawn for ``out``."""
    import pandas as pd

    settings = campaign_settings(entry, SCALES, scale, out, overrides)
    reading = settings.get("accuracy", "plateau_accuracy")
    if reading not in READINGS:
        raise ValueError(f"gossipgrad: accuracy {reading!r} is not a reading: one of {', '.join(READINGS)}")
    preflight(*[{k: v for k, v in mode_run(settings, p, mode).items() if k in PREFLIGHT}
                for p in settings["worlds"] for mode in MODES])
    rows, steps = [], []
    progress(entry, len(settings["worlds"]) * len(settings["seeds"]) * len(MODES), into=out)
    for p in settings["worlds"]:
        for seed in settings["seeds"]:
            for mode in MODES:
                result = cached_run(Path(out) / "runs" / f"p{p}-s{seed}-{mode}", seed=seed,
                                    **mode_run(settings, p, mode))
                spread = result.summary.get("diffusion") or {}
                frame = result.to_dataframe().assign(parallelism=mode, world_size=p, seed=seed)
                frame["time"] = frame.step_time.cumsum()  # training time only: no start-up, no measurement
                frame["rank_time"] = frame.rank_step_time.cumsum()
                frame["oversubscribed"] = bool(result.summary.get("oversubscribed"))  # which clock figures show
                steps.append(frame)
                late = frame[frame.step >= settings["steps"] // 2].consensus_distance.dropna()
                early = frame[frame.step < settings["steps"] // 2].consensus_distance.dropna()
                final = result.summary["final_test_accuracy"]
                rows.append({"parallelism": mode, "world_size": p, "seed": seed, "outcome": result.outcome,
                             "reason": result.summary["reason"], "final_test_accuracy": final,
                             "plateau_accuracy": plateau_accuracy(frame),
                             # gossip: the replicas' consensus after ceil(log2 p) rounds; allreduce: its one model
                             "consensus_accuracy": spread.get("test_acc") if mode == GOSSIP else final,
                             "accuracy_reading": reading,
                             "train_s": float(frame.step_time.sum()),
                             "rank_train_s": float(frame.rank_step_time.sum()),
                             "messages": float(frame.messages.median()),
                             "bytes_sent": float(frame.bytes_sent.median()),
                             "consensus_early": float(early.mean()) if len(early) else None,
                             "consensus_late": float(late.mean()) if len(late) else None,
                             "diffusion_rounds": spread.get("rounds"), "spread_before": spread.get("before"),
                             "spread_after": spread.get("after"),
                             # whose partners the rounds replayed: those training exchanged, or the schedule's
                             "diffusion_partners": spread.get("partners"), "reporting": settings["reporting"]})
    return pd.DataFrame(rows), pd.concat(steps, ignore_index=True)


def plateau_accuracy(steps: Any, last: int = PLATEAU_EVALUATIONS) -> float | None:
    """The mean test accuracy of a run's last ``last`` evaluations: at a constant learning rate one evaluation
    swings by several points from the next, their mean much less (the registered metric)."""
    accuracies = steps.test_acc.dropna()
    return float(accuracies.tail(last).mean()) if len(accuracies) else None


def verdict(frame: Any, scale: str, entry: str = KEY) -> Verdict:
    """The registered findings of ``entry`` (``gossipgrad`` or its replication) and the mechanism checks."""
    v = Verdict(entry, TITLE, PAPER, scale)
    done = frame[frame.outcome == "completed"]
    v.statistics = {"runs": len(frame), "completed": len(done), "seeds": sorted(frame.seed.unique().tolist()),
                    "p": sorted(frame.world_size.unique().tolist())}
    if len(done) < len(frame):
        bad = frame[frame.outcome != "completed"]
        v.check("every run completes", False, "; ".join(f"{r.parallelism} p={r.world_size} seed {r.seed}: {r.reason}"
                                                         for r in bad.itertuples()))
    if frame.world_size.nunique() < 2:
        v.comparable, v.reason = False, "the communication claim needs at least two values of p"
        return v
    per_p = done.groupby(["parallelism", "world_size"])[["messages", "bytes_sent"]].median()
    gossip, allreduce = per_p.loc[GOSSIP], per_p.loc[ALLREDUCE]
    v.check("gossip: messages per rank per step constant in p", gossip.messages.nunique() == 1,
            "messages " + ", ".join(f"p={p}: {m:.0f}" for p, m in gossip.messages.items()), mechanism=True)
    v.check("allreduce: messages per rank per step grow with p", allreduce.messages.is_monotonic_increasing
            and allreduce.messages.iloc[-1] > allreduce.messages.iloc[0],
            "messages " + ", ".join(f"p={p}: {m:.0f}" for p, m in allreduce.messages.items()), mechanism=True)
    reading = frame.accuracy_reading.iloc[0] if "accuracy_reading" in frame else "plateau_accuracy"
    v.statistics["accuracy_reading"] = reading
    for p in sorted(done.world_size.unique()):  # registered: non-inferiority, the lower bound carries the claim
        at = done[done.world_size == p].pivot_table(index="seed", columns="parallelism", values=reading)
        v.decide(f"{entry}.accuracy_non_inferior", (100 * (at[GOSSIP] - at[ALLREDUCE])).dropna(), f"p={p}",
                 reference=float(at[ALLREDUCE].mean()))  # the failure-free allreduce run, beside the ceiling
    gossip_runs = done[done.parallelism == GOSSIP]
    cons = gossip_runs[gossip_runs.consensus_late.notna()]
    grows = (cons.consensus_late > 2 * cons.consensus_early).sum()
    v.check("gossip replicas stay close (consensus distance does not grow)", len(cons) == len(gossip_runs) > 0
            and grows == 0, f"{grows} of {len(cons)} runs doubled their consensus distance from the first to the "
            f"second half; late mean {cons.consensus_late.mean():.3g}" if len(cons) == len(gossip_runs) > 0 else
            f"consensus distance measured in {len(cons)} of {len(gossip_runs)} gossip runs: missing data fails",
            mechanism=True)  # nearly unfailable under a cosine rate: a mechanism check
    _diffusion(v, gossip_runs, entry)
    return v


def _diffusion(v: Verdict, gossip_runs: Any, entry: str = KEY) -> None:
    """The registered exact finding: after ceil(log2 p) rounds without updates every gossip run's replicas agree
    within the margin (relative spread), the rounds replaying the partners each rank exchanged in its last cycle
    of training (what the ranks did, not the schedule function: a rank-side schedule that skips a round is seen);
    a run without the measurement, or measured over the schedule's partners instead, fails it."""
    from workbench.campaigns.reproduce import registry

    margin = registry.load().finding(f"{entry}.diffusion_in_log_p").margin
    measured = gossip_runs[gossip_runs.spread_after.notna()] if "spread_after" in gossip_runs else gossip_runs[:0]
    if "diffusion_partners" in measured:  # tables from before the replay lack the column
        measured = measured[measured.diffusion_partners == "trained"]
    apart = measured[measured.spread_after > margin]
    detail = ", ".join(f"p={p}: {r:.0f} rounds, spread {b:.3g} -> {a:.2g}" for p, r, b, a in measured.groupby(
        "world_size")[["diffusion_rounds", "spread_before", "spread_after"]].max().itertuples())
    v.check(f"{entry}.diffusion_in_log_p: replicas agree within {margin:g} after ceil(log2 p) rounds",
            len(measured) == len(gossip_runs) > 0 and apart.empty,
            f"measured over training's partners in {len(measured)} of {len(gossip_runs)} gossip runs (missing data "
            f"fails); {len(apart)} "
            f"apart; largest per p: {detail or 'none'}", mechanism=True)


def figure(steps: Any) -> Any:
    """Accuracy vs step and vs training time and the consensus distance at the largest p (seeds averaged), as
    in the paper's convergence figures; and :func:`workbench.results.plots.traffic` for messages and bytes vs p."""
    from workbench.results import plots

    largest = steps.world_size.max()
    at = steps[steps.world_size == largest]
    mean = (at.groupby(["parallelism", "step"], as_index=False)
            [["time", "rank_time", "test_acc", "consensus_distance"]].mean())
    mean["oversubscribed"] = bool(at.oversubscribed.any()) if "oversubscribed" in at else False
    return plots.gossip_vs_allreduce(mean).update_layout(
        title=f"gossip vs allreduce at p = {largest} (mean over {steps.seed.nunique()} seeds)")


def traffic_figure(steps: Any) -> Any:
    from workbench.results import plots

    return plots.traffic(steps)
