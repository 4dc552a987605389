"""*What does fault tolerant deep learning need from MPI?* (EuroMPI'17): shrink-and-continue against permanent
failures of a data-parallel run, and what losing a stage costs a model-parallel one.

The finding, in our words: every data-parallel survivor holds the model, so the job shrinks and continues at the
failure-free accuracy (our shrink, and real ULFM where Open MPI is installed); a pipeline stage lives on one rank,
so a pipeline that loses one without a checkpoint is lost, with one it restarts, and a hybrid whose stages have
replica lanes carries on without one. The campaign, per seed: ``k`` kills under shrink, ulfm, reinit and
checkpoint_restart against the failure-free run; a pipeline that loses a stage without and with checkpoints, and a
hybrid that loses a rank of the same stage at the same step under shrink. registry.yaml decides; docs/reproduce.md.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from workbench.base import modes
from workbench.base.errors import ConfigError
from workbench.campaigns.reproduce.common import (
    INCONCLUSIVE,
    Verdict,
    cached_run,
    campaign_settings,
    mean_interval,
    on_reporting_seeds,
    planned_losses,
    preflight,
    progress,
)

KEY = "europmpi17"
TITLE = "What fault-tolerant DL needs from MPI (EuroMPI'17)"
PAPER = ("Data-parallel training survives permanent failures by shrinking the communicator and continuing (ULFM: "
         "revoke, shrink, agree): no checkpoint is needed, every survivor holds the model, and accuracy stays that "
         "of the failure-free run; model parallelism loses a part of the model with a rank, so it needs checkpoints "
         "(or replicas: the case for hybrid designs).")

ARMS = ("shrink", "ulfm", "reinit", "checkpoint_restart", "pipeline")
DATA_ARMS = ARMS[:4]  # data-parallel, each under the same k kills per seed
NO_CHECKPOINT, WITH_CHECKPOINT = "pipeline_no_checkpoint", "pipeline_checkpoint"
HYBRID = "hybrid_replica"  # the pipeline's stages, each on pipeline_lanes ranks: a lost rank leaves its stage a lane
SCALES: dict[str, dict[str, Any]] = {
    # one tuning seed, one k: every arm runs once (the mechanism only; the registered intervals need n >= 2)
    "small": {"model": "mlp", "dataset": "digits", "world": 4, "steps": 60, "failures": [2], "snapshot_every": 25,
              "pipeline_world": 2, "pipeline_lanes": 2, "pipeline_steps": 60, "arms": list(ARMS), "seeds": [0]},
    "paper": {"seeds": None},  # the registry's workload (registry.yaml), on reporting seeds drawn for ``out``
}
RESTORED_PT = 0.1  # reinit / checkpoint_restart redo the lost steps: they end where the failure-free run ends


def kills(world: int, steps: int, k: int, offset: int = 0) -> list[str]:
    """``k`` distinct ranks killed at evenly spaced steps, shifted by ``offset`` (rank 0 among them from the second
    on: any rank may die). The campaign shifts them by half a snapshot interval: a kill that lands exactly on a
    snapshot would redo nothing and hide what Reinit and checkpoint-restart cost."""
    ranks = [world - 1 - i for i in range(k)]
    if k >= 2:
        ranks[1] = 0
    return [f"kill:rank={r},step={steps * (i + 1) // (k + 1) + offset}" for i, r in enumerate(ranks)]


def ulfm_missing() -> str | None:
    """Why real ULFM cannot run here (Open MPI's mpirun or mpi4py missing, as ``--strategy ulfm`` says), or None."""
    from workbench import strategies

    try:
        strategies.get("ulfm").peer.require("ulfm")  # type: ignore[union-attr]
    except ConfigError as exc:
        return str(exc)
    return None


def runs(settings: dict[str, Any]) -> list[tuple[str, int, dict[str, Any]]]:
    """(arm, k, run settings but the seed) of every run a seed makes: the failure-free data-parallel run (arm
    ``shrink``, k = 0), each data arm under each k, and the pipeline's failure-free run, its stage lost without a
    checkpoint (strategy ``none``: a pipeline admits no shrink) and with checkpoints (``checkpoint_restart``), and
    the same stages on ``pipeline_lanes`` replica lanes (parallelism ``hybrid``) losing a last-stage rank at the
    same step under ``shrink`` without a checkpoint: what a replica lane buys (the 2026-11-28 deviation)."""
    unknown = sorted(set(settings["arms"]) - set(ARMS))
    if unknown or not settings["arms"]:
        raise ConfigError("arms", f"{', '.join(unknown) or 'none given'}: not arms of this campaign; choose from "
                          f"{', '.join(ARMS)}")
    every, offset = settings["snapshot_every"], settings["snapshot_every"] // 2
    size = {"synthetic_size": settings["synthetic_size"]} if "synthetic_size" in settings else {}
    data = {"world_size": settings["world"], "steps": settings["steps"], "model": settings["model"],
            "dataset": settings["dataset"], "eval_interval": max(settings["steps"] // 10, 1), **size}
    out = [("shrink", 0, {**data, "strategy": "shrink"})]
    for arm in (a for a in DATA_ARMS if a in settings["arms"]):
        snapshots = {"checkpoint_every": every} if arm in ("reinit", "checkpoint_restart") else {}
        out += [(arm, k, {**data, "strategy": arm, **snapshots,
                          "faults": kills(settings["world"], settings["steps"], k, offset)})
                for k in settings["failures"] if k > 0]
    if "pipeline" in settings["arms"]:
        pw, ps = settings["pipeline_world"], settings["pipeline_steps"]
        pipe = {**data, "world_size": pw, "steps": ps, "parallelism": "pipeline", "eval_interval": max(ps // 10, 1)}
        lose = kills(pw, ps, 1, offset)  # the last stage's only rank
        hw = pw * settings["pipeline_lanes"]
        hybrid = {**pipe, "world_size": hw, "parallelism": "hybrid", "pipeline_stages": pw, "strategy": "shrink",
                  "faults": kills(hw, ps, 1, offset)}  # a rank of the last stage, at the pipeline's kill step
        out += [(WITH_CHECKPOINT, 0, {**pipe, "strategy": "checkpoint_restart", "checkpoint_every": every}),
                (NO_CHECKPOINT, 1, {**pipe, "strategy": "none", "faults": lose}),
                (WITH_CHECKPOINT, 1, {**pipe, "strategy": "checkpoint_restart", "checkpoint_every": every,
                                      "faults": lose}),
                (HYBRID, 1, hybrid)]
    return out


def failure_free_runs(settings: dict[str, Any]) -> list[tuple[int, dict[str, Any]]]:
    """(world, run settings but the seed) of the failure-free run the accuracy comparisons are made against: the
    data-parallel run without a kill (:func:`runs`' first), measured by :mod:`.failure_free` before a registration."""
    arm, _, run = runs(settings)[0]
    return [(run["world_size"], run)]


def campaign(scale: str = "small", out: str | Path = "runs/reproduce/europmpi17", **overrides: Any) -> Any:
    """Every run of every seed of the scale, run or loaded; one row per run. ulfm where Open MPI is not installed:
    a row ``not run`` with the reason (its finding is then inconclusive, never passed). At the paper scale: the
    registry's workload and the reporting seeds drawn for ``out``."""
    import pandas as pd

    settings = campaign_settings(KEY, SCALES, scale, out, overrides)
    plan, missing = runs(settings), ulfm_missing()
    preflight(*[{k: v for k, v in run.items() if k != "faults"} for arm, _, run in plan
                if not (arm == "ulfm" and missing)])
    rows = []
    progress(KEY, len(settings["seeds"]) * sum(not (arm == "ulfm" and missing) for arm, _, _ in plan), into=out)
    for seed in settings["seeds"]:
        for arm, k, run in plan:
            row = {"arm": arm, "strategy": run["strategy"], "parallelism": run.get("parallelism", "data"),
                   "failures": k, "seed": seed, "world_size": run["world_size"], "steps": run["steps"],
                   "kill_step": _first_kill(run), "reporting": settings["reporting"]}
            if arm == "ulfm" and missing:
                rows.append({**row, "outcome": "not run", "reason": missing})
                continue
            result = cached_run(Path(out) / "runs" / f"s{seed}-{arm}-k{k}", **run, seed=seed)
            rows.append({**row, **_measured(result)})
    return pd.DataFrame(rows)


def _first_kill(run: dict[str, Any]) -> int | None:
    faults = run.get("faults") or []
    return int(faults[0].rsplit("step=", 1)[1]) if faults else None


def _measured(result: Any) -> dict[str, Any]:
    s = result.summary
    return {"outcome": result.outcome, "reason": s["reason"], "final_test_accuracy": s["final_test_accuracy"],
            "wall_train_s": s["train_s"], "train_s": s.get("rank_train_s", s["train_s"]),  # rank-time clock
            "world_size_final": s["world_size_final"], "steps_completed": s.get("steps_completed"),
            "steps_redone": s["steps_redone_total"], "checkpoints": s["checkpoints"],
            "planned": planned_losses(result)}


def statistics(frame: Any) -> Any:
    """Per arm and number of failures: runs, completed, failed, not run; accuracy (%) and training time on the
    rank-time clock (mean, 95 % interval) over the completed runs; steps redone, final world, checkpoints."""
    import pandas as pd

    rows = []
    for (arm, k), part in frame.groupby(["arm", "failures"], sort=False):
        done = part[part.outcome == "completed"]
        acc, time = mean_interval(100 * done.final_test_accuracy), mean_interval(done.train_s)
        rows.append({"arm": arm, "failures": k, "runs": len(part), "completed": len(done),
                     "failed": int((part.outcome == "failed").sum()), "not_run": int((part.outcome == "not run").sum()),
                     "accuracy_pct": acc[0], "accuracy_low": acc[1], "accuracy_high": acc[2], "train_s": time[0],
                     "train_low": time[1], "train_high": time[2],
                     "steps_redone": done.steps_redone.mean() if len(done) else math.nan,
                     "world_size_final": done.world_size_final.mean() if len(done) else math.nan,
                     "checkpoints": done.checkpoints.mean() if len(done) else math.nan})
    return pd.DataFrame(rows)


def _accuracy(frame: Any, arm: str, k: int) -> Any:
    """Final test accuracy (%) of ``arm`` with ``k`` failures, per seed, completed runs only."""
    rows = frame[(frame.arm == arm) & (frame.failures == k) & (frame.outcome == "completed")]
    return (100 * rows.set_index("seed").final_test_accuracy).astype(float)


def effects(frame: Any, a: tuple[str, int], b: tuple[str, int]) -> list[float]:
    """Accuracy (points) of ``a`` = (arm, k) minus that of ``b``, paired by seed (both completed)."""
    left, right = _accuracy(frame, *a), _accuracy(frame, *b)
    both = left.index.intersection(right.index)
    return (left[both] - right[both]).tolist()


def verdict(frame: Any, scale: str) -> Verdict:
    """The mechanism (every run completes or fails as planned; shrink ends at world - k without a checkpoint;
    reinit and checkpoint_restart end where the failure-free run ends), then the registered findings: shrink
    non-inferior to the failure-free run and ulfm equivalent to shrink (paired by seed, per k), and the exact
    model-parallel finding."""
    v = Verdict(KEY, TITLE, PAPER, scale)
    data = frame[frame.parallelism == modes.DATA.name]
    if data.empty:
        v.comparable, v.reason = False, "the campaign ran no data-parallel run"
        return v
    v.statistics = {"runs": len(frame), "completed": int((frame.outcome == "completed").sum()),
                    "not_run": sorted(set(frame.arm[frame.outcome == "not run"])),
                    "seeds": sorted(frame.seed.unique().tolist()), "world_size": int(data.world_size.max()),
                    "failures": sorted(data.failures.unique().tolist()), "reporting_seeds": on_reporting_seeds(frame)}
    planned_end = frame.arm == NO_CHECKPOINT
    bad = frame[~planned_end & ~frame.outcome.isin(["completed", "not run"])]
    if len(bad):
        v.check("every run completes as planned", False, "; ".join(
            f"{r.arm} k={r.failures} seed {r.seed}: {r.reason}" for r in bad.itertuples()))
    ks = sorted(set(data.failures) - {0})
    if not ks or not len(_accuracy(frame, "shrink", 0)):
        v.comparable, v.reason = False, "the campaign needs a completed failure-free run and runs with failures"
        return v
    world = int(data.world_size.max())
    for k in ks:
        _mechanism(v, frame, world, k)
        v.decide(f"{KEY}.shrink_keeps_accuracy", effects(frame, ("shrink", k), ("shrink", 0)),
                 f"k={k}, shrink - failure-free, pt", reference=_accuracy(frame, "shrink", 0).mean() / 100)
        _ulfm(v, frame, k)
    if frame.arm.isin([NO_CHECKPOINT, WITH_CHECKPOINT, HYBRID]).any():
        model_parallel(v, frame)
    return v


def _mechanism(v: Verdict, frame: Any, world: int, k: int) -> None:
    shrink = frame[(frame.arm == "shrink") & (frame.failures == k) & (frame.outcome == "completed")]
    v.check(f"shrink continues on the survivors (k={k})",
            len(shrink) > 0 and (shrink.world_size_final == world - k).all() and (shrink.checkpoints == 0).all()
            and (shrink.planned == k).all(),
            f"world {world} -> {sorted(shrink.world_size_final.unique().tolist())} after "
            f"{sorted(shrink.planned.unique().tolist())} planned kills, checkpoints written "
            f"{int(shrink.checkpoints.sum())}")
    for arm in ("reinit", "checkpoint_restart"):
        if not ((frame.arm == arm) & (frame.failures == k)).any():
            continue
        gap = effects(frame, (arm, k), ("shrink", 0))
        v.check(f"{arm} returns to the failure-free run (k={k})",
                len(gap) > 0 and max(abs(g) for g in gap) <= RESTORED_PT,
                f"accuracy - failure-free per seed: {', '.join(f'{g:+.2f}' for g in gap) or 'none completed'} pt "
                f"(|.| <= {RESTORED_PT} pt: the lost steps redone from the saved state)")


def _ulfm(v: Verdict, frame: Any, k: int) -> None:
    """The registered equivalence, or, where real ULFM did not run, the finding reported not run: inconclusive."""
    key, ran = f"{KEY}.ulfm_matches_shrink", frame[(frame.arm == "ulfm") & (frame.failures == k)]
    skipped = ran[ran.outcome == "not run"]
    if ran.empty or len(skipped):
        reason = skipped.reason.iloc[0] if len(skipped) else "the ulfm arm is not among the campaign's arms"
        not_run(v, key, f"k={k}, ulfm - shrink, pt", reason)
        return
    v.decide(key, effects(frame, ("ulfm", k), ("shrink", k)), f"k={k}, ulfm - shrink, pt",
             reference=_accuracy(frame, "shrink", 0).mean() / 100)


def not_run(v: Verdict, key: str, label: str, reason: str) -> None:
    """Record registered finding ``key`` as not run (inconclusive, with the reason): an arm this machine cannot
    run is reported, never passed."""
    from workbench.campaigns.reproduce import registry

    v.decisions.append({"key": key, "label": label, "claim": registry.load().finding(key).ours,
                        "status": INCONCLUSIVE, "mean": math.nan, "low": math.nan, "high": math.nan, "n": 0,
                        "detail": f"not run: {reason}", "run": False})


def _staged(frame: Any) -> Any:
    """Which rows are runs of a mode that cuts the model into stages (the pipeline and hybrid arms)."""
    return frame.parallelism.isin([m.name for m in modes.REGISTRY.values() if m.staged])


def model_parallel(v: Verdict, frame: Any) -> bool:
    """The exact finding, seed by seed, under the same kill of a last-stage rank: the pipeline (one rank per stage)
    without a checkpoint ends failed by the planned kill, while the hybrid (the same stages on replica lanes) shrinks
    to its surviving lanes and completes, no checkpoint written; the pipeline with checkpoints completes on its whole
    world, restarted from one (fewer steps redone than the kill's step), where its failure-free run ends. A seed
    missing an arm fails it."""
    staged = frame[_staged(frame)].set_index(["arm", "failures", "seed"])
    seeds, wrong = sorted(frame.seed.unique().tolist()), []
    for seed in seeds:
        try:
            lost, lane, kept = (staged.loc[(arm, 1, seed)] for arm in (NO_CHECKPOINT, HYBRID, WITH_CHECKPOINT))
            base = staged.loc[(WITH_CHECKPOINT, 0, seed)]
        except KeyError:
            wrong.append(f"seed {seed}: a pipeline or hybrid arm is missing")
            continue
        if not (lost.outcome == "failed" and lost.planned >= 1):
            wrong.append(f"seed {seed}: the pipeline without a checkpoint {lost.outcome} ({lost.reason})")
        if not (lane.outcome == "completed" and lane.planned >= 1 and lane.checkpoints == 0
                and lane.world_size_final == lane.world_size - 1):
            wrong.append(f"seed {seed}: the hybrid {lane.outcome} at world {lane.world_size_final} of "
                         f"{lane.world_size}, {lane.checkpoints} checkpoints ({lane.reason})")
        wrong += _restarted(seed, kept, base)
    return v.check(f"{KEY}.model_parallel_needs_checkpoints: losing a stage's only rank ends a pipeline without a "
                   "checkpoint, a replica lane carries a hybrid on, a checkpoint restarts the pipeline", not wrong,
                   "; ".join(wrong) or f"{len(seeds)} of {len(seeds)} seeds: the pipeline failed without a "
                   "checkpoint, the hybrid completed on its surviving lanes without one, the pipeline restarted "
                   f"from a checkpoint with one (failure-free accuracy within {RESTORED_PT} pt)")


def _restarted(seed: int, kept: Any, base: Any) -> list[str]:
    """What is wrong with the pipeline's restart from a checkpoint (nothing: [])."""
    if not (kept.outcome == "completed" and kept.world_size_final == kept.world_size
            and 0 < kept.steps_redone < kept.kill_step and kept.planned >= 1):
        return [f"seed {seed}: with checkpoints {kept.outcome}, {kept.steps_redone} steps redone ({kept.reason})"]
    if base.outcome != "completed" or abs(100 * (kept.final_test_accuracy - base.final_test_accuracy)) > RESTORED_PT:
        return [f"seed {seed}: restarted accuracy {kept.final_test_accuracy:.4f} vs failure-free "
                f"{base.final_test_accuracy} ({base.outcome})"]
    return []


def figure(frame: Any) -> Any:
    """Left: accuracy of the data-parallel arms against the number of failures (mean, 95 % interval; k = 0 is the
    failure-free run). Right: steps the pipeline completed without and with checkpoints, and the hybrid on its
    replica lanes (mean over seeds)."""
    import pandas as pd
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    stats = statistics(frame)
    fig = make_subplots(rows=1, cols=2, subplot_titles=("data parallel: test accuracy (%)",
                                                        "a stage's rank lost: steps completed"))
    base = stats[(stats.arm == "shrink") & (stats.failures == 0)]
    for i, arm in enumerate(a for a in DATA_ARMS if a in set(stats.arm)):
        part = stats[(stats.arm == arm) & (stats.failures > 0)]
        part = pd.concat([base, part]).sort_values("failures")
        fig.add_trace(go.Scatter(x=part.failures, y=part.accuracy_pct, mode="lines+markers", name=arm,
                                 line={"color": _COLORS[i % 4]},
                                 error_y={"type": "data", "symmetric": False,
                                          "array": part.accuracy_high - part.accuracy_pct,
                                          "arrayminus": part.accuracy_pct - part.accuracy_low}), row=1, col=1)
    pipe = frame[_staged(frame)].copy()
    if len(pipe):
        pipe["label"] = pipe.arm.str.replace("pipeline_", "") + pipe.failures.map({0: " (failure-free)", 1: ""})
        done = pipe.groupby("label", sort=False).agg(steps=("steps_completed", "mean"), outcome=("outcome", "first"))
        fig.add_trace(go.Bar(x=done.index, y=done.steps, text=done.outcome, name="pipeline",
                             marker={"color": "#7f7f7f"}), row=1, col=2)
    fig.update_xaxes(title_text="ranks failed", dtick=1, row=1, col=1)
    fig.update_layout(title=f"{int(frame.world_size.max())} ranks: shrink vs ulfm vs reinit vs checkpoint-restart; "
                      "a pipeline without and with checkpoints, a hybrid on replica lanes", template="plotly_white",
                      height=420)
    return fig


_COLORS = ("#1f77b4", "#9467bd", "#ff7f0e", "#2ca02c")
