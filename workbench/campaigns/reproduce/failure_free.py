"""The failure-free accuracy an accuracy comparison is registered beside, measured where the comparison is made:
each paper's own failure-free runs (its module's ``failure_free_runs``) at every registered world size and budget,
on tuning seeds. A registry entry's ``failure_free`` carries these figures per world (``measured``), and
``registry.load`` refuses one measured elsewhere. Run before a registration, never on reporting seeds::

    python -m workbench.campaigns.reproduce.failure_free gossipgrad --seeds 0 1 [--steps 150]

The last stdout line is one JSON object: the key, the settings that differ from the registry's, and per world
the final test accuracy of each seed (0-1). See docs/reproduce-rules.md, "Ceilings".
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

__all__ = ["measure", "module_of"]


def module_of(key: str) -> Any:
    """The campaign module that runs registry entry ``key`` (a replication runs its original's campaign)."""
    import importlib

    from workbench.campaigns.reproduce import registry

    entry = registry.load().papers[key]
    return importlib.import_module(f"workbench.campaigns.reproduce.{entry.get('replicates') or key}")


def measure(key: str, seeds: list[int], **overrides: Any) -> dict[int, list[float]]:
    """Per registered world size of ``key``'s workload (with ``overrides``, e.g. ``steps``), the final test
    accuracy of its failure-free run on each tuning seed, in ``seeds``' order."""
    from workbench.campaigns.reproduce import registry

    token = registry.MEASURING.set(True)  # a registration being measured: its failure_free is not filled in yet
    try:
        return _measure(key, seeds, overrides)
    finally:
        registry.MEASURING.reset(token)


def _measure(key: str, seeds: list[int], overrides: dict[str, Any]) -> dict[int, list[float]]:
    import workbench
    from workbench.campaigns.reproduce import registry
    from workbench.campaigns.reproduce.common import campaign_settings

    tuning = registry.load().tuning_seeds
    if not seeds or any(not tuning[0] <= seed <= tuning[1] for seed in seeds):
        raise ValueError(f"seeds {seeds}: give tuning seeds, {tuning[0]}-{tuning[1]} (never a reporting seed)")
    module = module_of(key)
    with tempfile.TemporaryDirectory(prefix="workbench-failure-free-") as scratch:
        settings = campaign_settings(key, module.SCALES, "paper", scratch, {**overrides, "seeds": seeds})
        measured: dict[int, list[float]] = {}
        for world, run in module.failure_free_runs(settings):
            for seed in seeds:
                result = workbench.run(**run, seed=seed, out=Path(scratch) / f"w{world}-s{seed}")
                if not result.completed:
                    raise RuntimeError(f"{key}: the failure-free run at world {world}, seed {seed} ended "
                                       f"{result.outcome}: {result.summary['reason']}")
                measured.setdefault(world, []).append(round(float(result.summary["final_test_accuracy"]), 4))
                print(f"[failure_free] {key} world {world} seed {seed}: {measured[world][-1]:.4f}", file=sys.stderr,
                      flush=True)
    return measured


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m workbench.campaigns.reproduce.failure_free",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("key", help="a registry entry with accuracy comparisons, e.g. gossipgrad")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1], help="tuning seeds (default 0 1)")
    parser.add_argument("--steps", type=int, help="a budget other than the registered one (to choose one)")
    args = parser.parse_args(argv)
    overrides = {"steps": args.steps} if args.steps else {}
    measured = measure(args.key, args.seeds, **overrides)
    print(json.dumps({"key": args.key, "seeds": args.seeds, "overrides": overrides,
                      "measured": {str(world): accuracies for world, accuracies in measured.items()}}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
