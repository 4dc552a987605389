"""The speed gate: the headline figures, each against a reference measured in the same run, each within a budget.

Run by ``make bench-gate`` (and so by ``.ci/run``). Each figure is one :class:`Figure`: what it measures, its
reference, the ratio's budget and which way it must hold. The gate prints one JSON line per figure (value,
reference, ratio, budget, verdict), appends them with the date, commit and machine to
``benchmarks/results/gate_history.jsonl``, rewrites docs/benchmarks.md's table of the newest run of each figure
("The speed gate"; ``--table`` alone does only that): the docs' figures come from the gate, never by hand; and
exits 1 when any figure misses its budget (2 for bad arguments). Budgets and their recorded values: docs/benchmarks.md.
Usage: python benchmarks/gate.py [--only NAME,...] [--no-history] [--table]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HISTORY = ROOT / "benchmarks" / "results" / "gate_history.jsonl"
DOCS = ROOT / "docs" / "benchmarks.md"
BEGIN, END = "<!-- gate-table:begin (benchmarks/gate.py --table) -->", "<!-- gate-table:end -->"
LARGE = {"hidden": [4096, 4608], "bucket_cap_mb": 25.0}  # the 19.2M-parameter MLP of bench_recovery.py
FORKS = 20  # forks timed for the fork floor (median)
CHILD_TIMEOUT_S = 300.0


@dataclass(frozen=True)
class Measured:
    value: float
    reference: float | None  # None: the value is judged alone (a count that must be 0, a ratio measured within)
    detail: dict
    failed: str | None = None  # a condition of the figure that did not hold (a regrow that never joined, ...)


@dataclass(frozen=True)
class Figure:
    name: str
    what: str  # the value, and its unit
    reference: str  # what the value is divided by, measured in the same run
    budget: float  # on the ratio (or on the value where there is no reference)
    at_most: bool  # True: ratio <= budget passes; False: ratio >= budget
    recorded: str  # the ratio recorded when the budget was set (docs/benchmarks.md)
    measure: Callable[[], Measured]
    aim: float | None = None  # a tighter aim than the noise allows a budget to be: reported (aim_met), not gated

    def judge(self, got: Measured) -> dict:
        ratio = got.value / got.reference if got.reference else got.value
        within = ratio <= self.budget if self.at_most else ratio >= self.budget
        verdict = "pass" if within and got.failed is None else "miss"
        return {"figure": self.name, "what": self.what, "value": round(got.value, 6),
                "reference_what": self.reference, "reference": None if got.reference is None else
                round(got.reference, 6), "ratio": round(ratio, 4), "budget": ("<= " if self.at_most else ">= ")
                + f"{self.budget:g}", "verdict": verdict, **({"failed": got.failed} if got.failed else {}),
                **({} if self.aim is None else {"aim": self.aim, "aim_met": ratio <= self.aim if self.at_most
                                                 else ratio >= self.aim}),
                "detail": got.detail}


# -- references ---------------------------------------------------------------------------------------------
def wall(argv: list[str], timeout: float = CHILD_TIMEOUT_S) -> float:
    """Wall seconds of a command that must succeed (its session killed past ``timeout``)."""
    started = time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, start_new_session=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv[:4])}...: exit {proc.returncode}: {proc.stderr.strip()[-300:]}")
    return time.perf_counter() - started


_import_torch: list[float] = []  # measured once per gate run, the reference of every figure that starts ranks


def import_torch_s() -> float:
    """A fresh interpreter's ``import torch`` (median of 3): what every process that is not forked pays first. It
    takes CPU as a rank start does, so a loaded machine stretches both alike."""
    if not _import_torch:
        _import_torch.append(statistics.median(wall([sys.executable, "-c", "import torch"]) for _ in range(3)))
    return _import_torch[0]


FORK_FLOOR = f"""\
import os, statistics, time
import torch  # the rank template's state: a process that imported torch
times = []
for _ in range({FORKS}):
    r, w = os.pipe()
    started = time.perf_counter()
    pid = os.fork()
    if pid == 0:
        os.write(w, b"x")
        os._exit(0)
    os.read(r, 1)
    times.append(time.perf_counter() - started)
    os.waitpid(pid, 0)
    os.close(r); os.close(w)
print(statistics.median(times))
"""


_fork_floor: list[float] = []


def fork_floor_s() -> float:
    """One forked rank's start at its floor: a process that imported torch forks, and the child says so. Reported
    beside the replacement and restart figures, not their reference: a fork is a few ms that a loaded machine moves
    by 3x while the figures move with the CPU they take (ratios 41-143 over three loaded runs)."""
    if not _fork_floor:  # once per gate run: reported beside two figures
        out = subprocess.run([sys.executable, "-c", FORK_FLOOR], capture_output=True, text=True, timeout=120,
                             check=True)
        _fork_floor.append(float(out.stdout.strip()))
    return _fork_floor[0]


# -- the figures -----------------------------------------------------------------------------------------------
def second_run() -> Measured:
    import workbench

    first = time.perf_counter()
    workbench.run(world_size=4, steps=1)  # starts this process's rank template
    first = time.perf_counter() - first
    walls = []
    for _ in range(3):
        started = time.perf_counter()
        result = workbench.run(world_size=4, steps=1)
        walls.append(time.perf_counter() - started)
    failed = None if result.completed else f"the run failed: {result.summary['reason']}"
    return Measured(statistics.median(walls), import_torch_s(),
                    {"first_run_s": round(first, 3), "second_runs_s": [round(w, 3) for w in walls]}, failed)


def cli_run() -> Measured:
    exe = str(Path(sys.executable).with_name("workbench"))
    template, fresh = [], []
    with tempfile.TemporaryDirectory(prefix="gate-cli-") as tmp:
        for i in range(3):  # interleaved: machine noise hits both
            for spawn, into in (("template", template), ("fresh", fresh)):
                argv = [exe, "run", "--world-size", "4", "--steps", "1", "--json", "--out", f"{tmp}/{spawn}{i}"]
                into.append(wall(argv + (["--spawn", "fresh"] if spawn == "fresh" else [])))
    return Measured(statistics.median(template), statistics.median(fresh),
                    {"template_s": [round(w, 3) for w in template], "fresh_s": [round(w, 3) for w in fresh]})


def regrow_join() -> Measured:
    import workbench

    floor = fork_floor_s()
    result = workbench.run(world_size=4, steps=240, strategy="shrink", regrow=True, warm_spares=0,
                           faults=[f"kill:rank=1,step={s}" for s in (60, 120, 180)])
    joins = [f["regrow_s"] for f in result.failures]
    final = result.summary["world_size_final"]
    failed = None
    if not result.completed or len(joins) != 3 or None in joins or final != 4:
        failed = (f"{result.outcome}: {sum(j is not None for j in joins)} of 3 replacements joined, world "
                  f"{final} at the end")
    return Measured(max((j for j in joins if j is not None), default=float("inf")), import_torch_s(),
                    {"regrow_s": joins, "world_size_final": final, "fork_floor_s": round(floor, 5)}, failed)


def restart_resume() -> Measured:
    import workbench

    floor = fork_floor_s()
    result = workbench.run(world_size=4, steps=120, strategy="checkpoint_restart", checkpoint_every=20,
                           faults=["kill:rank=2,step=70"])
    resumes = [f["resume_s"] for f in result.failures]
    failed = None if result.completed and resumes and None not in resumes else \
        f"{result.outcome}: resumes {resumes}"
    return Measured(max((r for r in resumes if r is not None), default=float("inf")), import_torch_s(),
                    {"resume_s": resumes, "fork_floor_s": round(floor, 5)}, failed)


_shrink_run: list = []  # the 19.2M shrink run, shared by its two figures


def _shrink_19m():  # noqa: ANN202 - a RunResult
    import workbench

    if not _shrink_run:
        _shrink_run.append(workbench.run(world_size=4, steps=14, strategy="shrink", eval_interval=14,
                                         faults=["kill:rank=3,step=7"], **LARGE))
    return _shrink_run[0]


def shrink_settle() -> Measured:
    result = _shrink_19m()
    settle = [f["settle_s"] for f in result.failures]
    step = statistics.median(r["step_time"] for r in result.metrics)
    failed = None if result.completed and len(settle) == 1 and settle[0] is not None else \
        f"{result.outcome}: settles {settle}"
    return Measured(settle[0] if settle and settle[0] is not None else float("inf"), step,
                    {"settle_s": settle, "median_step_s": round(step, 4)}, failed)


def shrink_bytes() -> Measured:
    result = _shrink_19m()
    moved = sum(f.get("bytes_moved", 0) for f in result.failures)
    failed = None if result.completed and len(result.failures) == 1 else f"{result.outcome}"
    return Measured(float(moved), None, {"failures": len(result.failures)}, failed)


def checkpoint_stall() -> Measured:
    from bench_recovery import measure_stall

    row = measure_stall("large", 2, saves=3)
    failed = None if row["outcome"] == "completed" and row["saves"] == 3 else f"{row['outcome']}, {row['saves']} saves"
    return Measured(row["stall_ms"] or 0.0, row["step_ms"], row, failed)


def ddp_step() -> Measured:
    from bench_overhead import ddp_step_times, workbench_step_times

    from workbench.config.run import RunConfig

    config = RunConfig(world_size=2, steps=150, model="lenet5", dataset="synthetic_image", batch_size=128,
                       eval_interval=150)
    ddp, ours = [], []
    for _ in range(2):  # alternated: machine noise hits both
        ddp += ddp_step_times(config)
        ours += workbench_step_times(config)
    return Measured(statistics.median(ours), statistics.median(ddp),
                    {"model": "lenet5", "steps_timed": len(ours), "world_size": 2})


def flips() -> Measured:
    from bench_bitflip import make_checkpoint, our_flips, peer_flips

    with tempfile.TemporaryDirectory(prefix="gate-flips-") as tmp:
        path = Path(tmp) / "ckpt.h5"
        make_checkpoint(path, 12)
        peer = peer_flips(path, 3000, seed=1)
        ours = statistics.median(our_flips(path, 200_000, seed=s) for s in range(3))
    return Measured(ours, peer, {"ours_flips_per_s": round(ours), "peer_flips_per_s": round(peer)})


def sweep() -> Measured:
    from bench_sweep import adopt_orphans, papermill_loop, reap_orphans, workbench_sweep

    grid = {"strategy": ["shrink", "rollback"], "seed": [0, 1]}
    fixed = {"world_size": 2, "steps": 60, "fault": "kill:rank=1,step=30"}
    adopt_orphans()
    work = Path(tempfile.mkdtemp(prefix="gate-sweep-"))
    try:
        loop = papermill_loop(work / "loop", fixed, grid)
        reap_orphans()
        ours = workbench_sweep(work / "sweep", fixed, None, grid)
        reap_orphans()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return Measured(ours, loop, {"points": 4, **fixed})


def scale_des() -> Measured:
    from workbench.strategies import scale
    from workbench.strategies.scale.simulate import SPEED_POINT

    walls = []
    for _ in range(3):
        started = time.perf_counter()
        result = scale.predict(**SPEED_POINT)
        walls.append(time.perf_counter() - started)
    failed = None if result.method == "simulation" and result.failures > 1000 else \
        f"{result.method}, {result.failures} failures"
    return Measured(statistics.median(walls), None, {"walls_s": [round(w, 3) for w in walls],
                                                     "failures": result.failures,
                                                     "effective": round(result.effective, 4)}, failed)


FIGURES = (  # budgets about 3x the recorded ratio, or the aim where that is tighter and noise allows
    Figure("second_run", "a second workbench.run(world_size=4, steps=1) in one process, wall s",
           "a fresh interpreter's import torch, wall s", 0.35, True, "0.11", second_run),
    Figure("cli_run", "workbench run --world-size 4 --steps 1, wall s", "the same with --spawn fresh, wall s",
           0.65, True, "0.53-0.61", cli_run, aim=0.6),
    Figure("regrow_join", "the slowest of 3 fresh replacements' joins (regrow, no warm spare; digits, world 4), wall s",
           "a fresh interpreter's import torch, wall s", 0.6, True, "0.18", regrow_join),
    Figure("restart_resume", "a checkpoint_restart resume (digits, world 4, one kill), wall s",
           "a fresh interpreter's import torch, wall s", 0.6, True, "0.21", restart_resume),
    Figure("shrink_settle_19m", "shrink's settle at 19.2M parameters (world 4), wall s",
           "the same run's median step, wall s", 0.36, True, "0.12", shrink_settle),
    Figure("shrink_bytes_19m", "bytes moved by shrink's recovery at 19.2M parameters", "none: must be 0",
           0, True, "0", shrink_bytes),
    Figure("checkpoint_stall_19m", "the checkpoint stall per save at 19.2M (every 10 steps, world 2), wall ms",
           "the same run's median step, wall ms", 0.01, True, "0.0025", checkpoint_stall, aim=0.05),
    Figure("ddp_step", "the workbench's failure-free step (lenet5, world 2), wall s",
           "plain torch DDP's, same model, wall s",
           1.25, True, "1.13", ddp_step, aim=1.05),
    Figure("flips", "bit flips into an HDF5 checkpoint, flips/s", "the per-value method (h5py + struct), flips/s",
           200, False, "697", flips, aim=100),
    Figure("sweep", "workbench sweep of 4 points (permanent_faults.ipynb), wall s",
           "a papermill CLI loop over them, wall s",
           0.75, True, "0.58", sweep, aim=0.6),
    Figure("scale_des_100k", "one simulated point of the scale model: 100,000 ranks over a 30-day job, wall s",
           "none: at most 10 s on one core", 10, True, "0.03", scale_des),
)


# -- the run, its history, the docs' table -------------------------------------------------------------------
def machine() -> dict:
    model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                  if line.startswith("model name")), platform.processor()) if Path("/proc/cpuinfo").exists() else ""
    return {"host": platform.node(), "cpu": model, "cores": os.cpu_count(), "python": platform.python_version()}


def commit() -> str:
    try:
        out = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True, timeout=10)
        dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
        return out.stdout.strip() + ("+changes" if dirty else "") if out.returncode == 0 else "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def run_gate(figures: list[Figure], history: Path | None) -> int:
    stamp = {"date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), "commit": commit(),
             "machine": machine()}
    began, misses, rows = time.perf_counter(), 0, []
    for figure in figures:
        load = round(os.getloadavg()[0], 2)
        started = time.perf_counter()
        try:
            row = figure.judge(figure.measure())
        except Exception as exc:  # noqa: BLE001 - a figure that cannot be measured misses, with its reason
            row = {"figure": figure.name, "what": figure.what, "value": None, "reference": None, "ratio": None,
                   "budget": ("<= " if figure.at_most else ">= ") + f"{figure.budget:g}", "verdict": "miss",
                   "failed": f"{type(exc).__name__}: {exc}"}
        row.update(recorded=figure.recorded, seconds=round(time.perf_counter() - started, 1), load_1min=load)
        misses += row["verdict"] == "miss"
        rows.append(row)
        print(json.dumps(row), flush=True)
    total = round(time.perf_counter() - began, 1)
    print(f"gate: {len(rows) - misses} of {len(rows)} figures within budget in {total} s "
          f"({stamp['commit']}, {stamp['machine']['cores']} cores)", file=sys.stderr)
    if history is not None:
        history.parent.mkdir(parents=True, exist_ok=True)
        with history.open("a") as f:
            for row in rows:
                f.write(json.dumps({**stamp, **row}) + "\n")
        if history == HISTORY:  # the docs' table follows the history it is generated from
            write_table(history)
    return 1 if misses else 0


def table(history: Path) -> str:
    """The newest recorded run of each figure, as the docs' markdown table; a history that cannot be read (missing,
    a directory, a line that is no gate record) ends the gate with one line, exit 2."""
    newest: dict[str, dict] = {}
    try:
        lines = history.read_text().splitlines()
    except OSError as exc:
        _refuse(f"gate: --history {history}: cannot be read ({exc.strerror}): give the JSON-lines file the gate "
                "appends to (benchmarks/results/gate_history.jsonl)")
    for number, line in enumerate(lines, start=1):
        if line.strip():
            try:
                row = json.loads(line)
                newest[row["figure"]] = row
            except (ValueError, KeyError, TypeError):
                _refuse(f"gate: --history {history}: line {number} is not a gate record")
    lines = ["| figure | value | reference | ratio | budget | verdict | date, commit, machine (load) |",
             "|---|---|---|---|---|---|---|"]
    for figure in FIGURES:
        row = newest.get(figure.name)
        if row is None:
            continue
        m = row["machine"]
        lines.append(f"| `{figure.name}`: {figure.what} | {_num(row['value'])} | {figure.reference}: "
                     f"{_num(row['reference'])} | {_num(row['ratio'])} | {row['budget']} | {row['verdict']} | "
                     f"{row['date']}, `{row['commit']}`, {m['cores']} cores, {m['cpu']} ({row['load_1min']}) |")
    return "\n".join(lines)


def _refuse(line: str) -> None:
    """Bad input: one line on stderr, exit 2."""
    print(line, file=sys.stderr)
    raise SystemExit(2)


def _num(value: float | None) -> str:
    return "–" if value is None else f"{value:.4g}"


def write_table(history: Path, docs: Path = DOCS) -> None:
    text = docs.read_text()
    head, begin, rest = text.partition(BEGIN)
    _, end, tail = rest.partition(END)
    if not begin or not end:
        raise SystemExit(f"gate: {docs} has no {BEGIN} ... {END} block to write the table into")
    docs.write_text(f"{head}{BEGIN}\n{table(history)}\n{END}{tail}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="comma-separated figure names: " +
                        ", ".join(f.name for f in FIGURES))
    parser.add_argument("--history", type=Path, default=HISTORY, help="the history file appended to")
    parser.add_argument("--no-history", action="store_true", help="append nothing (a trial, a planted regression)")
    parser.add_argument("--table", action="store_true", help="write the history's table into docs/benchmarks.md "
                        "and measure nothing")
    args = parser.parse_args()
    if args.table:
        write_table(args.history)
        return
    names = [n for n in args.only.split(",") if n]
    unknown = sorted(set(names) - {f.name for f in FIGURES})
    if unknown:
        parser.exit(2, f"gate: --only: unknown figure {', '.join(unknown)}: allowed "
                       f"{', '.join(f.name for f in FIGURES)}\n")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    chosen = [f for f in FIGURES if not names or f.name in names]
    sys.exit(run_gate(chosen, None if args.no_history else args.history))


if __name__ == "__main__":
    main()
