"""The failure-free accuracy an accuracy comparison is registered beside, measured where the comparison is made:
each paper's own failure-free runs (its module's ``failure_free_runs``) at every registered world size and budget,
on tuning seeds. A registry entry's ``failure_free`` carries these figures per world (``measured``), and
``registry.load`` refuses one measured elsewhere. Run before a registration, never on reporting seeds::

    python -m workbench.campaigns.reproduce.failure_free gossipgrad --seeds 0 1 [--steps 150]

The last stdout line is one JSON object: the key, the settings that differ from the registry's, and per world
the final test accuracy of each seed (0-1) (docs/reproduce-rules.md, "Ceilings"). Bad input: one line, exit 2.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from workbench.base.entry import OneLineParser, answer, positive_int
from workbench.base.errors import WorkbenchError

__all__ = ["FailureFreeRefused", "keys", "measure", "module_of"]
NAME = "failure_free"


class FailureFreeRefused(WorkbenchError, ValueError):
    """A measurement that cannot be made: an unknown key, a seed that is not a tuning seed, a budget below 1."""


def keys() -> list[str]:
    """The registry entries whose campaign compares accuracy: those a failure-free accuracy is measured for."""
    from workbench.campaigns.reproduce import registry

    reg = registry.load()
    return [key for key in reg.papers if hasattr(_campaign(reg.campaign_of(key)), "failure_free_runs")]


def module_of(key: str) -> Any:
    """The campaign module that runs registry entry ``key`` (a replication runs its original's campaign, a later
    study its paper's); FailureFreeRefused naming the allowed keys for one that compares no accuracy."""
    from workbench.campaigns.reproduce import registry

    reg = registry.load()
    module = _campaign(reg.campaign_of(key)) if isinstance(reg.papers.get(key), dict) else None
    if not hasattr(module, "failure_free_runs"):
        raise FailureFreeRefused(f"{key!r} is not a registry entry that compares accuracy; allowed: "
                                 f"{', '.join(keys())}")
    return module


def _campaign(name: str) -> Any:
    import importlib

    try:
        return importlib.import_module(f"workbench.campaigns.reproduce.{name}")
    except ImportError:
        return None


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
    from workbench.campaigns.reproduce import registry

    tuning = registry.load().tuning_seeds
    if not seeds or any(not tuning[0] <= seed <= tuning[1] for seed in seeds):
        raise FailureFreeRefused(f"seeds {seeds}: give tuning seeds, {tuning[0]}-{tuning[1]} (never a reporting "
                                 "seed)")
    if len(set(seeds)) != len(seeds):
        raise FailureFreeRefused(f"seeds {seeds}: give each seed once")
    steps = overrides.get("steps")
    if steps is not None and not (isinstance(steps, int) and not isinstance(steps, bool) and steps >= 1):
        raise FailureFreeRefused(f"steps {steps!r}: give an integer >= 1 (or none: the registered budget)")
    module = module_of(key)
    with tempfile.TemporaryDirectory(prefix="workbench-failure-free-") as scratch:
        try:
            return _runs(key, module, seeds, overrides, scratch)
        except BaseException:  # an interrupt may come before a run's wait(): stopped before its directory goes
            if "workbench.launch.session" in sys.modules:
                sys.modules["workbench.launch.session"].stop_all("interrupted", wait=30.0)
            raise


def _runs(key: str, module: Any, seeds: list[int], overrides: dict[str, Any], scratch: str) -> dict[int, list[float]]:
    import workbench
    from workbench.campaigns.reproduce.common import campaign_settings

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
    parser = OneLineParser(prog="python -m workbench.campaigns.reproduce.failure_free",
                           description=__doc__.split("\n\n")[0])
    parser.add_argument("key", help="a registry entry with accuracy comparisons, e.g. gossipgrad")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1], help="tuning seeds (default 0 1)")
    parser.add_argument("--steps", type=positive_int, help="a budget other than the registered one (to choose one)")
    args = parser.parse_args(argv)
    overrides = {"steps": args.steps} if args.steps is not None else {}

    def work() -> int:
        try:
            measured = measure(args.key, args.seeds, **overrides)
        except RuntimeError as exc:  # a failure-free run that did not complete
            print(f"{NAME}: {exc}", file=sys.stderr)
            return 1
        print(json.dumps({"key": args.key, "seeds": args.seeds, "overrides": overrides,
                          "measured": {str(world): accuracies for world, accuracies in measured.items()}}))
        return 0

    return answer(NAME, work, process=argv is None)


if __name__ == "__main__":
    raise SystemExit(main())
