"""MNIST-1D's ceiling, measured: the test accuracy a larger model trained longer reaches (``mnist1d_reference``:
four convolutions of 64 with batch norm, about 69k parameters against the paper's CNN's 5k; Adam 3e-3, cosine, global
batch 100, 8,000 steps, world 1), mean over seeds. It is a floor under the true ceiling (no Bayes rule is known for
MNIST-1D), so a workload at least 5 pt below it is at least 5 pt below the ceiling.
workbench/workloads/ceiling.py's ``MNIST1D_REFERENCE`` and the registry's ``ceilings.mnist1d`` hold the figure this
prints; tests/test_ceiling.py holds that they agree with benchmarks/results/mnist1d_ceiling.json.
Usage: python benchmarks/mnist1d_ceiling.py [--seeds 0-2] [--steps 8000] [--out runs/mnist1d_ceiling]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

from apoptosis_design_cnn import _seeds as parse_seeds  # this folder's: "0-2"
from apoptosis_design_cnn import kept_row  # a run kept by its settings
from mnist1d_table import provenance

RECIPE = {"model": "mnist1d_reference", "dataset": "mnist1d", "optimizer": "adam", "lr": 0.003,
          "lr_schedule": "cosine", "batch_size": 100, "world_size": 1}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="0-2")
    parser.add_argument("--steps", type=int, default=8000)
    parser.add_argument("--out", default="runs/mnist1d_ceiling")
    parser.add_argument("--json", default="benchmarks/results/mnist1d_ceiling.json")
    args = parser.parse_args(argv)
    started = time.monotonic()
    seeds = parse_seeds(args.seeds)
    finals = [kept_row(Path(args.out) / f"s{seed}-n{args.steps}",
                       {**RECIPE, "seed": seed, "steps": args.steps, "eval_interval": args.steps // 10},
                       lambda r: {"final": r.summary["final_test_accuracy"], "outcome": r.outcome})["final"]
              for seed in seeds]
    clock = "wall (world 1; accuracy does not depend on it)"
    report = {**provenance(clock), "minutes": round((time.monotonic() - started) / 60, 1), "recipe": RECIPE,
              "steps": args.steps, "seeds": seeds, "finals": [round(f, 4) for f in finals],
              "accuracy": round(statistics.fmean(finals), 4)}
    print(json.dumps(report))
    if args.json:
        Path(args.json).write_text(json.dumps(report) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
