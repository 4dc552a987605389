"""Recovery cost of every strategy: detection, resume, steps redone, samples lost, total overhead.

For each model size and world size, one no-fault baseline run and one run per strategy with K kills spaced
evenly (plain ``shrink`` can lose at most world-1 ranks, so it gets fewer). ``checkpoint_restart`` is the
torchrun-style baseline: tear the world down, start fresh ranks, reload the last HDF5 checkpoint.
``overhead_s`` is training time beyond the no-fault run of the same configuration, measured in the same process.

``--peers`` adds the peer systems measured in the same run on the same model, data and kills: ``torchft``
(torchft 0.2: lighthouse heartbeat detection, the dead replica restarted and healed from a peer; needs
``pip install -e .[peers]``), ``torchrun`` (the elastic agent restarts the world from the last checkpoint) and
``ulfm`` (Open MPI 5 with ULFM via mpi4py: the survivors revoke, shrink, agree and go on; ``pip install -e .[mpi]``),
with ``mpi, no FT``: the same MPI ranks under mpirun without fault tolerance, no kill (its per-step time only).
``step_ms`` is the median step time of the run, ``step_vs_ours`` that over our no-fault run's (per-step overhead).
``bytes_moved`` is the state received by ranks over all recoveries of the run (0 when the survivors agree).
``settle_s`` (fault to every member holding the agreed state) and ``join_s`` (the last member entering the recovery
to the last holding the agreed state: the recovery protocol alone) are medians over the run's failures.
``rank_settle_s``, ``rank_join_s``, ``rank_resume_s``, ``rank_regrow_s``, ``rank_overhead_s`` and
``baseline_rank_train_s`` are the same on the rank-time clock (docs/concepts.md, "Two clocks").
``--spawns template,fresh`` repeats every row with ranks forked by the rank template and started fresh.

``--stall`` measures instead what a checkpoint costs the training loop: per model, one failure-free
``checkpoint_restart`` run (world 2 unless ``--worlds``) with a checkpoint every 10 steps and ``--saves`` of them;
``stall_ms`` is the time the loop waited for each save (the snapshot's references, a write still running, and any
wait of an update for the background copy; the run's events give it to 0.1 ms), beside the median step time
(``step_ms``), their ratio, the median step right after a save (``after_save_ms``: the writer's copy and HDF5
write run beside it) and the HDF5 write time; one JSON line {"benchmark": "checkpoint_stall", "rows": [...]}.

Prints one JSON line: {"benchmark": "recovery", "rows": [...]} with one row per (model, world, strategy).
Usage: python benchmarks/bench_recovery.py [--worlds 2,4,8] [--models small,million,large,huge] [--kills 5] [--quick]
       [--peers] [--spawns template,fresh] [--strategies shrink,reinit,...]
       python benchmarks/bench_recovery.py --stall [--models small,large] [--worlds 2] [--saves 10]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import workbench
from workbench.faults import events as ev

MODELS = {
    "small": {"hidden": [128, 64], "steps_between": 150, "bucket_cap_mb": 1.0, "params_m": 0.02},
    "million": {"hidden": [1024, 896], "steps_between": 40, "bucket_cap_mb": 4.0, "params_m": 0.99},
    "large": {"hidden": [4096, 4608], "steps_between": 8, "bucket_cap_mb": 25.0, "params_m": 19.2},
    "huge": {"hidden": [8192, 12288], "steps_between": 4, "bucket_cap_mb": 100.0, "params_m": 101.3},
}
STRATEGIES = {
    "checkpoint_restart": {"strategy": "checkpoint_restart"},
    "reinit": {"strategy": "reinit"},
    "shrink": {"strategy": "shrink"},
    "rollback": {"strategy": "rollback"},
    "forward": {"strategy": "forward"},
    "rollback+regrow": {"strategy": "rollback", "regrow": True},
    "forward+regrow": {"strategy": "forward", "regrow": True},
    "shrink+regrow (warm spare)": {"strategy": "shrink", "regrow": True},
    "shrink+regrow (fresh rank)": {"strategy": "shrink", "regrow": True, "warm_spares": 0},
}
PEERS = {"torchft (peer)": {"strategy": "torchft"}, "torchrun (peer)": {"strategy": "torchrun"},
         "ulfm (peer)": {"strategy": "ulfm"}, "mpi, no FT (peer)": {"strategy": "ulfm", "ft": False}}


def median(values: list[float | None]) -> float | None:
    values = [v for v in values if v is not None]
    return round(statistics.median(values), 4) if values else None


def step_ms(result: workbench.RunResult) -> float | None:
    return median([row["step_time"] * 1e3 for row in result.metrics])


def base_config(model: str, world: int, kills: int, spawn: str = "template") -> tuple[dict, int]:
    """The run settings every strategy of ``model`` at ``world`` shares, and the steps between two kills."""
    spec = MODELS[model]
    gap = spec["steps_between"]
    steps = gap * (kills + 1) + gap // 2
    base = {"world_size": world, "steps": steps, "hidden": spec["hidden"], "eval_interval": steps,
            "bucket_cap_mb": spec["bucket_cap_mb"], "checkpoint_every": max(gap // 2, 2), "spawn": spawn}
    return base, gap


def shrinks(extra: dict) -> bool:
    """Whether the strategy of ``extra`` (a STRATEGIES or PEERS entry) ends smaller after a kill."""
    return extra["strategy"] in ("shrink", "rollback", "forward", "ulfm") and not extra.get("regrow")


def kill_config(base: dict, gap: int, extra: dict, kills: int) -> dict:
    """One strategy's run with ``kills`` kills spaced ``gap`` steps apart (fewer where the world would empty)."""
    world = base["world_size"]
    shrinking = shrinks(extra)
    n = 0 if extra.get("ft") is False else min(kills, world - 1) if shrinking else kills
    # plain shrink loses the highest ranks one by one; the others lose rank 1 again and again (its
    # replacement, once it has joined: a kill planned before that never fires, and the row says so)
    labels = [world - 1 - k for k in range(n)] if shrinking else [1] * n
    faults = [f"kill:rank={label},step={gap * (k + 1) + gap // 4}" for k, label in enumerate(labels)]
    config = {**base, **{k: v for k, v in extra.items() if k != "ft"}, "faults": faults}
    if extra.get("regrow") and "warm_spares" not in extra:
        config["warm_spares"] = n  # a ready spare for every kill: the pool refills more slowly than we kill
    if extra["strategy"] not in ("checkpoint_restart", "reinit", "torchrun"):
        config["checkpoint_every"] = None
    return config


def run_with_kills(base: dict, gap: int, extra: dict, kills: int) -> workbench.RunResult:
    """Run :func:`kill_config`'s run (a peer's ``ft: False`` runs mpirun without fault tolerance)."""
    os.environ["WORKBENCH_ULFM_FT"] = "0" if extra.get("ft") is False else "1"  # mpirun without --with-ft
    return workbench.run(kill_config(base, gap, extra, kills))


def measure(model: str, world: int, kills: int, peers: bool = False, spawn: str = "template",
            only: list[str] | None = None) -> list[dict]:
    spec = MODELS[model]
    base, gap = base_config(model, world, kills, spawn)
    baseline = workbench.run({**base, "checkpoint_every": None})
    rows = []
    ours_ms = step_ms(baseline)
    chosen = {**STRATEGIES, **(PEERS if peers else {})}
    for name, extra in chosen.items():
        if only and not any(name.startswith(o) for o in only):
            continue
        started = time.time()
        result = run_with_kills(base, gap, extra, kills)
        result.set_baseline(baseline)
        failures = result.failures
        rows.append({
            "model": model, "params_m": spec["params_m"], "world_size": world, "strategy": name, "spawn": spawn,
            "outcome": result.outcome, "reason": result.summary["reason"] if result.outcome != "completed" else None,
            "kills": len(failures), "step_ms": step_ms(result),
            "step_vs_ours": None if not ours_ms or step_ms(result) is None else round(step_ms(result) / ours_ms, 3),
            "detection_s": median([f["detection_s"] for f in failures]),
            "settle_s": median([f.get("settle_s") for f in failures]),
            "join_s": median([f.get("join_s") for f in failures]),
            "resume_s": median([f["resume_s"] for f in failures]),
            "regrow_s": median([f["regrow_s"] for f in failures]),
            # the same figures on the rank-time clock (workbench.results.clock): what a core per rank would take
            **{f"rank_{k}": median([f.get(f"rank_{k}") for f in failures])
               for k in ("settle_s", "join_s", "resume_s", "regrow_s")},
            "steps_redone": sum(f["steps_redone"] for f in failures),
            "samples_lost": sum(f["samples_lost"] for f in failures),
            "bytes_moved": sum(f.get("bytes_moved", 0) for f in failures),
            "overhead_s": result.summary["overhead_s"],
            "rank_overhead_s": result.summary.get("rank_overhead_s"),
            "baseline_train_s": baseline.summary["train_s"],
            "baseline_rank_train_s": baseline.summary.get("rank_train_s"),
            "final_world_size": result.summary["world_size_final"],
            "bench_wall_s": round(time.time() - started, 1),
        })
        print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    return rows


def measure_stall(model: str, world: int, saves: int, spawn: str = "template", every: int = 10) -> dict:
    """One failure-free checkpoint_restart run with a checkpoint every ``every`` steps: the stall per save."""
    spec = MODELS[model]
    steps = every * saves + 1  # every save is followed by a step that overlaps its copy and write
    result = workbench.run({"world_size": world, "steps": steps, "hidden": spec["hidden"], "eval_interval": steps,
                            "bucket_cap_mb": spec["bucket_cap_mb"], "strategy": "checkpoint_restart",
                            "checkpoint_every": every, "spawn": spawn})
    saved = ev.of(result.events, ev.CHECKPOINT)  # their fields, to 0.1 ms: the precision the figures keep
    stall = [round(e["stall_s"] * 1e3, 1) for e in saved]
    write = [round(e["write_s"] * 1e3, 1) for e in saved]
    step = step_ms(result)
    after = median([r["step_time"] * 1e3 for r in result.metrics if r["step"] % every == 0 and r["step"] > 0])
    row = {"model": model, "params_m": spec["params_m"], "world_size": world, "spawn": spawn,
           "outcome": result.outcome, "every": every, "saves": len(stall), "stall_ms": median(stall),
           "stall_max_ms": max(stall, default=None), "step_ms": step,
           "stall_vs_step": round(median(stall) / step, 4) if stall and step else None,
           "stall_max_vs_step": round(max(stall) / step, 4) if stall and step else None,
           "after_save_ms": after, "write_ms": median(write), "load_1min": round(os.getloadavg()[0], 2)}
    print(json.dumps(row), file=sys.stderr, flush=True)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worlds", default=None, help="default 2,4,8 (with --stall: 2)")
    parser.add_argument("--models", default="small,large")
    parser.add_argument("--kills", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="small model, world 2 and 4, 2 kills (a smoke run)")
    parser.add_argument("--peers", action="store_true", help="add torchft, torchrun and ulfm rows (pip install -e "
                        ".[peers,mpi])")
    parser.add_argument("--spawns", default="template", help="template, fresh, or both: template,fresh")
    parser.add_argument("--strategies", default="", help="only rows whose name starts with one of these")
    parser.add_argument("--stall", action="store_true", help="the checkpoint stall per save instead (see above)")
    parser.add_argument("--saves", type=int, default=10, help="with --stall: checkpoints per run")
    args = parser.parse_args()
    if args.stall:
        rows = [measure_stall(model, int(world), args.saves, spawn) for model in args.models.split(",")
                for world in (args.worlds or "2").split(",") for spawn in args.spawns.split(",")]
        print(json.dumps({"benchmark": "checkpoint_stall", "rows": rows}))
        return
    if args.peers:
        from workbench.base.errors import ConfigError
        from workbench.strategies.peers import require_peer

        try:
            require_peer("torchft")
            require_peer("ulfm")
        except ConfigError as exc:
            parser.exit(2, f"bench_recovery: --peers: {exc}\n")
    worlds = [2, 4] if args.quick else [int(w) for w in (args.worlds or "2,4,8").split(",")]
    models = ["small"] if args.quick else args.models.split(",")
    kills = 2 if args.quick else args.kills
    only = [s for s in args.strategies.split(",") if s]
    rows = [row for model in models for world in worlds for spawn in args.spawns.split(",")
            for row in measure(model, world, kills, args.peers, spawn, only)]
    print(json.dumps({"benchmark": "recovery", "kills_per_run": kills, "rows": rows}))


if __name__ == "__main__":
    main()
