"""Start-up cost: from the start of a run to its first committed step, ours (rank template, fresh ranks) vs torchrun.

Paths, each at every world size, interleaved repeat by repeat so machine noise hits them all:

``cli_cold_template``  ``workbench run --world-size W --steps 1 --json --out TMP`` as a subprocess: a new process
                       that pays its own torch import and starts its own rank template.
``cli_cold_fresh``     the same with ``--spawn fresh`` (each rank a new interpreter, ``python -m workbench.rank``).
``warm_template``      ``workbench.run(world_size=W, steps=1)`` in this process, after one discarded warm-up run.
``warm_fresh``         the same with ``spawn="fresh"``: a fresh interpreter per rank on every run.
``torchrun_workers``   the peer: ``python -m torch.distributed.run --nproc-per-node W`` on a minimal worker (gloo
                       init, a DDP-wrapped Linear, one SGD step, a barrier); rank 0 prints ``time.time()`` after it.

``wall_s`` is the wall time of the command or the call (what a user waits). ``first_step_s`` is, for our paths,
the ``time`` column of the first metrics row (seconds since the supervisor started); for torchrun it is from
torchrun's launch to the time rank 0 printed. ``outside_s`` is wall_s less the supervisor's own ``wall_s`` (for the
CLI: interpreter start, imports, saving the result, exit). For the CLI, ``before_supervisor_s`` estimates the part
before the supervisor started (result.h5's mtime less the supervisor's wall_s, less the launch time) and
``first_step_from_launch_s`` = before_supervisor_s + first_step_s is comparable to torchrun's first step.
Ratios use medians of the same run: ``cli_template_vs_fresh`` (fresh / template wall), ``warm_template_vs_fresh``
(likewise, warm), ``template_vs_torchrun`` (torchrun first step / ours warm first step).
``aims`` are issue #13's: ``workbench run --world-size 4 --steps 1`` from the CLI within 1.5 s wall; a second run
in the same process within 0.4 s. ``loadavg`` is ``os.getloadavg()`` before and after (the figures are wall times).

Figures go to stderr per row; the last stdout line is one JSON object: {"benchmark": "startup", "rows": [...], ...}.
Usage: python benchmarks/bench_startup.py [--worlds 2,4,8] [--repeats 3] [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import workbench
from workbench.base.processes import RANK_ENV_DEFAULTS
from workbench.results.run_result import RunResult

PATHS = ("cli_cold_template", "cli_cold_fresh", "warm_template", "warm_fresh", "torchrun_workers")
AIMS = {"cli_world4_wall_s": 1.5, "warm_second_run_wall_s": 0.4}
CLI_TIMEOUT_S = 600.0  # a fresh world of 8 on 2 busy cores can take minutes
TORCHRUN_TIMEOUT_S = 120.0
MARK = "FIRST_STEP_AT"

WORKER = textwrap.dedent(f"""\
    import time

    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    model = torch.nn.Linear(64, 10)
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    loss = ddp(torch.randn(16, 64)).sum()
    loss.backward()
    opt.step()
    dist.barrier()
    if dist.get_rank() == 0:
        print("{MARK}", repr(time.time()), flush=True)
    dist.destroy_process_group()
    """)


def median(values: list[float | None]) -> float | None:
    values = [v for v in values if v is not None]
    return round(statistics.median(values), 4) if values else None


def ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a is not None and b else None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def bounded(argv: list[str], timeout: float, env: dict[str, str] | None = None) -> tuple[int, str, str, float]:
    """Run ``argv`` in a session of its own; return (code, stdout, stderr, wall seconds). Past ``timeout`` its whole
    session is killed and the row fails."""
    started = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        out, err = proc.communicate()
        return -signal.SIGKILL, out, err + f"\nkilled after {timeout:.0f} s", time.perf_counter() - started
    return proc.returncode, out, err, time.perf_counter() - started


def tail(text: str) -> str:
    return " | ".join(text.strip().splitlines()[-3:])


def cli_cold(world: int, spawn: str, tmp: Path) -> dict:
    out = Path(tempfile.mkdtemp(prefix=f"cli-{spawn}-w{world}-", dir=tmp))
    workbench_cli = Path(sys.executable).with_name("workbench")
    argv = [str(workbench_cli), "run", "--world-size", str(world), "--steps", "1", "--json", "--out", str(out)]
    if spawn != "template":
        argv += ["--spawn", spawn]
    launched = time.time()
    code, stdout, stderr, wall = bounded(argv, CLI_TIMEOUT_S)
    if code != 0:
        return {"wall_s": round(wall, 4), "first_step_s": None, "error": f"exit {code}: {tail(stderr or stdout)}"}
    summary = json.loads(stdout.strip().splitlines()[-1])
    result = RunResult.load(out)
    first = result.metrics[0]["time"]
    # the supervisor started ~ when result.h5 was written less its wall_s (saving takes milliseconds)
    before = result.path.stat().st_mtime - summary["wall_s"] - launched
    return {"wall_s": round(wall, 4), "first_step_s": round(first, 4), "outside_s": round(wall - summary["wall_s"], 4),
            "before_supervisor_s": round(before, 4), "first_step_from_launch_s": round(before + first, 4)}


def warm(world: int, spawn: str) -> dict:
    started = time.perf_counter()
    result = workbench.run(world_size=world, steps=1, spawn=spawn)
    wall = time.perf_counter() - started
    if not result.completed or not result.metrics:
        return {"wall_s": round(wall, 4), "first_step_s": None, "error": result.summary["reason"]}
    return {"wall_s": round(wall, 4), "first_step_s": round(result.metrics[0]["time"], 4),
            "outside_s": round(wall - result.summary["wall_s"], 4)}


def torchrun(world: int, script: Path) -> dict:
    env = {**RANK_ENV_DEFAULTS, **os.environ, "OMP_NUM_THREADS": "1"}  # the memory setting our ranks get
    argv = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", str(world),
            "--master-addr", "127.0.0.1", "--master-port", str(free_port()), "--monitor-interval", "0.1",
            str(script)]
    launched = time.time()
    code, stdout, stderr, wall = bounded(argv, TORCHRUN_TIMEOUT_S, env)
    marks = [line.split()[1] for line in stdout.splitlines() if line.startswith(MARK)]
    if code != 0 or not marks:
        return {"wall_s": round(wall, 4), "first_step_s": None, "error": f"exit {code}: {tail(stderr or stdout)}"}
    return {"wall_s": round(wall, 4), "first_step_s": round(float(marks[0]) - launched, 4)}


def measure(path: str, world: int, tmp: Path, script: Path) -> dict:
    if path == "cli_cold_template":
        return cli_cold(world, "template", tmp)
    if path == "cli_cold_fresh":
        return cli_cold(world, "fresh", tmp)
    if path == "warm_template":
        return warm(world, "template")
    if path == "warm_fresh":
        return warm(world, "fresh")
    return torchrun(world, script)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worlds", default="2,4,8", help="comma-separated world sizes")
    parser.add_argument("--repeats", type=int, default=3, help="measured repeats per path and world (median)")
    parser.add_argument("--quick", action="store_true", help="worlds 2 and 4, one repeat")
    args = parser.parse_args()
    worlds = [2, 4] if args.quick else [int(w) for w in args.worlds.split(",")]
    repeats = 1 if args.quick else args.repeats
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    load_before = [round(x, 2) for x in os.getloadavg()]
    began = time.perf_counter()
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-startup-") as tmpdir:
        tmp = Path(tmpdir)
        script = tmp / "torchrun_worker.py"
        script.write_text(WORKER)
        for world in worlds:
            samples: dict[str, list[dict]] = {p: [] for p in PATHS}
            for spawn in ("template", "fresh"):  # the discarded first run of each warm path
                first = warm(world, spawn)
                print(f"world {world:>2}  warm_{spawn:<8} warm-up  wall {first['wall_s']:7.3f} s  (discarded)",
                      file=sys.stderr, flush=True)
            for repeat in range(repeats):
                for path in PATHS:
                    sample = measure(path, world, tmp, script)
                    samples[path].append(sample)
                    fs = sample["first_step_s"]
                    print(f"world {world:>2}  {path:<18} #{repeat + 1}  wall {sample['wall_s']:7.3f} s  first step "
                          + ("   -   " if fs is None else f"{fs:7.3f}") + " s"
                          + (f"  ({sample['first_step_from_launch_s']:.3f} s from launch)"
                             if "first_step_from_launch_s" in sample else "")
                          + (f"  ERROR {sample['error']}" if "error" in sample else ""), file=sys.stderr, flush=True)
            row: dict = {"world_size": world, "repeats": repeats}
            for path in PATHS:
                got = samples[path]
                row[path] = {"wall_s": median([s["wall_s"] for s in got]),
                             "first_step_s": median([s["first_step_s"] for s in got]),
                             "wall_samples": [s["wall_s"] for s in got],
                             "first_step_samples": [s["first_step_s"] for s in got]}
                extra = ("outside_s", "before_supervisor_s", "first_step_from_launch_s") if path.startswith("cli") \
                    else ("outside_s",) if path.startswith("warm") else ()
                for key in extra:
                    row[path][key] = median([s.get(key) for s in got])
                errors = [s["error"] for s in got if "error" in s]
                if errors:
                    row[path]["errors"] = errors
            row["cli_template_vs_fresh"] = ratio(row["cli_cold_fresh"]["wall_s"], row["cli_cold_template"]["wall_s"])
            row["warm_template_vs_fresh"] = ratio(row["warm_fresh"]["wall_s"], row["warm_template"]["wall_s"])
            row["template_vs_torchrun"] = ratio(row["torchrun_workers"]["first_step_s"],
                                                row["warm_template"]["first_step_s"])
            print(f"world {world:>2}  median wall / first step (s): "
                  + "  ".join(f"{p} {row[p]['wall_s']}/{row[p]['first_step_s']}" for p in PATHS)
                  + f"  ratios: cli fresh/template {row['cli_template_vs_fresh']}, warm fresh/template "
                    f"{row['warm_template_vs_fresh']}, torchrun/template first step {row['template_vs_torchrun']}",
                  file=sys.stderr, flush=True)
            rows.append(row)
    by_world = {r["world_size"]: r for r in rows}
    cli4 = by_world.get(4, {}).get("cli_cold_template", {}).get("wall_s")
    warm4 = by_world.get(4, {}).get("warm_template", {}).get("wall_s")
    aims = {
        "cli_world4_wall_s": {"aim": AIMS["cli_world4_wall_s"], "measured": cli4,
                              "met": None if cli4 is None else cli4 <= AIMS["cli_world4_wall_s"]},
        "warm_second_run_wall_s": {"aim": AIMS["warm_second_run_wall_s"], "measured": warm4,
                                   "met": None if warm4 is None else warm4 <= AIMS["warm_second_run_wall_s"]},
    }
    print(json.dumps({
        "benchmark": "startup", "worlds": worlds, "repeats": repeats, "cores": os.cpu_count(),
        "loadavg": {"before": load_before, "after": [round(x, 2) for x in os.getloadavg()]},
        "elapsed_s": round(time.perf_counter() - began, 1), "aims": aims, "rows": rows,
    }))


if __name__ == "__main__":
    main()
