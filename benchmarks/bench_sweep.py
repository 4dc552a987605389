"""The same 8-point sweep through ``workbench sweep`` and through a sequential loop of the ``papermill`` CLI.

Points: ``notebooks/permanent_faults.ipynb``, strategy shrink / rollback / forward / reinit x seed 0 / 1, each
point a no-fault run and a run that loses one rank (``--world-size``, ``--steps``). The loop runs
``papermill IN OUT -p ... -p out DIR`` once per point, one after the other; the sweep runs the same points in a
fresh directory (its default ``--jobs`` unless given). Both must leave 8 ``result.h5``. Rounds alternate which
side goes first. Prints one JSON line: both wall times per round, their medians, the ratio sweep / loop
(aim ≤ 0.6), the CPU seconds per point of each side (all descendant processes: this process adopts the orphans
— a kernel's rank template outlives the kernel by a moment — and reaps them, so their CPU counts too) and the
1-minute load average before and after.
Usage: python benchmarks/bench_sweep.py [--world-size 2] [--steps 150] [--jobs N] [--rounds 1]
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "notebooks" / "permanent_faults.ipynb"
GRID = {"strategy": ["shrink", "rollback", "forward", "reinit"], "seed": [0, 1]}


def points(fixed: dict[str, object], grid: dict[str, list] = GRID) -> list[dict[str, object]]:
    return [{"strategy": s, "seed": seed, **fixed} for s in grid["strategy"] for seed in grid["seed"]]


def children_cpu() -> float:
    """CPU seconds of every finished descendant (kernels and ranks are reaped by their parents, so they count)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def adopt_orphans() -> None:
    """Linux: descendants whose parent ended become this process's children (PR_SET_CHILD_SUBREAPER)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(36, 1)
    except (OSError, AttributeError):
        pass


def reap_orphans(timeout: float = 10.0) -> None:
    """Reap the adopted descendants as they end (bounded): their CPU time then counts in RUSAGE_CHILDREN."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return  # none left
        if pid == 0:
            time.sleep(0.05)


def papermill_loop(work: Path, fixed: dict[str, object], grid: dict[str, list] = GRID) -> float:
    exe = Path(sys.executable).parent / "papermill"
    base = [str(exe)] if exe.exists() else [sys.executable, "-m", "papermill"]
    t0 = time.perf_counter()
    for i, point in enumerate(points(fixed, grid)):
        out = work / f"{i:02d}"
        out.mkdir(parents=True)
        args = [a for k, v in {**point, "out": str(out)}.items() for a in ("-p", k, str(v))]
        subprocess.run([*base, str(NOTEBOOK), str(out / NOTEBOOK.name), *args, "--no-progress-bar"], check=True,
                       capture_output=True)
    elapsed = time.perf_counter() - t0
    n = len(points(fixed, grid))
    assert len(list(work.glob("*/result.h5"))) == n, f"the papermill loop did not produce {n} results"
    return elapsed


def workbench_sweep(work: Path, fixed: dict[str, object], jobs: int | None, grid: dict[str, list] = GRID) -> float:
    args = ["-p", "strategy", *grid["strategy"], "-p", "seed", *map(str, grid["seed"])]
    args += [a for k, v in fixed.items() for a in ("-p", k, str(v))]
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "workbench", "sweep", str(NOTEBOOK), *args, "--out", str(work),
                    "--no-progress", *(["--jobs", str(jobs)] if jobs else [])], check=True, capture_output=True)
    elapsed = time.perf_counter() - t0
    n = len(points(fixed, grid))
    assert len(list(work.glob("*/result.h5"))) == n, f"the sweep did not produce {n} results"
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--jobs", type=int)
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args()
    fixed = {"world_size": args.world_size, "steps": args.steps,
             "fault": f"kill:rank={args.world_size - 1},step={args.steps // 2}"}
    from workbench.launch.sweeps.run import default_jobs, notebook_parameters

    jobs = args.jobs or default_jobs(points(fixed), notebook_parameters(NOTEBOOK))
    loop_s, sweep_s, cpu = [], [], {"loop": 0.0, "sweep": 0.0}
    adopt_orphans()
    load_before = os.getloadavg()[0]
    for r in range(args.rounds):
        work = Path(tempfile.mkdtemp(prefix="bench_sweep-"))
        try:
            for side in ("loop", "sweep") if r % 2 == 0 else ("sweep", "loop"):
                before = children_cpu()
                if side == "loop":
                    loop_s.append(papermill_loop(work / "loop", fixed))
                else:
                    sweep_s.append(workbench_sweep(work / "sweep", fixed, args.jobs))
                reap_orphans()
                cpu[side] += children_cpu() - before
        finally:
            shutil.rmtree(work, ignore_errors=True)
    loop, sweep = statistics.median(loop_s), statistics.median(sweep_s)
    print(json.dumps({"bench": "sweep", "notebook": NOTEBOOK.name, "points": 8, **fixed, "jobs": jobs,
                      "cores": os.cpu_count(), "papermill_loop_s": [round(v, 2) for v in loop_s],
                      "sweep_s": [round(v, 2) for v in sweep_s], "papermill_loop_median_s": round(loop, 2),
                      "sweep_median_s": round(sweep, 2), "ratio": round(sweep / loop, 3), "aim": 0.6,
                      "cpu_s_per_point": {k: round(v / (8 * args.rounds), 2) for k, v in cpu.items()},
                      "load_1min": [round(load_before, 2), round(os.getloadavg()[0], 2)]}))


if __name__ == "__main__":
    main()
