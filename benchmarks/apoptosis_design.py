"""Apoptosis settings over tuning seeds, replayed in one process: how docs/apoptosis.md "Design" was measured.

Superseded: this scores the digits MLP's settings on the TEST split (the older digits campaigns, design-on-test).
The registered paper-scale setting is chosen by ``benchmarks/apoptosis_design_cnn.py``, on a validation split only.

A data-parallel apoptosis run computes, on every replica, a full-batch SGD step (the ranks' gradients summed by
the allreduce), the group-lasso pressure, and at each evaluation the rule's decision on rank 0's validation
accuracy. This script replays that computation in one process with the workbench's own pieces (dataset and
validation split, batch sequence, model, :class:`workbench.workloads.apoptosis.rule.Apoptosis`, ``group_lasso_``,
``shrink``,
the phases of :class:`~workbench.workloads.apoptosis.rule.ApoptosisConfig`), about a second per run instead of a
multi-process
run's several. It gave the same parameters and accuracies as ``workbench.run`` at world 2 on 19 of seeds 10-29
(seed 29: another reduction, the allreduce sums the gradients in another order), so it is for exploring
settings; the reported figures come from ``workbench.run`` (``make reproduce``).

Only tuning seeds belong here (the default is 10-29): seeds 0-9 are the reporting seeds, run once by the
reproduction campaign with settings fixed beforehand.

Each spec is an ``--apoptosis`` setting (``on``, ``gamma=4,lasso=0.005``, ``fold=0``, ``lasso=0`` ...), compared
with the same seed's run without apoptosis. Rows go to stderr; the last stdout line is one JSON object.
Usage: python benchmarks/apoptosis_design.py [--seeds 10-29] [--steps 400] [--hidden 128,64] SPEC [SPEC ...]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from typing import Any

import torch
import torch.nn.functional as F

from workbench.config.run import RunConfig
from workbench.rank.readings import evaluate
from workbench.workloads.apoptosis import rule as apo
from workbench.workloads.data import BatchSequence, load_dataset
from workbench.workloads.models import build_model


def replay(seed: int, spec: str | None, steps: int = 400, hidden: tuple[int, ...] = (128, 64)) -> dict[str, Any]:
    """One run of ``workbench.run(seed=seed, steps=steps, eval_interval=steps // 20, apoptosis=spec)``'s
    computation in this process: final test accuracy, parameters at the end, hidden widths, wall time."""
    config = RunConfig(seed=seed, steps=steps, hidden=list(hidden), eval_interval=max(steps // 20, 1),
                       apoptosis=spec)
    rule = config.apoptosis_rule
    torch.set_flush_denormal(rule is not None)
    data = load_dataset(config)
    model = build_model(config, data.input_shape, data.num_classes)
    pairs = apo.find_pairs(model)
    state = apo.Apoptosis(rule, {p.layer: p.units(model) for p in pairs}) if rule is not None else None
    batches = BatchSequence(len(data.y_train), config.batch_size, seed)
    momentum: dict[str, torch.Tensor] = {}
    started = time.perf_counter()
    for step in range(steps):
        if rule is not None and data.fold_validation(rule.folded(step, steps, config.eval_interval)):
            batches = BatchSequence(len(data.y_train), config.batch_size, seed)
        x, y = data.train_batch(torch.from_numpy(batches(step)), step)
        model.zero_grad(set_to_none=True)
        (F.cross_entropy(model(x), y, reduction="sum") / config.batch_size).backward()
        _sgd(model, momentum, config.lr, config.momentum)
        if rule is None:
            continue
        pressure = rule.pressure_due(step, steps)
        if pressure > 0:
            apo.group_lasso_(model, pairs, pressure, config.lr, rule.gamma)
        if (step + 1) % config.eval_interval == 0 and rule.deciding(step + 1, steps, config.eval_interval):
            momentum = _decide(model, pairs, state, momentum, evaluate(model, data)["val_acc"])
    return {"seed": seed, "test_acc": evaluate(model, data)["test_acc"], "parameters": apo.parameter_count(model),
            "widths": [p.units(model) for p in pairs], "train_s": time.perf_counter() - started}


@torch.no_grad()
def _sgd(model: torch.nn.Module, momentum: dict[str, torch.Tensor], lr: float, beta: float) -> None:
    """``torch.optim.SGD(momentum=beta)``'s step (the ranks' optimizer, workbench.rank.optim), by parameter name."""
    for name, param in model.named_parameters():
        if name in momentum:
            momentum[name].mul_(beta).add_(param.grad)
        else:
            momentum[name] = param.grad.clone()
        param.add_(momentum[name], alpha=-lr)


def _decide(model: torch.nn.Module, pairs: list[apo.Pair], state: apo.Apoptosis, momentum: dict[str, torch.Tensor],
            accuracy: float) -> dict[str, torch.Tensor]:
    """The rule's observation and removals (rank 0's decision), the momentum sliced with the units."""
    removals = {k: v for k, v in state.observe(apo.unit_norms(model, pairs), accuracy).items() if len(v)}
    if not removals:
        return momentum
    sliced = apo.shrink(model, pairs, removals, {n: {"momentum_buffer": b} for n, b in momentum.items()})
    state.forget(removals)
    return {name: entry["momentum_buffer"] for name, entry in sliced.items()}


def compare(specs: list[str], seeds: list[int], steps: int, hidden: tuple[int, ...]) -> list[dict[str, Any]]:
    """Per spec: parameter reduction (median, min) and accuracy change against the run without apoptosis (mean,
    median, worst, seeds below -1.5 pt), over ``seeds``."""
    start = apo.parameter_count(build_model(RunConfig(hidden=list(hidden)), (1, 8, 8), 10))
    off = {seed: replay(seed, None, steps, hidden) for seed in seeds}
    rows = []
    for spec in specs:
        runs = [replay(seed, spec, steps, hidden) for seed in seeds]
        change = [100 * (r["test_acc"] - off[r["seed"]]["test_acc"]) for r in runs]
        reduction = [start / r["parameters"] for r in runs]
        row = {"spec": spec, "reduction_median": statistics.median(reduction), "reduction_min": min(reduction),
               "change_mean_pt": statistics.mean(change), "change_median_pt": statistics.median(change),
               "change_worst_pt": min(change), "below_-1.5pt": sum(c < -1.5 for c in change),
               "per_seed": [(r["seed"], round(c, 2), round(d, 2)) for r, c, d in zip(runs, change, reduction)]}
        print(json.dumps({k: round(v, 2) if isinstance(v, float) else v for k, v in row.items()}), file=sys.stderr)
        rows.append(row)
    return rows


def _seeds(text: str) -> list[int]:
    low, _, high = text.partition("-")
    return list(range(int(low), int(high or low) + 1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("specs", nargs="+", help="--apoptosis settings to compare, e.g. on gamma=4,lasso=0.005")
    parser.add_argument("--seeds", type=_seeds, default=_seeds("10-29"), help="a range: 10-29 (tuning seeds only)")
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--hidden", type=lambda t: tuple(int(h) for h in t.split(",")), default=(128, 64))
    args = parser.parse_args()
    if any(seed < 10 for seed in args.seeds):
        parser.error("seeds 0-9 are the reporting seeds: settings are chosen on others (docs/apoptosis.md)")
    torch.set_num_threads(1)
    rows = compare(args.specs, args.seeds, args.steps, args.hidden)
    print(json.dumps({"benchmark": "apoptosis_design", "seeds": args.seeds, "steps": args.steps, "rows": rows}))


if __name__ == "__main__":
    main()
