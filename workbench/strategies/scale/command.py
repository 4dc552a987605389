"""The scale model's command line, ``workbench scale`` (:mod:`workbench.launch.cli` adds it): one strategy's
effective training time and costs at a world size and MTBF (docs/scale.md). Bad input is one line, exit 2.
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Callable
from dataclasses import replace
from typing import Any

VARIES = {"world": ("world", 2.0, 1e6), "mtbf-hours": ("mtbf_hours", 0.01, 1e8)}  # --vary: keyword, range
COSTS = ("step_s", "detection_s", "settle_s", "join_s", "restart_s", "reload_s", "checkpoint_s", "write_s")


def _number(kind: str, low: float, strict: bool, integer: bool = False) -> Callable[[str], Any]:
    """An argparse type: a finite number (or integer) above ``low`` (or at least it), said in one line."""
    allowed = f"{'an integer' if integer else 'a number of ' + kind} {'>' if strict else '>='} {low:g}"

    def parse(text: str) -> Any:
        try:
            value = int(text) if integer else float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not allowed: {allowed}") from None
        if not math.isfinite(value) or value < low or (strict and value == low):
            raise argparse.ArgumentTypeError(f"{text!r} is not allowed: {allowed}")
        return value

    return parse


def add_scale_parser(sub: Any) -> None:
    """The ``scale`` sub-command."""
    from workbench.strategies.scale.profiles import NAMES

    scale = sub.add_parser("scale", help="predict a strategy's effective training time at scale",
                           description="Predict one recovery strategy's effective training time, steps redone, "
                           "samples lost and spares used for a job of --world ranks (docs/scale.md): the "
                           "first-order closed form where it holds, else a discrete-event simulation.")
    hours, seconds = _number("hours", 0, True), _number("seconds", 0, False)
    scale.add_argument("--strategy", choices=NAMES, default="checkpoint_restart")
    scale.add_argument("--world", type=_number("", 1, False, integer=True), default=1024, help="ranks (default 1024)")
    scale.add_argument("--mtbf-hours", type=hours, help="one rank's mean time between failures")
    scale.add_argument("--job-mtbf-hours", type=hours, help="instead: the whole job's MTBF at --world ranks")
    scale.add_argument("--node-mtbf-hours", type=hours, help="whole-node failures: one node's MTBF")
    scale.add_argument("--ranks-per-node", type=_number("", 1, False, integer=True), default=1,
                       help="ranks a node failure takes down together (default 1)")
    scale.add_argument("--weibull-shape", type=_number("", 0, True), default=1.0,
                       help="Weibull shape of the times between failures (default 1: exponential)")
    for name in COSTS:
        scale.add_argument(f"--{name[:-2].replace('_', '-')}-s", dest=name, type=seconds,
                           help=f"the strategy's {name[:-2].replace('_', ' ')} cost, seconds (a constant)")
    scale.add_argument("--costs", metavar="FILE", help="JSON {strategy: {cost: law}} of cost laws (docs/scale.md)")
    scale.add_argument("--interval-s", type=_number("seconds", 0, True),
                       help="computation between checkpoints (default: the --interval-rule optimum)")
    scale.add_argument("--interval-rule", choices=["young", "daly"], default="young")
    scale.add_argument("--spares", type=_number("", 0, False, integer=True),
                       help="spare ranks for the whole job (default: never short of one)")
    scale.add_argument("--replacement-s", type=seconds, default=0.0, help="the wait for a replacement once the "
                       "spares are used up, seconds")
    scale.add_argument("--replica-ranks", type=_number("", 0, False, integer=True), default=0,
                       help="ranks of one replica group (torchft)")
    scale.add_argument("--params", type=_number("parameters", 0, False), default=1e9)
    scale.add_argument("--job-hours", type=hours, default=720.0, help="the job's wall time (default 720: 30 days)")
    scale.add_argument("--batch-per-rank", type=_number("samples", 0, False), default=1.0)
    scale.add_argument("--regrow", action="store_true", help="shrink, rollback, forward: replacements join back")
    scale.add_argument("--method", choices=["auto", "closed", "simulate"], default="auto")
    scale.add_argument("--seed", type=_number("", 0, False, integer=True), default=0)
    scale.add_argument("--crossover", metavar="OTHER", choices=NAMES,
                       help="instead: where --strategy and OTHER cross, as --vary changes (closed form)")
    scale.add_argument("--vary", choices=list(VARIES), default="world",
                       help="with --crossover: what changes, the world size (2 to 1e6 ranks, --world unused) or "
                       "a rank's MTBF (0.01 to 1e8 hours, --mtbf-hours unused)")
    scale.add_argument("--json", action="store_true", help="print the prediction as one JSON line")


def cmd_scale(args: argparse.Namespace) -> int:
    """``workbench scale``: predict and print."""
    from workbench.strategies.scale.costs import Costs, load_costs
    from workbench.strategies.scale.predict import predict

    laws = load_costs(args.costs) if args.costs else {}
    given = {name: getattr(args, name) for name in COSTS if getattr(args, name) is not None}
    costs = replace(laws.get(args.strategy, Costs()), **given)
    options = {name: getattr(args, name) for name in ("job_mtbf_hours", "node_mtbf_hours", "interval_s",
                                                      "spares") if getattr(args, name) is not None}
    options.update(regrow=args.regrow, ranks_per_node=args.ranks_per_node, weibull_shape=args.weibull_shape,
                   interval_rule=args.interval_rule, replacement_s=args.replacement_s,
                   replica_ranks=args.replica_ranks, params=args.params, job_hours=args.job_hours,
                   batch_per_rank=args.batch_per_rank)
    if args.crossover:
        return _crossover(args, costs, replace(laws.get(args.crossover, Costs()), **given), options)
    result = predict(args.strategy, args.world, args.mtbf_hours, costs=costs, method=args.method, seed=args.seed,
                     **options)
    if args.json:
        print(json.dumps(result.to_dict()))
        return 0
    interval = "none" if result.interval_s is None else f"{result.interval_s:.1f} s"
    print(f"strategy: {result.strategy}  world: {result.world}  job MTBF: {result.job_mtbf_s:.1f} s  "
          f"({result.method}{'' if result.first_order else '; beyond first order'})")
    print(f"effective training time: {100 * result.effective:.2f} %")
    print(f"over {args.job_hours:g} h: {result.failures:.1f} failures, {result.steps_redone:.1f} steps redone, "
          f"{result.spares_used:.1f} spares used, final world {result.final_world:.1f}")
    print(f"samples lost per hour: {result.samples_lost_per_hour:.2f}  checkpoint interval: {interval}")
    return 0


def _crossover(args: argparse.Namespace, costs: Any, other_costs: Any, options: dict[str, Any]) -> int:
    """``--crossover OTHER``: the world size (or a rank's MTBF) where the two strategies' effective training times
    cross, by bisection on the closed form; the costs given on the command line apply to both."""
    from workbench.base.errors import ConfigError
    from workbench.strategies.scale.predict import crossover

    if options.get("job_mtbf_hours") is not None:
        raise ConfigError("job_mtbf_hours", "--crossover takes a rank's MTBF (--mtbf-hours): a job's MTBF changes "
                          "with the world size")
    vary, low, high = VARIES[args.vary]
    fixed = {"world": args.world, "mtbf_hours": args.mtbf_hours, **options}
    fixed.pop(vary)
    at = crossover(args.strategy, args.crossover, vary=vary, low=low, high=high, costs=costs,
                   b_costs=other_costs, **fixed)
    if args.json:
        print(json.dumps({"strategy": args.strategy, "other": args.crossover, "vary": vary, "low": low,
                          "high": high, "crossover": at}))
        return 0
    if at is None:
        print(f"{args.strategy} and {args.crossover} do not cross for {vary} in [{low:g}, {high:g}]")
        return 0
    below, above = (_ahead(args.strategy, args.crossover, vary, x, fixed, costs, other_costs)
                    for x in (max(low, at / 1.5), min(high, at * 1.5)))
    print(f"{args.strategy} and {args.crossover} cross at {vary} = {at:.6g}: {below} ahead below it, {above} above")
    return 0


def _ahead(a: str, b: str, vary: str, value: float, fixed: dict[str, Any], costs: Any, other_costs: Any) -> str:
    """Which of ``a`` and ``b`` has the higher effective training time at ``vary`` = ``value`` (closed form)."""
    from workbench.strategies.scale.predict import predict

    options = {**fixed, vary: int(round(value)) if vary == "world" else value}
    mine = predict(a, method="closed", costs=costs, **options).effective
    return a if mine > predict(b, method="closed", costs=other_costs, **options).effective else b
