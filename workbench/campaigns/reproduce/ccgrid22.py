"""*Towards Low-Overhead Resilience for Data Parallel Deep Learning* (CCGrid'22): the trade-off between the
accuracy a recovery strategy costs and the runtime it adds, under a simulated failure process.

The finding, in our words: checkpoint-restart adds the most runtime; rollback redoes only the mini-batch in
flight and loses no accuracy; lossy forward recovery redoes nothing and pays with a small accuracy loss. The
campaign: exponential failures (the same per seed for every strategy) against a failure-free run of the same
seed, over an MTBF axis; statistics over the seeds that injected a failure; runtime on the rank-time clock
(:mod:`workbench.results.clock`); the registered tests (registry.yaml) decide. Details: docs/reproduce.md.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from workbench.campaigns.reproduce.common import (
    Verdict,
    cached_run,
    campaign_settings,
    fmt,
    mean_interval,
    on_reporting_seeds,
    one_sided,
    paired,
    progress,
    run_extras,
)

KEY = "ccgrid22"
TITLE = "Low-overhead resilience for data-parallel DL (CCGrid'22)"
PAPER = ("Checkpoint-restart adds the most runtime (progress since the last checkpoint is redone, more with a "
         "longer interval); immediate mini-batch rollback loses no accuracy at a small runtime cost; lossy forward "
         "recovery redoes nothing and loses a little accuracy (the dead rank's share of the buckets not yet applied).")

SCALES: dict[str, dict[str, Any]] = {
    # 5 seeds even small: with 3, the one-sided bound of "restart costs more" (t with 2 df) failed on CI although
    # all three pairs had restart dearer (+8, +38, +82 pt): where failures land against checkpoints varies by seed
    "small": {"model": "mlp", "dataset": "digits", "worlds": [4], "seeds": [0, 1, 2, 3, 4], "steps": 120,
              "mtbf": [50], "max_failures": 2, "intervals": [30], "elastic": ["rollback", "forward"],
              "timing": "rank_overhead_pct"},
    "paper": {"seeds": None},  # the registry's workload (registry.yaml), on reporting seeds drawn for ``out``
}
PAIRS = ("world_size", "mtbf", "seed")  # what a strategy's run is paired with: the same failures


# the column a scale's runtime checks compare -> how its details name it: words, unit, decimals
TIMINGS = {"rank_overhead_pct": ("overhead (rank-time)", " pt", 1), "overhead_pct": ("overhead (wall)", " pt", 1),
           "lost_s": ("time lost to failures (wall)", " s", 2)}


def strategies(settings: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Label -> run settings of every strategy the campaign compares."""
    chosen = {f"checkpoint_restart/{k}": {"strategy": "checkpoint_restart", "checkpoint_every": k}
              for k in settings["intervals"]}
    chosen.update({name: {"strategy": name, "regrow": True} for name in settings["elastic"]})
    return chosen


def failure_free_run(settings: dict[str, Any], world: int) -> dict[str, Any]:
    """The failure-free run of ``world`` (every run's settings but its strategy, faults and seed): each strategy's
    reference, and what :mod:`workbench.campaigns.reproduce.failure_free` measures before a registration."""
    return {"world_size": world, "steps": settings["steps"], "model": settings["model"],
            "dataset": settings["dataset"], "eval_interval": max(settings["steps"] // 10, 1),
            "synthetic_size": settings["synthetic_size"], **run_extras(settings)}


def failure_free_runs(settings: dict[str, Any]) -> list[tuple[int, dict[str, Any]]]:
    """(world, run settings but the seed) of the failure-free runs an accuracy comparison is made against."""
    return [(world, failure_free_run(settings, world)) for world in settings["worlds"]]


def mtbf_of(settings: dict[str, Any], index: int) -> list[int]:
    """The MTBFs the ``index``-th seed runs at: every one of the axis, or with ``mtbf_per_seed`` (a study's
    registration) one, the seeds taking the axis's values in turn (seed 0, 2, ... the first; 1, 3, ... the
    second), so that each seed gives one pair and the pairs are independent."""
    axis = list(settings["mtbf"])
    return [axis[index % len(axis)]] if settings.get("mtbf_per_seed") else axis


def planned_runs(settings: dict[str, Any]) -> int:
    """How many runs the campaign at ``settings`` makes: per world size and seed, the failure-free run and each
    strategy at each of the seed's MTBFs (:func:`mtbf_of`)."""
    per_world = sum(1 + len(mtbf_of(settings, i)) * len(strategies(settings)) for i in range(len(settings["seeds"])))
    return len(settings["worlds"]) * per_world


def campaign(scale: str = "small", out: str | Path = "runs/reproduce/ccgrid22", entry: str = KEY,
             **overrides: Any) -> Any:
    """Run (or load, when already run) every (world size, MTBF, seed, strategy) of the scale against the
    failure-free run of its seed; one row per run. At the paper scale: the registry's workload of ``entry``
    (``ccgrid22``, or its second study ``ccgrid22_study2``) and the reporting seeds drawn for ``out``."""
    import pandas as pd

    settings = campaign_settings(entry, SCALES, scale, out, overrides)
    rows = []
    progress(entry, planned_runs(settings), into=out)
    for world in settings["worlds"]:
        for index, seed in enumerate(settings["seeds"]):
            common = {**failure_free_run(settings, world), "seed": seed}
            base = cached_run(Path(out) / "runs" / f"w{world}-s{seed}-none", **common)
            for mtbf in mtbf_of(settings, index):
                failures = f"random:mtbf_steps={mtbf},seed={seed},max={settings['max_failures']}"
                for label, extra in strategies(settings).items():
                    name = label.replace("/", "-")
                    result = cached_run(Path(out) / "runs" / f"w{world}-m{mtbf}-s{seed}-{name}", **common, **extra,
                                        faults=[failures])
                    rows.append({**_row(label, world, seed, result, base), "mtbf": mtbf,
                                 "reporting": settings["reporting"]})
    return pd.DataFrame(rows)


def _row(label: str, world: int, seed: int, result: Any, base: Any) -> dict[str, Any]:
    s, b = result.summary, base.summary
    ok = result.completed and base.completed
    return {"strategy": label, "world_size": world, "seed": seed, "outcome": result.outcome,
            "reason": s["reason"], "failures": len(result.failures), "baseline_outcome": base.outcome,
            "baseline_reason": b["reason"],
            "overhead_pct": 100 * (s["train_s"] - b["train_s"]) / b["train_s"] if ok else None,
            "rank_overhead_pct": 100 * (s["rank_train_s"] - b["rank_train_s"]) / b["rank_train_s"] if ok else None,
            "accuracy_loss_pt": 100 * (b["final_test_accuracy"] - s["final_test_accuracy"]) if ok else None,
            "lost_s": lost_time(result) if result.completed else None,
            "steps_redone": s["steps_redone_total"], "samples_lost": s["samples_lost_total"],
            "samples_missing": samples_missing(result, base) if ok else None,
            "train_s": s["train_s"], "baseline_train_s": b["train_s"], "rank_train_s": s["rank_train_s"],
            "baseline_rank_train_s": b["rank_train_s"], "final_test_accuracy": s["final_test_accuracy"],
            "baseline_accuracy": b["final_test_accuracy"]}


def samples_missing(result: Any, base: Any) -> int:
    """Samples of the failure-free schedule whose gradients did not enter a committed update of ``result`` (all of
    it), summed over the steps. Per step, from what the ranks' reduction carried with the committed update (the last
    report of a step redone): ``samples``, their count, and ``sample_checksum``, the sum of a hash of their ids
    (docs/reproduce-rules.md). A step never committed misses all the failure-free run's samples of it; one with
    fewer samples misses the difference; one with as many but another checksum misses all of them (other samples: a
    redo over the wrong ones). Where either run has no checksum for a step (a result written before the column, a
    step whose checksum could not be carried exact) the count alone decides, and a redo over the wrong samples of
    the right count passes unseen. Counted from the data the ranks consumed, not from what the strategy says."""
    def per_step(run: Any) -> tuple[Any, Any]:
        frame = run.to_dataframe()
        if "sample_checksum" not in frame:
            frame = frame.assign(sample_checksum=float("nan"))
        last = frame.drop_duplicates("step", keep="last").set_index("step")
        return last["samples"].fillna(0), last["sample_checksum"]

    (ran, ran_sum), (wanted, wanted_sum) = per_step(result), per_step(base)
    got, checksum = ran.reindex(wanted.index).fillna(0), ran_sum.reindex(wanted.index)
    other = (got >= wanted) & checksum.notna() & wanted_sum.notna() & (checksum != wanted_sum)
    return int((wanted - got).clip(lower=0).where(~other, wanted).sum())


def lost_time(result: Any) -> float:
    """Seconds a run lost to its failures: each one's time to resume (fault to the first step committed after it)
    plus the steps it made the run redo, at the run's own median step time."""
    steps = result.to_dataframe()["step_time"].dropna()
    step = float(steps.median()) if len(steps) else 0.0
    return sum(f["resume_s"] or 0.0 for f in result.failures) + result.summary["steps_redone_total"] * step


def statistics(frame: Any) -> Any:
    """Per strategy, world size and MTBF: runs, completed, failures, mean and 95 % t interval of overhead (% on the
    rank-time clock) and accuracy loss (points), mean wall overhead (%), time lost to failures (s) and steps redone,
    total samples lost."""
    import pandas as pd

    rows = []
    frame = _with_mtbf(frame)
    for (label, world, mtbf), part in under_failures(frame).groupby(["strategy", "world_size", "mtbf"], sort=False):
        done = part[part.outcome == "completed"]
        over, loss = mean_interval(done.rank_overhead_pct), mean_interval(done.accuracy_loss_pt)
        rows.append({"strategy": label, "world_size": world, "mtbf": mtbf, "runs": len(part),
                     "completed": len(done), "failures": int(part.failures.sum()), "overhead_pct": over[0],
                     "overhead_low": over[1], "overhead_high": over[2], "loss_pt": loss[0], "loss_low": loss[1],
                     "loss_high": loss[2], "wall_overhead_pct": done.overhead_pct.mean(), "lost_s": done.lost_s.mean(),
                     "steps_redone": done.steps_redone.mean(), "samples_lost": int(done.samples_lost.sum()),
                     **({"samples_missing": int(done.samples_missing.fillna(0).sum())} if "samples_missing" in done
                        else {})})
    return pd.DataFrame(rows)


def _with_mtbf(frame: Any) -> Any:
    return frame if "mtbf" in frame else frame.assign(mtbf=0)  # a table from before the MTBF axis: one value


def under_failures(frame: Any) -> Any:
    """The rows of seeds whose failure process injected a failure (see the module's docstring)."""
    return frame[frame.failures > 0]


def verdict(frame: Any, scale: str, entry: str = KEY) -> Verdict:
    """The mechanism, checked on every world size (and, at the small scale, the runtime directions on the rank-time
    clock), then the registered findings of ``entry`` (``ccgrid22`` or ``ccgrid22_study2``) decided on pairs pooled
    over the MTBF axis; every run and every failure-free reference must complete (a failed run is not dropped from
    the pairs silently)."""
    v = Verdict(entry, TITLE if entry == KEY else f"{TITLE}, study 2", PAPER, scale)
    frame = _with_mtbf(frame)
    hit = under_failures(frame)
    v.statistics = {"runs": len(frame), "completed": int((frame.outcome == "completed").sum()),
                    "seeds": sorted(frame.seed.unique().tolist()), "worlds": sorted(frame.world_size.unique().tolist()),
                    "mtbf": sorted(frame.mtbf.unique().tolist()), "failures_injected": int(frame.failures.sum()),
                    "seeds_with_failures": sorted(hit.seed.unique().tolist()),
                    "reporting_seeds": on_reporting_seeds(frame)}
    bad = frame[frame.outcome != "completed"]
    bad_base = frame[frame.baseline_outcome != "completed"].drop_duplicates(["world_size", "seed"])
    if len(bad) or len(bad_base):
        v.check("every run completes", False, "; ".join(
            [f"{r.strategy} w{r.world_size} seed {r.seed}: {r.reason}" for r in bad.itertuples()]
            + [f"failure-free reference w{r.world_size} seed {r.seed}: {r.baseline_reason}"
               for r in bad_base.itertuples()]))
    pooled = statistics(hit.assign(mtbf=0))  # per strategy and world size, over every MTBF
    if hit.empty or (pooled.completed < 2).any():
        v.comparable, v.reason = False, ("fewer than 2 completed runs of a strategy among the seeds with failures, "
                                         "or no failure was injected")
        return v
    for world, part in pooled.groupby("world_size"):
        _mechanism(v, world, part.set_index("strategy"))
        if scale == "small":
            _runtime_directions(v, world, hit[hit.world_size == world])
    _registered(v, hit, entry)
    return v


def _mechanism(v: Verdict, world: int, by: Any) -> None:
    roll, fwd = by.loc["rollback"], by.loc["forward"]
    data = "samples_missing" in by  # counted from the samples each update summed; an older table: the
    # strategies' own counts
    missing, dropped = (roll.samples_missing, fwd.samples_missing) if data else (roll.samples_lost, fwd.samples_lost)
    v.check(f"rollback loses no samples (world {world})", missing == 0,
            f"{int(missing)} samples of the failure-free schedule entered no committed update, over "
            f"{int(roll.completed)} runs (counted from the samples each update summed)", mechanism=True)
    v.check(f"forward drops the dead ranks' share (world {world})", dropped > 0, mechanism=True, detail=
            f"{int(dropped)} samples lost" + (f" (from the samples each update summed; the strategy counts "
                                              f"{int(fwd.samples_lost)})" if data else "")
            + f", accuracy loss {fmt((fwd.loss_pt, fwd.loss_low, fwd.loss_high), ' pt')}")
    restarts = by[by.index.str.startswith("checkpoint_restart")]
    if len(restarts) > 1:
        redone = restarts.steps_redone.tolist()
        v.check(f"checkpoint-restart redoes more the longer its interval (world {world})",
                all(a < b for a, b in zip(redone, redone[1:])),
                "mean steps redone " + ", ".join(f"{k}: {r:.1f}" for k, r in restarts.steps_redone.items()))


def _runtime_directions(v: Verdict, world: int, at: Any) -> None:
    """The small scale's runtime checks on the rank-time clock (one-sided 95 % bounds over its tuning seeds)."""
    what, unit, digits = TIMINGS[SCALES["small"]["timing"]]
    timing = SCALES["small"]["timing"]
    diff = one_sided(paired(at, "forward", "rollback", timing, PAIRS))
    v.check(f"forward adds no more runtime than rollback (world {world})", diff[1] <= 0,
            f"forward - rollback {what}, paired by seed: {fmt(diff, unit, digits)} (one-sided 95 % lower bound <= 0)")
    for label in sorted(at.strategy[at.strategy.str.startswith("checkpoint_restart")].unique()):
        diff = one_sided(paired(at, label, "rollback", timing, PAIRS))
        v.check(f"{label} adds more runtime than rollback (world {world})", diff[1] > 0,
                f"{label} - rollback {what}, paired by seed: {fmt(diff, unit, digits)} "
                "(one-sided 95 % lower bound > 0)")


def _registered(v: Verdict, hit: Any, entry: str = KEY) -> None:
    """registry.yaml's findings of ``entry``, each effect oriented so that positive favours the claim, one pair per
    (world size, seed): a seed's rows over the MTBF axis share its seed, so they are averaged, not pooled as
    independent. A registration's ``forward_trades_accuracy`` (rollback's accuracy above forward's: the trade-off's
    accuracy side) is decided where it is registered."""
    from workbench.campaigns.reproduce import registry

    done = hit[hit.outcome == "completed"]
    seeds = done.groupby(["strategy", "world_size", "seed"], as_index=False)[
        ["accuracy_loss_pt", "rank_overhead_pct"]].mean().assign(outcome="completed")
    failure_free = float(done.baseline_accuracy.mean()) if "baseline_accuracy" in done and len(done) else None
    by = ("world_size", "seed")
    for label, key in (("rollback", f"{entry}.rollback_keeps_accuracy"),
                       ("forward", f"{entry}.forward_loses_accuracy_bounded")):
        v.decide(key, -seeds[seeds.strategy == label].accuracy_loss_pt, f"{label} - failure-free, pt",
                 reference=failure_free)
    if f"{entry}.forward_trades_accuracy" in registry.load().findings:
        v.decide(f"{entry}.forward_trades_accuracy", paired(seeds, "forward", "rollback", "accuracy_loss_pt", by),
                 "rollback - forward accuracy, pt", reference=failure_free)
    v.decide(f"{entry}.forward_faster_than_rollback",
             paired(seeds, "rollback", "forward", "rank_overhead_pct", by), "rollback - forward, rank-time pt")
    for label in sorted(hit.strategy[hit.strategy.str.startswith("checkpoint_restart")].unique()):
        v.decide(f"{entry}.restart_costs_more", paired(seeds, label, "rollback", "rank_overhead_pct", by),
                 f"{label} - rollback, rank-time pt")


def figure(frame: Any) -> Any:
    """The paper's view: accuracy loss (points) against runtime overhead (% of the failure-free run, on the
    rank-time clock), mean and 95 % interval per strategy and MTBF, one marker shape per MTBF."""
    import plotly.graph_objects as go

    stats = statistics(frame)
    fig = go.Figure()
    symbols = ["circle", "diamond", "square", "triangle-up"]
    for k, ((world, mtbf), part) in enumerate(stats.groupby(["world_size", "mtbf"])):
        for _, row in part.iterrows():
            fig.add_trace(go.Scatter(
                x=[row.overhead_pct], y=[row.loss_pt], mode="markers",
                name=f"{row.strategy} (world {world}, MTBF {mtbf} steps)",
                marker={"size": 11, "symbol": symbols[k % 4]},
                error_x={"type": "data", "symmetric": False, "array": [row.overhead_high - row.overhead_pct],
                         "arrayminus": [row.overhead_pct - row.overhead_low]},
                error_y={"type": "data", "symmetric": False, "array": [row.loss_high - row.loss_pt],
                         "arrayminus": [row.loss_pt - row.loss_low]}))
    fig.update_layout(title="accuracy loss vs runtime overhead under random failures (mean, 95 % interval)",
                      xaxis_title="runtime overhead (% of the failure-free run, rank-time clock)",
                      yaxis_title="test accuracy lost (points)", template="plotly_white", height=480)
    return fig


def curve(frame: Any) -> Any:
    """The trade-off over the failure rate: runtime overhead (rank-time clock) and accuracy lost per strategy
    against failures per 1000 steps (1000 / MTBF), mean and 95 % interval over seeds."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    stats = statistics(frame)
    fig = make_subplots(rows=1, cols=2, subplot_titles=("runtime overhead (% of failure-free, rank-time clock)",
                                                        "test accuracy lost (points)"))
    for label, part in stats.sort_values("mtbf", ascending=False).groupby("strategy", sort=False):
        rate = [1000 / m if m else 0 for m in part.mtbf]
        for col, (mean, low, high) in enumerate((("overhead_pct", "overhead_low", "overhead_high"),
                                                 ("loss_pt", "loss_low", "loss_high")), start=1):
            fig.add_trace(go.Scatter(x=rate, y=part[mean], mode="lines+markers", name=label, legendgroup=label,
                                     showlegend=col == 1,
                                     error_y={"type": "data", "symmetric": False, "array": part[high] - part[mean],
                                              "arrayminus": part[mean] - part[low]}), row=1, col=col)
    fig.update_xaxes(title_text="failures per 1000 steps (1000 / MTBF)")
    fig.update_layout(title="the trade-off over the failure rate (mean, 95 % interval over seeds)",
                      template="plotly_white", height=440)
    return fig
