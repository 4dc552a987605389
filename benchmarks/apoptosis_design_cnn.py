"""The paper-scale apoptosis design, scored on VALIDATION only: how docs/apoptosis.md "Design on lenet5" was measured.

Each ``--apoptosis`` setting runs through ``workbench.run`` (lenet5, world 4, the registry's steps) against the
same tuning seed's run without apoptosis, on :func:`workbench.campaigns.reproduce.apoptosis.design_data`:
synthetic_image's
*training* data with 1/8 held out as the design's validation split, which neither run trains on and which the
runs report as their "test" accuracy. The real test split is never loaded. Aims, per setting: parameters / >= 3
in every run, accuracy change non-inferior within 1 pt (mean over seeds, 95 % t interval), training time lower
on the rank-time clock. Runs are kept under ``--out`` (an interrupted search resumes). Tuning seeds only (0-29).
Usage: python benchmarks/apoptosis_design_cnn.py [--seeds 10-14] [--steps 600] [--out DIR] SPEC [SPEC ...]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import workbench
from workbench.campaigns.reproduce.apoptosis import DESIGN_DATA
from workbench.campaigns.reproduce.common import mean_interval
from workbench.results.run_result import RESULT_FILE, RunResult


def run(out: Path, seed: int, spec: str | None, steps: int, world: int,
        workload: dict[str, Any] | None = None) -> dict[str, Any]:
    """One design run: validation accuracy, parameters at start and end, rank-time training seconds (kept:
    :func:`kept_row`). ``workload``: settings beside the defaults (model lenet5), e.g. model, width, lr_schedule."""
    workload = {"model": "lenet5", **(workload or {})}
    settings = {"world_size": world, "seed": seed, "steps": steps, "dataset": DESIGN_DATA,
                "eval_interval": max(steps // 20, 1), "apoptosis": spec, **workload}
    tag = "".join(f"-{k}={v}" for k, v in sorted(workload.items()) if k != "model" or v != "lenet5")
    directory = out / f"w{world}-s{seed}{tag}-{spec or 'off'}"
    return kept_row(directory, settings, lambda result: _row(result, seed))


def _row(result: Any, seed: int) -> dict[str, Any]:
    s, size = result.summary, result.summary.get("parameters") or {}
    return {"seed": seed, "outcome": result.outcome, "val_acc": s["final_test_accuracy"],
            "reduction": size["start"] / size["end"] if size.get("end") else 1.0,
            "rank_train_s": s.get("rank_train_s"), "train_s": s["train_s"]}


def kept_row(directory: Path, settings: dict[str, Any], row_of: Callable[[Any], dict[str, Any]]) -> dict[str, Any]:
    """``row_of(workbench.run(**settings))``, kept in ``directory/row.json`` keyed by the settings (not by the
    source: a search outlives small edits); a run saved there by an earlier invocation is loaded, not run again."""
    kept = directory / "row.json"
    if kept.is_file() and json.loads(kept.read_text())["settings"] == settings:
        return json.loads(kept.read_text())["row"]
    if (directory / RESULT_FILE).is_file():  # a run of an earlier invocation (cached_run's stamp)
        result = RunResult.load(directory / RESULT_FILE)
    else:
        directory.mkdir(parents=True, exist_ok=True)
        result = workbench.run(**settings, overwrite=True)
        result.save(directory)
    row = row_of(result)
    kept.write_text(json.dumps({"settings": settings, "row": row}))
    return row


def score(spec: str, off: dict[int, dict[str, Any]], on: list[dict[str, Any]]) -> dict[str, Any]:
    """A setting against the runs without it, per tuning seed: reduction, accuracy change, time ratio."""
    change = [100 * (r["val_acc"] - off[r["seed"]]["val_acc"]) for r in on]
    ratio = [r["rank_train_s"] / off[r["seed"]]["rank_train_s"] for r in on]
    reduction = [r["reduction"] for r in on]
    mean, low, high = mean_interval(change, 0.95)
    log_mean, log_low, log_high = mean_interval([-math.log(x) for x in ratio], 0.95)
    return {"spec": spec, "reduction_min": min(reduction), "reduction_median": statistics.median(reduction),
            "change_mean_pt": mean, "change_low_pt": low, "change_high_pt": high,
            "time_ratio_median": statistics.median(ratio), "log_speedup": [log_mean, log_low, log_high],
            "aims_met": bool(min(reduction) >= 3 and low > -1 and log_low > 0),
            "per_seed": [(r["seed"], round(c, 2), round(d, 2), round(t, 3))
                         for r, c, d, t in zip(on, change, reduction, ratio)]}


def _value(text: str) -> Any:
    """A ``--set`` value: a number where it reads as one, else the text."""
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def _seeds(text: str) -> list[int]:
    low, _, high = text.partition("-")
    return list(range(int(low), int(high or low) + 1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("specs", nargs="+", help="--apoptosis settings, e.g. on gamma=4,lasso=0.009")
    parser.add_argument("--seeds", type=_seeds, default=_seeds("10-14"), help="a range of tuning seeds: 10-14")
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--world", type=int, default=4)
    parser.add_argument("--out", type=Path, default=Path("runs/design/apoptosis_cnn"))
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="a run setting beside the defaults, e.g. model=vgg11 width=0.25 lr_schedule=cosine")
    args = parser.parse_args()
    workload = {k: _value(v) for k, _, v in (item.partition("=") for item in args.set)}
    if not all(0 <= seed <= 29 for seed in args.seeds):
        parser.error("design runs use tuning seeds (0-29) only: reporting seeds are drawn at run time")
    off = {seed: run(args.out, seed, None, args.steps, args.world, workload) for seed in args.seeds}
    print(json.dumps({"spec": "off", "val_acc": {s: r["val_acc"] for s, r in off.items()}}), file=sys.stderr)
    rows = []
    for spec in args.specs:
        rows.append(score(spec, off, [run(args.out, seed, spec, args.steps, args.world, workload)
                                      for seed in args.seeds]))
        print(json.dumps(rows[-1], default=lambda v: round(v, 3)), file=sys.stderr)
    print(json.dumps({"benchmark": "apoptosis_design_cnn", "seeds": args.seeds, "steps": args.steps,
                      "world": args.world, "workload": workload, "off": off, "rows": rows}))


if __name__ == "__main__":
    main()
