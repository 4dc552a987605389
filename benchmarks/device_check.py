"""The GPU check, as a machine with a GPU runs it (no network; torch, numpy, h5py, scikit-learn and pandas only).

1. resnet20 on synthetic_image, world 4 sharing the GPU(s), a rank killed at step 20 of 60 under shrink,
   rollback + regrow, reinit and checkpoint_restart: each run completes with its replicas identical.
2. GPU memory: the compute processes nvidia-smi lists, sampled through each run: every rank's memory is gone at
   the run's end, the killed rank's before its replacement joined, no more than the 4 ranks hold any before the
   failure (a warm spare takes none until used); ``gpu_wait_s``: a replacement's wait for the dead rank's memory.
3. Step time at world 2, resnet20 at batch 128: on the GPU against the CPU, same run, same machine.
4. Flips into CUDA tensors against the same flips into CPU tensors: the same bits and the same values.

Prints one JSON line of figures; exits 1 when a check fails (after printing). ``--smoke``: the same on the CPU
with an MLP on digits, a few steps (the CPU test of this script: tests/test_devices.py).
Usage: python benchmarks/device_check.py [--out DIR] [--smoke]   (docs/devices.md records its last run)
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a file from a copy of the repository

from workbench.config import devices  # noqa: E402
from workbench.launch.session import run  # noqa: E402

STRATEGIES = {"shrink": {"strategy": "shrink"}, "rollback+regrow": {"strategy": "rollback", "regrow": True},
              "reinit": {"strategy": "reinit", "checkpoint_every": 10},
              "checkpoint_restart": {"strategy": "checkpoint_restart", "checkpoint_every": 10}}


class GpuSampler:
    """nvidia-smi's compute processes (pid -> MiB) every 0.2 s while a run lasts; nothing where it is absent."""

    def __init__(self) -> None:
        self.samples: list[tuple[float, dict[int, int]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> GpuSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)
        if self.samples:
            time.sleep(1.0)  # the run has returned: its ranks are gone, their memory with them
            self._sample()  # the last sample: what outlived the run

    def _loop(self) -> None:
        while not self._stop.wait(0.2) and self._sample():
            pass

    def _sample(self) -> bool:
        try:
            out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory",
                                  "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=5).stdout
        except (OSError, subprocess.SubprocessError):
            return False  # no nvidia-smi: nothing to sample
        rows = [line.split(",") for line in out.strip().splitlines() if "," in line]
        self.samples.append((time.time(), {int(p): int(m) for p, m in rows if m.strip().isdigit()}))
        return True

    def after(self, t: float) -> set[int]:
        """Pids holding GPU memory in the samples taken after ``t``."""
        return {pid for when, apps in self.samples if when > t for pid in apps}


def _memory_figures(sampler: GpuSampler, result: object, started: float) -> dict[str, object]:
    """What held GPU memory: before the first failure, once its recovery was over, and at the run's end. A pid
    seen before the failure and never after the recovery is a rank whose memory came back (the killed one)."""
    if not sampler.samples:
        return {"memory_checked": False}
    at = {e["kind"]: started + e["time"] for e in reversed(result.events)}  # the first of each kind
    before = {pid for when, apps in sampler.samples if when < at.get("failure", float("inf")) for pid in apps}
    figures: dict[str, object] = {"memory_checked": True, "gpu_pids_before_failure": len(before),
                                  "left_at_end": len(sampler.samples[-1][1]),
                                  "peak_mib": max(sum(apps.values()) for _, apps in sampler.samples)}
    if "failure" in at and "recovered" in at:
        figures["freed_by_recovery"] = bool(before - sampler.after(at["recovered"]))
    return figures


def check_strategies(device: str, smoke: bool, out: Path) -> dict[str, dict]:
    base = _workload(smoke) | {"world_size": 4, "steps": 30 if smoke else 60, "device": device,
                               "faults": ["kill:rank=1,step=10" if smoke else "kill:rank=1,step=20"]}
    rows = {}
    for name, settings in STRATEGIES.items():
        started = time.time()
        with GpuSampler() as sampler:
            result = run(**base, **settings, out=out / name.replace("+", "_"), overwrite=True)
        summary = result.summary
        rows[name] = {"outcome": summary["outcome"], "reason": summary["reason"],
                      "replicas_identical": bool(summary.get("replicas_identical")),
                      "failures": len(result.failures), "world_final": summary.get("world_size_final"),
                      "wall_s": round(time.time() - started, 1), **_memory_figures(sampler, result, started),
                      "gpu_wait_s": _gpu_wait(result)}
    return rows


def _gpu_wait(result: object) -> float | None:
    """The longest a rank waited for dead ranks' GPU memory before it took its GPU (its joined event's figure)."""
    waits = [e["gpu_wait_s"] for e in result.events if e["kind"] == "joined" and "gpu_wait_s" in e]
    return max(waits) if waits else None


def step_times(device: str, smoke: bool, out: Path) -> dict[str, float]:
    """Median step time (ms) at world 2 on the CPU and on ``device``, same workload, same machine."""
    times = {}
    for where in dict.fromkeys(["cpu", device]):
        result = run(**_workload(smoke), world_size=2, steps=10 if smoke else 40, device=where,
                     out=out / f"steps_{where}", overwrite=True)
        if result.summary["outcome"] != "completed":
            raise SystemExit(f"device_check: the {where} step-time run failed: {result.summary['reason']}")
        measured = [m["step_time"] for m in result.metrics if m.get("step_time") is not None][3:]  # warm-up left out
        times[where] = round(1000 * statistics.median(measured), 2)
    return times


def check_flips(device: str) -> dict[str, object]:
    """The same flips into a tensor on ``device`` and on the CPU: bit-identical results and logged values."""
    import numpy as np
    import torch

    from workbench.faults import bitflip

    results = {}
    for dtype in (torch.float32, torch.float16, torch.bfloat16, torch.float64):
        host = (torch.randn(4096, generator=torch.Generator().manual_seed(0)) * 10).to(dtype)
        indices, masks = bitflip.draw(host.numel(), dtype, count=256, seed=1)
        indices = np.concatenate([indices, indices[:8]])  # repeated elements: both flips apply
        masks = np.concatenate([masks, masks[:8] >> np.uint64(1) | np.uint64(1)])
        on_device = host.to(device)
        cpu_log = bitflip.apply_masks(host, indices, masks, "t")
        dev_log = bitflip.apply_masks(on_device, indices, masks, "t")
        raw = {2: torch.int16, 4: torch.int32, 8: torch.int64}[host.element_size()]
        same = torch.equal(host.view(raw), on_device.cpu().view(raw))
        values = np.array_equal(cpu_log.new, dev_log.new, equal_nan=True)
        results[str(dtype).removeprefix("torch.")] = bool(same and values)
    return results


def _workload(smoke: bool) -> dict[str, object]:
    if smoke:
        return {"model": "mlp", "dataset": "digits", "batch_size": 64, "eval_interval": 10}
    return {"model": "resnet20", "dataset": "synthetic_image", "synthetic_size": 4096, "batch_size": 128,
            "eval_interval": 20}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None, help="where the runs go (default: a temporary directory)")
    parser.add_argument("--smoke", action="store_true", help="the CPU, a small model: this script's own test")
    args = parser.parse_args()
    out = Path(args.out or tempfile.mkdtemp(prefix="device-check-"))
    found = devices.inventory()
    device = "cpu" if args.smoke or not found.gpus else "cuda"
    began = time.time()
    figures: dict[str, object] = {"benchmark": "device_check", "device": device,
                                  "gpus": found.describe() if found.gpus else found.why_none()}
    figures["strategies"] = check_strategies(device, args.smoke, out)
    figures["step_ms"] = step_times(device, args.smoke, out)  # the median step on the wall clock (GPU time is no CPU's)
    figures["step_clock"] = "wall"
    if device == "cuda":
        figures["speedup"] = round(figures["step_ms"]["cpu"] / figures["step_ms"]["cuda"], 1)
        figures["flips_exact"] = check_flips("cuda")  # last: this process touches CUDA only now
    figures["seconds"] = round(time.time() - began, 1)
    print(json.dumps(figures))
    rows = figures["strategies"].values()
    ok = all(r["outcome"] == "completed" and r["replicas_identical"] for r in rows)
    ok = ok and all(figures.get("flips_exact", {}).values())
    ok = ok and all(r.get("left_at_end", 0) == 0 and r.get("freed_by_recovery", True) for r in rows)
    ok = ok and all(r.get("gpu_pids_before_failure", 0) <= 4 for r in rows)  # a warm spare holds no GPU memory
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
