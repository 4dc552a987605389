"""Bit flips into an HDF5 checkpoint: this project vs the peer's method, and the detectors' cost per step.

(a) ``workbench.faults.hdf5.alter_checkpoint``: vectorised XOR through a memory map at the dataset's file offset.
(b) the peer's method (``hdf5_corrupter``): per value, an h5py element read, ``struct`` to reinterpret the float
    as an integer, XOR, ``struct`` back, an h5py element write.
Both flip random bits of random elements of the same >= 10 MB float32 checkpoint, in one run. Then each
detector's cost, from the same no-fault trainings (world 2) run with no detector and with each one, in shuffled
rounds, two ways: (c) its work per step, timed inside the ranks of the real run (CPU time of the rank's thread in
every detector call — alarms, settle, the every-``detect_every``-steps snapshot and checks — summed over the run:
the summary's ``detector_s``, the slowest final member), in % of the no-detector step; (d) end to end: wall time
per step with the detector against without it (median over rounds of the per-round ratio, with the spread: on 2
shared cores the spread is ±10-30 % of a 2.5 ms step, so (d) bounds what (c) measures only coarsely).
Prints one JSON line. Usage: python benchmarks/bench_bitflip.py [--mb 12] [--flips 200000] [--peer-flips 3000]
       [--model resnet20 --dataset synthetic_image --batch-size 128]  (the detector runs' workload; default the MLP)
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import struct
import tempfile
import time
from pathlib import Path

import h5py
import numpy as np
import torch

import workbench
from workbench.base import checkpoint
from workbench.faults.hdf5 import alter_checkpoint


def make_checkpoint(path: Path, megabytes: float) -> None:
    n = int(megabytes * 2**20 / 4)
    side = int(n**0.5)
    model = {"fc1.weight": torch.randn(side, side), "fc1.bias": torch.randn(side)}
    checkpoint.save(path, checkpoint.Checkpoint(0, model, {}))


def peer_flips(path: Path, count: int, seed: int) -> float:
    """The per-value struct path through h5py element reads and writes; returns flips/s."""
    rng = np.random.default_rng(seed)
    with h5py.File(path, "r+") as f:
        ds = f["model/fc1.weight"]
        rows, cols = ds.shape
        started = time.perf_counter()
        for _ in range(count):
            i, j, bit = int(rng.integers(rows)), int(rng.integers(cols)), int(rng.integers(32))
            value = float(ds[i, j])
            as_int = struct.unpack("<I", struct.pack("<f", value))[0] ^ (1 << bit)
            ds[i, j] = struct.unpack("<f", struct.pack("<I", as_int))[0]
        return count / (time.perf_counter() - started)


def our_flips(path: Path, count: int, seed: int) -> float:
    started = time.perf_counter()
    alter_checkpoint(path, datasets=["model/fc1.weight"], count=count, seed=seed)
    return count / (time.perf_counter() - started)


def detector_overheads(steps: int, rounds: int, **workload: object) -> dict[str, float]:
    """Each detector's cost (see the module docstring): wall time per step in the steady state (step reports'
    timestamps after the first 20 steps, so the periodic work counts, not just the median step) and the ranks' own
    timing of their detector work, with the detector against without it in the same round; rounds run the variants
    in a shuffled order so the machine's drift falls on all alike."""
    import random

    variants = {"none": [], "guard": ["guard"], "spike": ["spike"], "fingerprint": ["fingerprint"]}
    per_step: dict[str, list[float]] = {name: [] for name in variants}
    work: dict[str, list[float]] = {name: [] for name in variants}
    order = list(variants)
    for k in range(rounds):
        random.Random(k).shuffle(order)
        for name in order:
            result = workbench.run(world_size=2, steps=steps, eval_interval=steps, detect=variants[name], **workload)
            times = [r["time"] for r in result.metrics[20:]]
            per_step[name].append((times[-1] - times[0]) / (len(times) - 1))
            work[name].append(result.summary["detector_s"] / result.summary["steps_completed"])
    base = statistics.median(per_step["none"])
    figures = {"no_detector_step_ms": round(base * 1e3, 3), "rounds": rounds}
    for name in ("guard", "spike", "fingerprint"):
        mine = statistics.median(work[name])
        figures[f"{name}_work_us"] = round(mine * 1e6, 1)
        figures[f"{name}_work_pct"] = round(100 * mine / base, 2)
        ratios = [mine / none for mine, none in zip(per_step[name], per_step["none"])]
        figures[f"{name}_overhead_pct"] = round((statistics.median(ratios) - 1) * 100, 2)
        figures[f"{name}_overhead_spread_pct"] = [round((min(ratios) - 1) * 100, 2), round((max(ratios) - 1) * 100, 2)]
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, default=12.0)
    parser.add_argument("--flips", type=int, default=200_000)
    parser.add_argument("--peer-flips", type=int, default=3_000)
    parser.add_argument("--steps", type=int, default=400, help="training steps per detector measurement")
    parser.add_argument("--rounds", type=int, default=6, help="interleaved rounds of the detector runs")
    parser.add_argument("--model", default="mlp", help="the detector runs' model (e.g. resnet20)")
    parser.add_argument("--dataset", default="digits", help="the detector runs' dataset (e.g. synthetic_image)")
    parser.add_argument("--batch-size", type=int, default=64, help="the detector runs' global batch")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        original = Path(tmp) / "ckpt.h5"
        make_checkpoint(original, args.mb)
        ours_path, peer_path = Path(tmp) / "ours.h5", Path(tmp) / "peer.h5"
        shutil.copyfile(original, ours_path)
        shutil.copyfile(original, peer_path)
        ours = our_flips(ours_path, args.flips, seed=1)
        peer = peer_flips(peer_path, args.peer_flips, seed=1)
        size_mb = original.stat().st_size / 2**20
    detectors = detector_overheads(args.steps, args.rounds, model=args.model, dataset=args.dataset,
                                   batch_size=args.batch_size)
    print(json.dumps({"benchmark": "bitflip", "checkpoint_mb": round(size_mb, 1),
                      "workbench_flips_per_s": round(ours), "peer_struct_h5py_flips_per_s": round(peer),
                      "ratio": round(ours / peer, 1), "detector_model": args.model, **detectors}))


if __name__ == "__main__":
    main()
