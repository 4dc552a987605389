"""Injection campaigns: one golden run, then one run per injection, each classified against the golden run."""

from __future__ import annotations

import os
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from workbench.config.run import FaultSpec, RunConfig
from workbench.faults.outcomes import classify


def default_jobs(world_size: int) -> int:
    """Concurrent runs: this machine's cores shared by the ranks (at least one run at a time)."""
    return max(1, (os.cpu_count() or 1) // max(world_size, 1))


def flip_plan(config: RunConfig, tensors: Iterable[str], bits: Iterable[int], step: int, per_bit: int = 1,
              seed: int = 0) -> list[FaultSpec]:
    """The same flips for any parallel mode: for each tensor (a parameter name, or a module name for its output
    activation) and bit, ``per_bit`` flips of seeded random elements at ``step``, each on the rank that holds
    the tensor (rank 0 of a data-parallel run, the owning stage's rank in a pipeline)."""
    from workbench.faults.targets import rank_holding
    from workbench.workloads.stages import model_tensors

    params, _ = model_tensors(config)
    plan = []
    for tensor in tensors:
        rank = rank_holding(config, tensor)
        target = "weight" if tensor in params else "activation"
        for bit in bits:
            for k in range(per_bit):
                plan.append(FaultSpec("flip", rank, step=step, target=target, tensor=tensor, bit=bit,
                                      seed=seed * 1_000_003 + bit * 1000 + k))
    return plan


def campaign(config: RunConfig | dict[str, Any], injections: Iterable[FaultSpec | str | dict[str, Any]],
             tolerance: float = 0.01, jobs: int | None = None, out: str | os.PathLike | None = None) -> Any:
    """Run the golden run once, then each injection (added to the config's faults); returns a DataFrame with one
    row per injection: the injection, outcome, detected, recovered, accuracy and its delta to golden."""
    import pandas as pd

    from workbench.launch.session import run

    config = RunConfig.from_dict(config) if isinstance(config, dict) else config
    injections = [FaultSpec.coerce(i) for i in injections]
    # a campaign run again (a notebook re-executed, a sweep point retried) replaces its own earlier runs
    golden = run(config, out=Path(out) / "golden" if out else None, overwrite=True)
    if not golden.completed:
        raise RuntimeError(f"the golden run did not complete: {golden.summary['reason']}")

    def one(item: tuple[int, FaultSpec]) -> dict[str, Any]:
        i, injection = item
        result = run(config.replace(faults=[*config.faults, injection]), out=Path(out) / f"{i:04d}" if out else None,
                     overwrite=True)
        return {"injection": str(injection), **{k: getattr(injection, k) for k in ("target", "tensor", "index", "bit",
                                                                                     "rank", "step")},
                **classify(result, golden, tolerance), "golden_accuracy": golden.summary["final_test_accuracy"]}

    with ThreadPoolExecutor(max_workers=jobs or default_jobs(config.world_size)) as pool:
        rows = list(pool.map(one, enumerate(injections)))
    return pd.DataFrame(rows)
