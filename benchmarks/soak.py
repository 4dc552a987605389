"""Soak: live SIGKILLs at random wall-clock moments, run after run, across the recovery strategies.

Each run trains the MLP on digits for far more steps than it will live (``workbench.start``); the script sends
``run.kill(rank)`` at moments drawn uniformly from ``--min-gap`` to ``--max-gap`` seconds apart (the first one
after training started), each to a rank drawn uniformly from the current generation's members
(``run.status["members"]``, rank 0 included; a rank already killed in that generation is not drawn again), so
kills land inside collectives, state transfers, checkpoint writes and generation changes. After
``--kills-per-run`` kills (or earlier, if the run ends by itself) the run is stopped and waited for, at most
``--stop-timeout`` seconds. Runs cycle through ``--strategies``: ``shrink``, ``rollback`` and ``forward`` with
``regrow=True``, ``reinit``, ``checkpoint_restart`` (checkpoint every ``--checkpoint-every`` steps), until
``--kills`` kills have been sent.

Per run: kills sent (and how many the supervisor skipped: target not alive), the failures the run recorded, its
outcome and reason. A run *survived* if its outcome is ``stopped`` or ``completed``; a *hang* is a run that did not
end within the bound after ``stop()`` (its processes are then killed); *orphans* are the processes of the
project (found by command line, whoever their parent is: ``tests/leaks.py``) that a run leaves more than
``--orphan-wait`` seconds after it ended, this process's own idle rank template excepted; they are killed.

Progress goes to stderr; the last stdout line is one JSON object: ``kills``, ``kills_skipped``, ``runs``,
``runs_survived``, ``per_strategy`` (runs, survived, kills, failures recorded, outcomes),
``regrow_reinit_survived_share`` (survived / runs over the regrow and reinit runs), ``hangs``, ``orphans`` (and
their command lines),
``failed_causes`` (the reasons of the runs that ended ``failed``, digits replaced by N, with counts and one
example each), ``wall_s``, the settings, and ``runs_detail`` (one row per run). Exit code 0 unless the script
itself breaks: failures to survive are what it measures.

Usage:
    python benchmarks/soak.py                       # small: 40 kills, runs of up to 8 (~3 min on 2 cores)
    python benchmarks/soak.py --kills 1000          # the full soak: 125 runs, 25 per strategy
    python benchmarks/soak.py --kills 1000 --kills-per-run 10 --seed 7 --strategies rollback reinit
    python benchmarks/soak.py --spawn VALUE         # passed to RunConfig.spawn when RunConfig has that field
"""

from __future__ import annotations

import argparse
import collections
import json
import random
import re
import sys
import time
from pathlib import Path
from typing import Any

import yaml

import workbench
from workbench.config.run import REGROW_STRATEGIES, RunConfig

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
import leaks  # noqa: E402 - the project's processes by command line, shared with the tests' leak check

STRATEGIES = ("shrink", "rollback", "forward", "reinit", "checkpoint_restart")
POLL_S = 0.01


def log(message: str) -> None:
    print(f"[soak {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def label(strategy: str) -> str:
    return f"{strategy}+regrow" if strategy in REGROW_STRATEGIES else strategy


def run_config(args: argparse.Namespace, strategy: str, seed: int) -> dict[str, Any]:
    config = {"world_size": args.world_size, "steps": args.steps, "strategy": strategy,
              "regrow": strategy in REGROW_STRATEGIES, "model": "mlp", "dataset": "digits", "seed": seed}
    if strategy == "checkpoint_restart":
        config["checkpoint_every"] = args.checkpoint_every
    if args.spawn is not None and "spawn" in RunConfig.__dataclass_fields__:
        config["spawn"] = args.spawn
    return config


def wait_training(run: workbench.Run, timeout: float) -> bool:
    """Until the run trains (True) or ends or the bound passes (False)."""
    deadline = time.monotonic() + timeout
    while not run.done and time.monotonic() < deadline:
        if run.status.get("state") == "running" and run.status.get("members"):
            return True
        time.sleep(POLL_S)
    return False


def soak_run(args: argparse.Namespace, rng: random.Random, strategy: str, seed: int, budget: int,
             tag: str) -> dict[str, Any]:
    before = {p.key for p in leaks.project_processes(tag)}
    t0 = time.monotonic()
    run = workbench.start(**run_config(args, strategy, seed))
    row: dict[str, Any] = {"strategy": label(strategy), "seed": seed, "kills": 0, "targets": [], "hang": False}
    if wait_training(run, args.start_timeout):
        killed: set[int] = set()  # ranks killed in the current generation (it still lists them)
        generation = run.status.get("generation")
        while row["kills"] < budget and not run.done:
            moment = time.monotonic() + rng.uniform(args.min_gap, args.max_gap)
            target = None
            while not run.done:  # at the moment, or as soon after it as a live member is there to be killed
                status = run.status
                if status.get("generation") != generation:
                    generation, killed = status.get("generation"), set()
                alive = [m for m in status.get("members") or [] if m not in killed]
                if time.monotonic() >= moment and alive:
                    target = rng.choice(alive)
                    break
                time.sleep(POLL_S)
            if target is None:
                break
            run.kill(target)
            killed.add(target)
            row["kills"] += 1
            row["targets"].append(target)
    else:
        row["note"] = "ended or not training before the first kill" if run.done else \
            f"not training {args.start_timeout:g} s after start"
    row["ended_by_itself"] = run.done
    run.stop("soak: kill budget spent")
    try:
        result = run.wait(timeout=args.stop_timeout)
    except TimeoutError:
        row["hang"] = True
        left = leaks.new_processes(before, tag)
        leaks.kill(left)
        row.update(outcome="hang", reason=f"no end {args.stop_timeout:g} s after stop()", failures=None,
                   kills_skipped=None, hang_processes_killed=[p.args for p in left], orphans=[])
        row["wall_s"] = round(time.monotonic() - t0, 2)
        return row
    left = leaks.wait_gone(before, tag, timeout=args.orphan_wait)
    leaks.kill(left)
    row.update(outcome=result.outcome, reason=result.summary["reason"], failures=len(result.failures),
               kills_skipped=sum(1 for e in result.events if e["kind"] == "fault_skipped"),
               steps=result.summary.get("steps_completed"), orphans=[p.args for p in left],
               wall_s=round(time.monotonic() - t0, 2))
    return row


def summarise(rows: list[dict[str, Any]], args: argparse.Namespace, wall: float) -> dict[str, Any]:
    per: dict[str, dict[str, Any]] = {}
    for r in rows:
        s = per.setdefault(r["strategy"], {"runs": 0, "survived": 0, "kills": 0, "failures": 0,
                                           "outcomes": collections.Counter()})
        s["runs"] += 1
        s["survived"] += r["outcome"] in ("stopped", "completed")
        s["kills"] += r["kills"]
        s["failures"] += r["failures"] or 0
        s["outcomes"][r["outcome"]] += 1
    for s in per.values():
        s["outcomes"] = dict(s["outcomes"])
    causes: dict[str, dict[str, Any]] = {}
    for r in rows:
        if r["outcome"] == "failed":
            cause = causes.setdefault(re.sub(r"\d+", "N", r["reason"]), {"count": 0, "example": r["reason"]})
            cause["count"] += 1
    regrowing = [r for r in rows if r["strategy"].endswith("+regrow") or r["strategy"] == "reinit"]
    orphans = [args_ for r in rows for args_ in r["orphans"]]
    return {
        "benchmark": "soak",
        "kills": sum(r["kills"] for r in rows),
        "kills_skipped": sum(r["kills_skipped"] or 0 for r in rows),
        "runs": len(rows),
        "runs_survived": sum(s["survived"] for s in per.values()),
        "per_strategy": per,
        "regrow_reinit_survived_share": round(sum(r["outcome"] in ("stopped", "completed") for r in regrowing)
                                              / len(regrowing), 3) if regrowing else None,
        "hangs": sum(r["hang"] for r in rows),
        "orphans": len(orphans),
        "orphan_commands": sorted(set(orphans))[:10],
        "failed_causes": sorted(({"cause": k, **v} for k, v in causes.items()), key=lambda c: -c["count"]),
        "wall_s": round(wall, 1),
        "settings": {"world_size": args.world_size, "kills_per_run": args.kills_per_run, "min_gap": args.min_gap,
                     "max_gap": args.max_gap, "seed": args.seed, "checkpoint_every": args.checkpoint_every,
                     "spawn": args.spawn if "spawn" in RunConfig.__dataclass_fields__ else None},
        "runs_detail": rows,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kills", type=int, default=40, help="kills in all (default 40)")
    parser.add_argument("--kills-per-run", type=int, default=8, help="kills before a run is stopped (default 8)")
    parser.add_argument("--min-gap", type=float, default=0.05, help="shortest time between kills, s")
    parser.add_argument("--max-gap", type=float, default=1.2, help="longest time between kills, s")
    parser.add_argument("--world-size", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0, help="kill moments and targets; run i trains with seed+i")
    parser.add_argument("--strategies", nargs="+", default=list(STRATEGIES), choices=STRATEGIES, metavar="S",
                        help=f"cycled through run after run (default: {' '.join(STRATEGIES)})")
    parser.add_argument("--checkpoint-every", type=int, default=10, help="checkpoint_restart's period, steps")
    parser.add_argument("--steps", type=int, default=10_000_000, help="steps a run is configured for")
    parser.add_argument("--start-timeout", type=float, default=180.0, help="bound on a run's start-up, s")
    parser.add_argument("--stop-timeout", type=float, default=60.0, help="bound on a run's end after stop(), s")
    parser.add_argument("--orphan-wait", type=float, default=3.0, help="grace for a run's processes to go, s")
    parser.add_argument("--spawn", type=yaml.safe_load, default=None,
                        help="RunConfig.spawn, when RunConfig has that field (value read as YAML)")
    args = parser.parse_args(argv)
    if args.spawn is not None and "spawn" not in RunConfig.__dataclass_fields__:
        log("RunConfig has no 'spawn' field: --spawn ignored")
    tag = leaks.tag_this_process()  # every process started from here on carries it: the orphans counted are ours
    rng = random.Random(args.seed)
    rows: list[dict[str, Any]] = []
    t0 = time.monotonic()
    sent = 0
    while sent < args.kills:
        strategy = args.strategies[len(rows) % len(args.strategies)]
        seed = args.seed + len(rows)
        budget = min(args.kills_per_run, args.kills - sent)
        log(f"run {len(rows) + 1}: {label(strategy)}, seed {seed}, up to {budget} kills")
        row = soak_run(args, rng, strategy, seed, budget, tag)
        rows.append(row)
        sent += row["kills"]
        log(f"  {row['outcome']} after {row['kills']} kills (targets {row['targets']}, {row['kills_skipped']} "
            f"skipped), {row['failures']} failures recorded, {row['wall_s']} s: {row['reason']}"
            + (f"; HANG, killed {len(row['hang_processes_killed'])} processes" if row["hang"] else "")
            + (f"; {len(row['orphans'])} ORPHANS killed: {row['orphans']}" if row["orphans"] else ""))
        if len(rows) >= 3 and not any(r["kills"] for r in rows[-3:]):
            log("three runs in a row took no kill: giving up")
            break
    print(json.dumps(summarise(rows, args, time.monotonic() - t0)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
