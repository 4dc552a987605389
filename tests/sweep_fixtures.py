"""A sweep directory built without running anything (results written directly), for the report tests."""

import json
import math
from pathlib import Path

import pandas as pd

from workbench.campaigns.studies.sensitivity import save_trials
from workbench.launch.sweeps.run import point_id
from workbench.results.run_result import RunResult

STRATEGIES = ("shrink", "rollback", "checkpoint_restart")


def fake_result(strategy, seed, parallelism):
    metrics = [{"step": s, "time": 100 + 0.01 * s, "loss": 2 / (s + 1), "train_acc": 0.5, "samples": 64,
                "test_acc": 0.5 + s / 50 + 0.01 * seed if s % 5 == 4 else math.nan, "test_loss": math.nan,
                "world_size": 4 if s < 10 else 3, "generation": 0 if s < 10 else 1, "step_time": 0.01}
               for s in range(20)]
    events = [{"time": 0.0, "step": 0, "rank": -1, "kind": "generation", "detail": "generation 0: ranks [0, 1, 2, 3]",
               "gen": 0, "members": [0, 1, 2, 3], "recovery": None},
              {"time": 0.1, "step": 10, "rank": 2, "kind": "failure", "detail": "rank 2 died", "cause": "died",
               "world_after": 3},
              {"time": 0.2, "step": 10, "rank": -1, "kind": "generation", "detail": "generation 1: ranks [0, 1, 3]",
               "gen": 1, "members": [0, 1, 3], "recovery": strategy}]
    failures = [{"rank": 2, "step": 10, "cause": "killed", "detection_s": 0.02, "resume_s": 0.05, "steps_redone": 0,
                 "samples_lost": 16, "world_size_after": 3, "strategy": strategy}]
    summary = {"outcome": "completed", "reason": "", "final_test_accuracy": 0.9 - 0.01 * STRATEGIES.index(strategy),
               "baseline_accuracy": 0.9, "overhead_s": 0.5 * STRATEGIES.index(strategy) + 0.1 * seed,
               "world_size_initial": 4, "world_size_final": 3, "steps_completed": 20, "steps_redone_total": 0,
               "samples_lost_total": 16, "wall_s": 3.0, "failures": failures}
    config = {"strategy": strategy, "seed": seed, "regrow": False, "parallelism": parallelism}
    return RunResult(config, metrics, events, failures, summary)


def fake_trials():
    rows = [{"bit": bit, "field": "exponent" if bit >= 23 else "mantissa", "trial": t, "dataset": "model/fc1.weight",
             "index": t, "old": 0.1, "new": 1e30 if bit == 30 else 0.1, "accuracy": math.nan if bit == 30 else 0.9,
             "outcome": "nonfinite" if bit == 30 else "masked"} for bit in (0, 22, 23, 30) for t in range(2)]
    return pd.DataFrame(rows)


def fake_sweep(directory):
    """strategy x seed x parallelism points, all completed; one also saved per-bit trials. Returns the ids."""
    directory = Path(directory)
    points = [{"strategy": s, "seed": seed, "parallelism": par} for s in STRATEGIES for seed in (0, 1)
              for par in ("allreduce", "gossip")]
    for p in points:
        pid = point_id(p)
        fake_result(p["strategy"], p["seed"], p["parallelism"]).save(directory / pid)
        (directory / pid / "nb.ipynb").write_text("{}")
        (directory / pid / "point.json").write_text(json.dumps(
            {"id": pid, "parameters": {**p, "out": str(directory / pid)}, "notebook": str(directory / pid / "nb.ipynb"),
             "status": "completed", "error": None, "wall_s": 1.0}))
    save_trials(fake_trials(), directory / point_id(points[0]) / "sensitivity.h5")
    (directory / "sweep.json").write_text(json.dumps(
        {"notebook": "fake.ipynb", "points": [{"id": point_id(p), "parameters": p} for p in points]}))
    return [point_id(p) for p in points]
