"""Is the rank-time clock right? The same runs at world 4 pinned to 1 and to 2 cores (and 4 where the machine has
them), with a CPU hog beside them or not, per strategy (shrink, rollback, forward, reinit, checkpoint_restart; 3
kills), wall and rank-time side by side; world 2 on 2 cores (a core per rank); 10 back-to-back copies of one
failure-free run at world 4 with each clock's spread (max / min of train_s).

Aims (issue #29): 1 vs 2 cores, rank-time step time and overhead per strategy within 15 % while wall differs by
>= 1.5x; a hog moves rank-time <= 10 %; a core per rank: rank-time and wall step time within 15 %; 10 copies:
rank-time spread <= 1.10. Each aim's verdict is ``met``, ``missed`` or ``inconclusive`` where this host cannot test
it, measured in the same run: 1 vs 2 cores needs the wall clock >= 1.5x apart; a core per rank needs idle cores that
wake in microseconds (a blocking round trip between two pinned processes); the copies on the plain rank clock need
a host whose own speed holds (the speed probe on one core, read between the settings). With --speed-probe each run
is repeated at once with ``speed_probe`` on (the rank clock at the machine's reference speed) and every figure is
given for it too (``probe_*``). Prints one JSON line (and a table on stderr).
Usage: python benchmarks/bench_clock.py [--steps 300] [--copies 10] [--quick] [--speed-probe]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STRATEGIES = ("shrink", "rollback", "forward", "reinit", "checkpoint_restart")
KILLS = ("kill:rank=1,step={a}", "kill:rank=2,step={b}", "kill:rank=3,step={c}")


WALL_APART = 1.5  # 1 vs 2 cores: the wall clock must differ this much for the check to mean anything (issue #29)
# a core per rank: the median blocking round trip between two idle pinned cores must be within this. Each of a
# step's messages whose receiver went idle pays a wake-up on the wall clock (half a trip); rank-time charges one
# measured hop. Under 50 us, a world-2 step's 4 messages lose < 3 % of its 4 ms; waking an idle vCPU through a
# hypervisor took 85-490 us a round trip on the development VM (docs/concepts.md, "Two clocks")
WAKE_LIMIT_US = 50.0
HOST_DRIFT_LIMIT = 1.05  # the copies: the host's own speed (fixed work on one core) must hold within 5 %

_PINGPONG = """
import os, sys, time
cores, rounds = [int(c) for c in sys.argv[1].split(",")], int(sys.argv[2])
a_read, b_write = os.pipe()
b_read, a_write = os.pipe()
if os.fork() == 0:
    os.sched_setaffinity(0, {cores[1]})
    for _ in range(rounds + 100):
        os.read(b_read, 1)
        os.write(b_write, b"x")
    os._exit(0)
os.sched_setaffinity(0, {cores[0]})
trips = []
for _ in range(rounds + 100):
    began = time.perf_counter()
    os.write(a_write, b"x")
    os.read(a_read, 1)
    trips.append(time.perf_counter() - began)
os.wait()
trips = sorted(trips[100:])
print(trips[len(trips) // 2] * 1e6, trips[9 * len(trips) // 10] * 1e6)
"""


def wake_us(cores: tuple[int, int], rounds: int = 2000) -> list[float]:
    """Median and 90th percentile round trip (us) of one byte between two processes blocked on pipes, pinned to
    ``cores`` (the same core twice: a context switch, no idle core to wake)."""
    done = subprocess.run([sys.executable, "-c", _PINGPONG, f"{cores[0]},{cores[1]}", str(rounds)],
                          capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    return [round(float(v), 1) for v in done.stdout.split()]


def host_speed_us(core: int) -> float:
    """The speed probe's fixed work on one core, now (us; :func:`workbench.base.machine.measure_probe`)."""
    from workbench.base import machine

    return machine.measure_probe(core, rounds=200)


def runs_for(steps: int, strategies: tuple[str, ...]) -> list[dict]:
    kills = [k.format(a=steps // 4, b=steps // 2, c=3 * steps // 4) for k in KILLS]
    base = {"world_size": 4, "steps": steps, "seed": 0, "eval_interval": steps}
    out = [{**base, "label": "none"}]
    for strategy in strategies:
        every = 25 if strategy in ("reinit", "checkpoint_restart") else None
        out.append({**base, "label": strategy, "strategy": strategy, "faults": kills, "checkpoint_every": every})
    return out


def child(runs: list[dict], probe: bool) -> list[dict]:
    """Run each configuration in this process (one rank template for all) and return its figures; ``probe``: each
    again at once with the speed probe on, its rank-time figures as ``probe_*``."""
    sys.path.insert(0, str(ROOT))
    import workbench

    warm = {k: v for k, v in runs[0].items() if k not in ("label", "faults", "strategy", "checkpoint_every")}
    workbench.run({**warm, "steps": min(warm["steps"], 60)})  # discarded: the first run of a process pays its cold
    figures, baseline = [], {}  # start (template, page faults, lazily loaded kernels) in its steps
    for spec in runs:
        spec = dict(spec)
        label = spec.pop("label")
        figure: dict = {"label": label}
        for probed in (False, True) if probe else (False,):
            result = workbench.run({**spec, "speed_probe": probed})
            if label == "none":
                baseline[probed] = result
            elif probed in baseline:
                result.set_baseline(baseline[probed])
            s, rows = result.summary, result.metrics
            if probed:
                figure.update(probe_outcome=result.outcome, probe_train_s=s["rank_train_s"],
                              probe_overhead_pct=s.get("rank_overhead_pct"),
                              probe_step_s=statistics.median(r["rank_step_time"] for r in rows))
                continue
            figure.update(outcome=result.outcome, train_s=s["train_s"], rank_train_s=s["rank_train_s"],
                          overhead_pct=s.get("overhead_pct"), rank_overhead_pct=s.get("rank_overhead_pct"),
                          step_s=statistics.median(r["step_time"] for r in rows),
                          rank_step_s=statistics.median(r["rank_step_time"] for r in rows),
                          steal_pct=result.provenance.get("steal_pct"), cores=s["cores"])
        figures.append(figure)
    return figures


def hog(cores: set[int]) -> subprocess.Popen:
    """A process that spins on ``cores`` (one thread of Python busy-looping) until killed."""
    return subprocess.Popen([sys.executable, "-c", "while True: pass"],
                            preexec_fn=lambda: os.sched_setaffinity(0, cores))


def measure(runs: list[dict], cores: set[int], with_hog: bool, probe: bool) -> list[dict]:
    hogging = hog(cores) if with_hog else None
    try:
        done = subprocess.run([sys.executable, __file__, "--child", json.dumps(runs), str(int(probe))],
                              capture_output=True, text=True, timeout=1800,
                              preexec_fn=lambda: os.sched_setaffinity(0, cores))
    finally:
        if hogging is not None:
            hogging.kill()
            hogging.wait()
    if done.returncode:
        raise SystemExit(f"bench_clock: a child run failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def aims(table: dict, per_rank: list[dict], repeated: list[dict], labels: list[str], clock: str) -> dict:
    """The aims' figures on ``clock``: ``rank`` (rank-time) or ``probe`` (rank-time at the reference speed), each
    beside the wall clock's."""
    one, two = table["1 core"], table["2 cores"]
    step, train, over = f"{clock}_step_s", f"{clock}_train_s", f"{clock}_overhead_pct"
    per = {"wall_step_s": statistics.median(f["step_s"] for f in per_rank),
           "rank_step_s": statistics.median(f[step] for f in per_rank),
           "wall_train_s": statistics.median(f["train_s"] for f in per_rank),
           "rank_train_s": statistics.median(f[train] for f in per_rank)}
    return {
        "one_vs_two": {k: {"wall_step_x": ratio(one[k]["step_s"], two[k]["step_s"]),
                           "rank_step_x": ratio(one[k][step], two[k][step]),
                           "wall_train_x": ratio(one[k]["train_s"], two[k]["train_s"]),
                           "rank_train_x": ratio(one[k][train], two[k][train]),
                           "rank_overhead_pt": [one[k][over], two[k][over]],
                           "wall_overhead_pt": [one[k]["overhead_pct"], two[k]["overhead_pct"]]} for k in labels},
        "hog": {setting: {k: {"rank_train_x": ratio(table[setting][k][train], table[f"{setting} + hog"][k][train]),
                              "wall_train_x": ratio(table[setting][k]["train_s"],
                                                    table[f"{setting} + hog"][k]["train_s"])} for k in labels}
                for setting in table if not setting.endswith("hog")},
        "core_per_rank": {**per, "agree_x": ratio(per["wall_step_s"], per["rank_step_s"])},
        "copies": {"n": len(repeated), "wall_spread": ratio(min(f["train_s"] for f in repeated),
                                                            max(f["train_s"] for f in repeated)),
                   "rank_spread": ratio(min(f[train] for f in repeated), max(f[train] for f in repeated))},
    }


def verdicts(figures: dict, host: dict, clock: str) -> dict:
    """Each aim on ``clock`` (``rank`` or ``probe``): ``met``, ``missed``, or ``inconclusive: why`` where this run's
    host could not test it (its own measurements: the wall clock, the idle cores' wake-up, the host's speed)."""
    def judge(ok: bool, testable: bool, why: str) -> str:
        return ("met" if ok else "missed") if testable else f"inconclusive: {why}"

    out: dict = {"one_vs_two": {}, "hog": {}}
    for k, f in figures["one_vs_two"].items():
        points = [p for p in f["rank_overhead_pt"] if p is not None]
        # overheads: within 15 points, or 15 % of the larger where that is more (a restart's 400 %)
        agree = f["rank_step_x"] <= 1.15 and (len(points) < 2 or abs(points[0] - points[1]) <= max(
            15.0, 0.15 * max(abs(points[0]), abs(points[1]))))
        out["one_vs_two"][k] = judge(agree, f["wall_step_x"] >= WALL_APART,
                                     f"the wall step differs only {f['wall_step_x']}x")
    for setting, by_label in figures["hog"].items():
        for k, f in by_label.items():
            out["hog"][f"{setting}/{k}"] = judge(f["rank_train_x"] <= 1.10, f["wall_train_x"] >= 1.10,
                                                 f"the hog moved the wall clock only {f['wall_train_x']}x")
    wake = host["wake_two_cores_us"][0]
    out["core_per_rank"] = judge(figures["core_per_rank"]["agree_x"] <= 1.15, wake <= WAKE_LIMIT_US,
                                 f"an idle core wakes in {wake} us (round trip), over {WAKE_LIMIT_US}")
    drift = host["speed_spread"]
    out["copies"] = judge(figures["copies"]["rank_spread"] <= 1.10, clock == "probe" or drift <= HOST_DRIFT_LIMIT,
                          f"the host's own speed moved {drift}x during the run")
    every = [*out["one_vs_two"].values(), *out["hog"].values(), out["core_per_rank"], out["copies"]]
    out["count"] = {v: sum(1 for x in every if x.split(":")[0] == v) for v in ("met", "missed", "inconclusive")}
    return out


def ratio(a: float, b: float) -> float:
    return round(max(a, b) / min(a, b), 3) if min(a, b) > 0 else float("inf")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--copies", type=int, default=10)
    parser.add_argument("--quick", action="store_true", help="shrink and checkpoint_restart only, 3 copies")
    parser.add_argument("--speed-probe", action="store_true", help="each run again with the speed probe on")
    args = parser.parse_args()
    strategies = ("shrink", "checkpoint_restart") if args.quick else STRATEGIES
    copies = 3 if args.quick else args.copies
    available = sorted(os.sched_getaffinity(0))
    if len(available) < 2:
        raise SystemExit("bench_clock: needs at least 2 cores")
    settings = {"1 core": {available[0]}, "2 cores": set(available[:2])}
    if len(available) >= 4:
        settings["4 cores"] = set(available[:4])
    sys.path.insert(0, str(ROOT))
    from workbench.base import machine

    latency = machine.latency_us()  # measured now, on two cores, if this machine has not measured it yet
    probe = machine.probe_us() if args.speed_probe else None  # the same, on one core
    load = os.getloadavg()[0]
    t0 = time.time()
    speeds = [host_speed_us(available[0])]  # the host's own speed, read between the settings
    host = {"wake_two_cores_us": wake_us((available[0], available[1])),
            "wake_one_core_us": wake_us((available[0], available[0]))}
    table: dict[str, dict[str, dict]] = {}
    for name, cores in settings.items():
        for with_hog in (False, True):
            key = f"{name}{' + hog' if with_hog else ''}"
            runs = runs_for(args.steps, strategies)
            table[key] = {f["label"]: f for f in measure(runs, cores, with_hog, args.speed_probe)}
            speeds.append(host_speed_us(available[0]))
            print(f"{key}: done at {time.time() - t0:.0f} s", file=sys.stderr, flush=True)
    pair = [{**r, "label": "copy"} for r in runs_for(args.steps, ())] * copies
    repeated = measure(pair, set(available[:2]), False, args.speed_probe)
    speeds.append(host_speed_us(available[0]))
    per_rank = measure([{"world_size": 2, "steps": args.steps, "seed": 0, "label": "none"}] * 3,
                       set(available[:2]), False, args.speed_probe)
    host.update(speed_us=[round(v, 1) for v in speeds], speed_spread=ratio(min(speeds), max(speeds)))

    labels = ["none", *strategies]
    figures = aims(table, per_rank, repeated, labels, "rank")
    probed = aims(table, per_rank, repeated, labels, "probe") if args.speed_probe else None
    report = {"bench": "clock", "steps": args.steps, "cores": len(available), "load_1min": round(load, 2),
              "latency_us": latency[0], "probe_us": probe[0] if probe else None, "host": host,
              **figures, "verdicts": verdicts(figures, host, "rank"),
              "probe": {**probed, "verdicts": verdicts(probed, host, "probe")} if probed else None,
              "runs": table, "steal_pct_max": max((f["steal_pct"] or 0.0) for s in table.values() for f in s.values()),
              "wall_s": round(time.time() - t0, 1)}
    for key, rows in table.items():
        print(key, file=sys.stderr)
        for label, f in rows.items():
            print(f"  {label:20s} step {f['step_s'] * 1e3:7.2f} / {f['rank_step_s'] * 1e3:7.2f} ms   train "
                  f"{f['train_s']:7.3f} / {f['rank_train_s']:7.3f} s   overhead {f['overhead_pct']} / "
                  f"{f['rank_overhead_pct']} %  (wall / rank)"
                  + (f"   probe: step {f['probe_step_s'] * 1e3:7.2f} ms train {f['probe_train_s']:7.3f} s overhead "
                     f"{f['probe_overhead_pct']} %" if "probe_step_s" in f else ""), file=sys.stderr)
    for clock, judged in (("rank-time", report["verdicts"]), ("the probe", (report["probe"] or {}).get("verdicts"))):
        if judged:
            print(f"aims on {clock}: {judged['count']}; core per rank {judged['core_per_rank']}; copies "
                  f"{judged['copies']}", file=sys.stderr)
    print(json.dumps(report))


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--child":
        print(json.dumps(child(json.loads(sys.argv[2]), sys.argv[3] == "1")))
    else:
        main()
