"""Recovery costs against world size and model size: one JSON line per (strategy, model, world) point.

Each point runs a strategy (or a peer system) with planned kills until it has seen ``--failures`` failures (a
shrinking strategy loses at most world-1 ranks a run, so it takes several runs) and records, per failure, the
detection, the settle (fault to every member holding the agreed state), the replacement's join, the resume, the
regrow, the bytes moved, the steps redone and samples lost; per checkpoint its stall on the loop; per step the
failure-free step. Each cost is given as p50 and p99 on the point's clock: the rank-time clock where the ranks
outnumber the usable cores (docs/concepts.md, "Two clocks"), else the wall clock; the wall figures stay beside.
Lines are appended to benchmarks/results/costs.jsonl; a point already there is skipped (the campaign resumes).
``benchmarks/fit_costs.py`` fits the laws. Usage:
    python benchmarks/bench_costs.py [--models 1M,19M,100M] [--worlds 2,4] [--only shrink,torchft] [--failures 10]
                                     [--out FILE] [--plan]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_recovery  # noqa: E402  (the run and kill plan every recovery benchmark shares)

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "costs.jsonl"
MODELS = {"1M": "million", "19M": "large", "100M": "huge"}  # campaign name: bench_recovery.MODELS entry
DIGITS = (64, 10)  # the default data set's inputs and classes: the MLP's first and last widths
STRATEGIES = {
    "checkpoint_restart": bench_recovery.STRATEGIES["checkpoint_restart"],
    "shrink": bench_recovery.STRATEGIES["shrink"],
    "rollback": bench_recovery.STRATEGIES["rollback"],
    "forward": bench_recovery.STRATEGIES["forward"],
    "reinit": bench_recovery.STRATEGIES["reinit"],
    "regrow": bench_recovery.STRATEGIES["shrink+regrow (warm spare)"],
    "torchft": bench_recovery.PEERS["torchft (peer)"],
    "torchrun": bench_recovery.PEERS["torchrun (peer)"],
    "ulfm": bench_recovery.PEERS["ulfm (peer)"],
}
# the grid, smallest points first: the order the campaign runs them in
GRID = [("1M", 2), ("1M", 4), ("1M", 8), ("19M", 2), ("19M", 4), ("1M", 16), ("19M", 8), ("1M", 32), ("100M", 2)]
TIMES = ("detection_s", "settle_s", "join_s", "resume_s", "regrow_s")  # per failure, on both clocks
COUNTS = ("bytes_moved", "steps_redone", "samples_lost")  # per failure
STEP_GUESS_S = {"1M": 0.013, "19M": 0.15, "100M": 0.8}  # one step at world 2 on this machine, for the estimate
TORCHFT_SPACING = 4  # torchft's kills this many times further apart (a kill before the heal never fires)
EXTRA_RUNS = 4  # runs beyond the plan, for kills that never fired
START_GUESS_S = {"ulfm": 9.0, "torchft": 5.0, "torchrun": 5.0}  # a run's start-up and teardown (else 0.5 s)
RECOVERY_GUESS_S = {"torchrun": 6.0, "torchft": 2.5, "reinit": 1.5, "checkpoint_restart": 0.4}  # else 0.3 s


class OneLineParser(argparse.ArgumentParser):
    """Bad arguments are one line, exit 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"bench_costs: {message}\n")


def parameters(model: str) -> int:
    """The MLP's parameter count (weights and biases) for ``model`` on digits."""
    widths = [DIGITS[0], *bench_recovery.MODELS[MODELS[model]]["hidden"], DIGITS[1]]
    return sum(a * b + b for a, b in zip(widths, widths[1:]))


def percentiles(values: list[float]) -> dict[str, float | int | None]:
    """p50 and p99 (linear interpolation between order statistics: with 10 values p99 is near the largest)."""
    values = [v for v in values if v is not None]
    if not values:
        return {"p50": None, "p99": None, "n": 0}
    p50, p99 = numpy.percentile(values, [50, 99])
    return {"p50": round(float(p50), 6), "p99": round(float(p99), 6), "n": len(values)}


def runs_needed(strategy: str, world: int, failures: int) -> tuple[int, int]:
    """(runs, kills per run) for ``failures`` failures: a shrinking strategy loses at most world-1 ranks a run."""
    if bench_recovery.shrinks(STRATEGIES[strategy]):
        per_run = min(failures, world - 1)
        return math.ceil(failures / per_run), per_run
    return 1, failures


def estimate_s(model: str, world: int, strategy: str, failures: int, cores: int) -> float:
    """A rough wall time of one point, for the campaign's estimate (the step guess scaled by ranks per core; the
    start-up and recovery guesses from the first points measured on this machine, unloaded)."""
    runs, kills = runs_needed(strategy, world, failures)
    gap = bench_recovery.MODELS[MODELS[model]]["steps_between"]
    steps = gap * (kills + 1) * (TORCHFT_SPACING if strategy == "torchft" else 1)
    step = STEP_GUESS_S[model] * max(1.0, world / cores)
    start = START_GUESS_S.get(strategy, 0.5) + 0.1 * world
    return runs * (start + steps * step + kills * RECOVERY_GUESS_S.get(strategy, 0.3))


def machine() -> str:
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor()) if Path("/proc/cpuinfo").exists() else ""
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return f"{platform.node()}: {cpu}, {os.cpu_count()} cores, {memory:.0f} GiB"


def commit() -> str:
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True).stdout.strip()

    head = git("rev-parse", "--short", "HEAD") or "unknown"
    dirty = git("status", "--porcelain", "--untracked-files=no", "--", "workbench", "benchmarks",
                ":(exclude)benchmarks/results")  # the code measuring, not the figures it appends to
    return head + ("+dirty" if dirty else "")


def done_points(path: Path, failures: int) -> set[tuple[str, str, int]]:
    """The (strategy, model, world) points already in ``path`` with ``failures`` failures (or unavailable): a
    point short of them is measured again, and its new line supersedes the old."""
    if not path.exists():
        return set()
    points = set()
    for line in path.read_text().splitlines():
        if line.strip():
            row = json.loads(line)
            if row.get("unavailable") or row.get("n_failures", failures) >= failures:
                points.add((row["strategy"], row["model"], row["world"]))
    return points


def stalls_s(result: Any) -> list[float]:
    """Each checkpoint's stall on the training loop, seconds (from the run's checkpoint events)."""
    from workbench.faults import events as ev

    return [float(e["stall_s"]) for e in ev.of(result.events, ev.CHECKPOINT)]


def steady_steps(result: Any, key: str) -> list[float]:
    """Step times outside recoveries: each generation's first two steps (its warm-up) left out."""
    seen: dict[int, int] = {}
    times = []
    for row in result.metrics:
        seen[row["generation"]] = seen.get(row["generation"], 0) + 1
        if seen[row["generation"]] > 2 and row.get(key) is not None and math.isfinite(row[key]):
            times.append(row[key])
    return times


def measure_point(model: str, world: int, strategy: str, failures: int, cores: int) -> dict[str, Any]:
    """Run ``strategy`` on ``model`` at ``world`` until ``failures`` failures are seen: the point's JSON row."""
    from workbench.base.errors import ConfigError
    from workbench.strategies.peers import require_peer

    extra = STRATEGIES[strategy]
    clock = "rank" if world > cores else "wall"
    row: dict[str, Any] = {"benchmark": "costs", "strategy": strategy, "model": model, "params": parameters(model),
                           "world": world, "clock": clock}
    try:
        require_peer(extra["strategy"])
    except ConfigError as exc:
        return {**row, "n_failures": 0, "unavailable": str(exc)}
    planned, per_run = runs_needed(strategy, world, failures)
    base, gap = bench_recovery.base_config(MODELS[model], world, per_run)
    if strategy == "torchft":  # its replica group heals in seconds while the others train: kills spaced wider
        gap *= TORCHFT_SPACING
        base["steps"] = gap * (per_run + 1) + gap // 2
        base["eval_interval"] = base["steps"]
    seen: list[dict] = []
    stalls: list[float] = []
    steps: dict[str, list[float]] = {"wall": [], "rank": []}
    outcomes: list[str] = []
    loads: list[float] = []
    started = time.time()
    runs = 0
    while len(seen) < failures and runs < planned + EXTRA_RUNS:  # a kill that never fired is made up by another run
        result = bench_recovery.run_with_kills(base, gap, extra, per_run)
        runs += 1
        loads.append(os.getloadavg()[0])
        seen += result.failures
        stalls += stalls_s(result)
        steps["wall"] += steady_steps(result, "step_time")
        steps["rank"] += steady_steps(result, "rank_step_time")
        outcomes.append(result.outcome if result.outcome == "completed" else
                        f"{result.outcome}: {result.summary.get('reason')}")
    costs: dict[str, Any] = {}
    for name in TIMES:
        wall = percentiles([f.get(name) for f in seen])
        rank = percentiles([f.get(f"rank_{name}") for f in seen])
        primary = rank if clock == "rank" else wall
        costs[name] = {**primary, "clock": clock, "wall_p50": wall["p50"], "wall_p99": wall["p99"],
                       "rank_p50": rank["p50"], "rank_p99": rank["p99"]}
    for name in COUNTS:
        costs[name] = {**percentiles([f.get(name, 0) for f in seen]), "clock": "count"}
    costs["checkpoint_stall_s"] = {**percentiles(stalls), "clock": "wall"}  # the loop's own wait, not shared
    step_clock = clock if steps[clock] else "wall"  # a run that stamps no rank-time step: its wall steps
    wall_step = percentiles(steps["wall"])
    costs["step_s"] = {**percentiles(steps[step_clock]), "clock": step_clock, "wall_p50": wall_step["p50"],
                       "wall_p99": wall_step["p99"]}
    return {**row, "n_failures": len(seen), "runs": runs, "kills_per_run": per_run, "kills_planned": runs * per_run,
            "steps_per_run": base["steps"],
            "steps_between_kills": gap, "outcomes": outcomes, "costs": costs,
            "load_1min": round(max(loads), 2), "load_1min_runs": [round(v, 2) for v in loads],
            "bench_wall_s": round(time.time() - started, 1),
            "date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "commit": commit(),
            "machine": machine()}


def plan(models: list[str], worlds: list[int] | None, only: list[str]) -> list[tuple[str, int, str]]:
    """The grid's (model, world, strategy) points chosen, smallest first."""
    return [(model, world, strategy) for model, world in GRID if model in models and (not worlds or world in worlds)
            for strategy in STRATEGIES if not only or strategy in only]


def parse_list(parser: argparse.ArgumentParser, flag: str, text: str, allowed: list[str]) -> list[str]:
    chosen = [item for item in text.split(",") if item]
    for item in chosen:
        if item not in allowed:
            parser.error(f"{flag} {item!r} is not known: allowed {', '.join(allowed)}")
    return chosen


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS), help="of 1M, 19M, 100M (default all)")
    parser.add_argument("--worlds", default="", help="only these world sizes of the grid (default all)")
    parser.add_argument("--only", default="", help="only these strategies and peers (default all)")
    parser.add_argument("--failures", type=int, default=10, help="failures per point (default 10)")
    parser.add_argument("--out", default=str(RESULTS), help="the JSON-lines file (default %(default)s)")
    parser.add_argument("--plan", action="store_true", help="print the points left and the estimate, run nothing")
    args = parser.parse_args(argv)
    models = parse_list(parser, "--models", args.models, list(MODELS))
    only = parse_list(parser, "--only", args.only, list(STRATEGIES))
    worlds = []
    for text in (w for w in args.worlds.split(",") if w):
        if not text.isdigit() or int(text) < 2:
            parser.error(f"--worlds {text!r} is not allowed: world sizes of at least 2, comma-separated")
        worlds.append(int(text))
    if args.failures < 1:
        parser.error(f"--failures {args.failures} is not allowed: at least 1")
    points = plan(models, worlds, only)
    if not points:
        parser.error("no point of the grid is chosen: the grid is " +
                     ", ".join(f"{model}@{world}" for model, world in GRID))
    from workbench.base.machine import usable_cores

    cores = usable_cores()
    out = Path(args.out)
    done = done_points(out, args.failures)
    left = [p for p in points if (p[2], p[0], p[1]) not in done]
    total = sum(estimate_s(model, world, strategy, args.failures, cores) for model, world, strategy in left)
    print(f"bench_costs: {len(points) - len(left)} of {len(points)} points already in {out}; {len(left)} to run, "
          f"about {total / 60:.0f} min on {cores} cores", file=sys.stderr, flush=True)
    if args.plan:
        for model, world, strategy in left:
            print(f"  {model}@{world} {strategy}: ~{estimate_s(model, world, strategy, args.failures, cores):.0f} s",
                  file=sys.stderr)
        return 0
    out.parent.mkdir(parents=True, exist_ok=True)
    for model, world, strategy in left:
        row = measure_point(model, world, strategy, args.failures, cores)
        with out.open("a") as handle:
            handle.write(json.dumps(row) + "\n")
        costs = row.get("costs", {})
        print(f"{model}@{world} {strategy}: {row['n_failures']} failures, settle p50 "
              f"{costs.get('settle_s', {}).get('p50')} s ({row['clock']}), {row.get('bench_wall_s')} s wall, "
              f"load {row.get('load_1min')}", file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
