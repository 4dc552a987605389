"""Device check for the rank-time clock (issue #29): the same runs with a core per rank and pinned to 2 / 1 cores,
raw figures to $OUT for offline comparison. Run: python tools/device/clock_check.py OUTDIR."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def child(spec: dict) -> dict:
    sys.path.insert(0, ROOT)
    import workbench
    from workbench.supervisor import recorder as rec

    original = rec.Recorder.result

    def result(self, *a, **k):
        r = original(self, *a, **k)
        r.summary["_spent"] = [[g, s, list(v.values())] for (g, s), v in self.rank_time.spent.items()]
        r.summary["_gens"] = {g: vars(x) for g, x in self.rank_time.gens.items()}
        r.summary["_ready"] = {k: v for k, v in self.rank_time.ready.items()}
        return r

    rec.Recorder.result = result
    out = []
    for run in spec["runs"]:
        base = workbench.run(dict(run, faults=[], strategy="none", regrow=False, checkpoint_every=None))
        faulty = workbench.run(run) if run.get("faults") else None
        rows = []
        for r in (base, faulty):
            if r is None:
                continue
            if r is faulty:
                r.set_baseline(base)
            m = r.metrics
            rows.append({"summary": {k: v for k, v in r.summary.items() if k != "failures"}, "failures": r.failures,
                         "cols": {c: [x.get(c) for x in m] for c in ("step", "time", "step_time", "rank_step_time",
                                                                     "messages", "world_size", "generation")},
                         "prov": r.provenance})
        out.append({"run": run, "results": rows})
    return out


def main() -> None:
    where = sys.argv[1]
    os.makedirs(where, exist_ok=True)
    ncores = os.cpu_count() or 1
    demo = [dict(world_size=4, steps=300, seed=seed, strategy=s, regrow=g, eval_interval=30,
                 faults=["random:mtbf_steps=80,seed=1,max=3"],
                 checkpoint_every=25 if s in ("checkpoint_restart", "reinit") else None)
            for seed in (0, 1) for s, g in (("checkpoint_restart", False), ("shrink", False), ("rollback", False),
                                           ("forward", False), ("reinit", False), ("rollback", True),
                                           ("forward", True))]
    plain = [dict(world_size=w, steps=300, seed=0) for w in (2, 4)]
    settings = [("free", None), ("pin2", "0,1")]
    report = {"cores": ncores, "runs": {}}
    for name, cpus in settings:
        for label, runs in (("plain", plain), ("demo", demo if name in ("free", "pin2") else [])):
            if not runs:
                continue
            spec = json.dumps({"runs": runs})
            cmd = [sys.executable, __file__, "--child", spec]
            if cpus:
                cmd = ["taskset", "-c", cpus, *cmd]
            t0 = time.time()
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
            if done.returncode:
                print(name, label, "failed", done.stderr[-2000:], flush=True)
                continue
            report["runs"][f"{name}/{label}"] = json.loads(done.stdout.strip().splitlines()[-1])
            print(name, label, f"{time.time() - t0:.0f} s", flush=True)
            with open(os.path.join(where, "clock_check.json"), "w") as f:
                json.dump(report, f)


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--child":
        print(json.dumps(child(json.loads(sys.argv[2]))))
    else:
        main()
