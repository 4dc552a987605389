"""The GossipGraD design, scored on VALIDATION only: how docs/reproduce.md's "GossipGraD, redesigned" was chosen.

Per learning-rate schedule, p and tuning seed, the registry's GossipGraD run (lenet5, 600 steps, ten evaluations)
under ``parallelism="gossip"`` and ``"data"`` on :data:`workbench.campaigns.reproduce.apoptosis.DESIGN_DATA`:
synthetic_image's *training* data with 1/8 held out as the validation split the runs report as "test"; the real
test split is never loaded. Scored per accuracy reading — the plateau (mean of the last 3 evaluations, rank 0's
replica), the final evaluation, and the consensus (gossip: the replicas after ceil(log2 p) rounds without updates;
allreduce: its final model) — as gossip - allreduce, mean and 95 % t interval over seeds, non-inferior when the
lower bound is above -1 pt; and the replicas' consensus distance in the first and second half. Runs are kept
under ``--out`` (an interrupted design resumes). Tuning seeds only (0-29).
Usage: python benchmarks/gossipgrad_design.py [--seeds 22-25] [--worlds 4,8] [--steps 600] [--per-rank-batch 16]
SCHEDULE [...]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from apoptosis_design_cnn import kept_row  # this folder's: the same row cache

from workbench.campaigns.reproduce.apoptosis import DESIGN_DATA
from workbench.campaigns.reproduce.common import mean_interval
from workbench.campaigns.reproduce.gossipgrad import plateau_accuracy


def run(out: Path, seed: int, p: int, mode: str, schedule: str, steps: int,
        per_rank: int | None = None) -> dict[str, Any]:
    """One design run's row (kept: ``apoptosis_design_cnn.kept_row``). ``per_rank``: each rank's
    batch (the global batch is ``per_rank`` x p); None: the global batch stays 64 at every p."""
    settings = {"world_size": p, "seed": seed, "steps": steps, "model": "lenet5", "dataset": DESIGN_DATA,
                "parallelism": mode, "eval_interval": max(steps // 10, 1), "lr_schedule": schedule,
                **({"batch_size": per_rank * p} if per_rank else {}),
                **({"consensus_every": 5} if mode == "gossip" else {})}
    directory = out / f"{schedule}-p{p}-s{seed}-{mode}{f'-b{per_rank}' if per_rank else ''}"
    return kept_row(directory, settings, lambda result: _row(result, seed, mode, steps))


def _row(result: Any, seed: int, mode: str, steps: int) -> dict[str, Any]:
    frame = result.to_dataframe()
    half = frame.step >= steps // 2
    final = result.summary["final_test_accuracy"]
    return {"seed": seed, "outcome": result.outcome, "plateau": plateau_accuracy(frame), "final": final,
            # gossip: the consensus of the replicas after ceil(log2 p) rounds; allreduce: its one model
            "consensus": (result.summary.get("diffusion") or {}).get("test_acc") if mode == "gossip" else final,
            "consensus_early": float(frame[~half].consensus_distance.dropna().mean()) if mode == "gossip" else None,
            "consensus_late": float(frame[half].consensus_distance.dropna().mean()) if mode == "gossip" else None}


def score(schedule: str, p: int, seeds: list[int], out: Path, steps: int,
          per_rank: int | None = None) -> dict[str, Any]:
    """gossip - allreduce accuracy over the seeds (points) per reading, and whether the aim is met."""
    pairs = {seed: (run(out, seed, p, "gossip", schedule, steps, per_rank),
                    run(out, seed, p, "data", schedule, steps, per_rank)) for seed in seeds}
    scored = {}
    for metric in ("plateau", "final", "consensus"):
        gaps = [100 * (g[metric] - d.get(metric, d["final"])) for g, d in pairs.values()  # allreduce: one model
                if g.get(metric) is not None]
        mean, low, high = mean_interval(gaps, 0.95)
        scored[metric] = {"gap_pt": [mean, low, high], "non_inferior": bool(low > -1),
                          "per_seed": [round(x, 2) for x in gaps]}
    doubled = sum(g["consensus_late"] > 2 * g["consensus_early"] for g, _ in pairs.values())
    return {"schedule": schedule, "p": p, "per_rank_batch": per_rank, **scored,
            "doubled_consensus": int(doubled), "allreduce_plateau": [d["plateau"] for _, d in pairs.values()],
            "consensus_late": [g["consensus_late"] for g, _ in pairs.values()]}


def _ints(text: str) -> list[int]:
    if "," in text:
        return [int(v) for v in text.split(",")]
    low, _, high = text.partition("-")
    return list(range(int(low), int(high or low) + 1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("schedules", nargs="+", help="lr_schedule values, e.g. constant cosine")
    parser.add_argument("--seeds", type=_ints, default=_ints("22-25"), help="a range of tuning seeds: 22-25")
    parser.add_argument("--worlds", type=_ints, default=[4, 8])
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--per-rank-batch", type=int, default=None,
                        help="each rank's batch (global batch = this x p); default: a global batch of 64 at every p")
    parser.add_argument("--out", type=Path, default=Path("runs/design/gossipgrad"))
    args = parser.parse_args()
    if not all(0 <= seed <= 29 for seed in args.seeds):
        parser.error("design runs use tuning seeds (0-29) only: reporting seeds are drawn at run time")
    rows = []
    for schedule in args.schedules:
        for p in args.worlds:
            rows.append(score(schedule, p, args.seeds, args.out, args.steps, args.per_rank_batch))
            print(json.dumps(rows[-1], default=lambda v: round(v, 4)), file=sys.stderr)
    print(json.dumps({"benchmark": "gossipgrad_design", "seeds": args.seeds, "steps": args.steps, "rows": rows},
                     default=lambda v: round(v, 4)))


if __name__ == "__main__":
    main()
