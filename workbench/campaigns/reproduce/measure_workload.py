"""Measure a workload of the registry's ``workloads`` for its acceptance (:mod:`~.acceptance`): its failure-free
runs on tuning seeds at the registered world size and budget. Prints one JSON line, the ``measured`` block to
register under the entry (with its ``campaign_runs`` and ``source``)::

    python -m workbench.campaigns.reproduce.measure_workload mnist1d_cnn_3000 --seeds 0-5

Bad input (an unknown workload, a seed outside the tuning range) is one line and exit 2; Ctrl-C exit 130.
"""

from __future__ import annotations

import json

from workbench.base.entry import OneLineParser, answer
from workbench.campaigns.reproduce import registry
from workbench.campaigns.reproduce.acceptance import WorkloadRefused, measure


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(prog="python -m workbench.campaigns.reproduce.measure_workload",
                           description=__doc__.split("\n")[0])
    parser.add_argument("name", help="a workload of the registry's workloads")
    parser.add_argument("--seeds", default="0-5", help="tuning seeds, FIRST-LAST (default 0-5)")
    args = parser.parse_args(argv)
    return answer("measure_workload", lambda: _measure(args.name, args.seeds), process=argv is None)


def _measure(name: str, seeds_text: str) -> int:
    token = registry.MEASURING.set(True)  # the entry being measured has no figures yet
    try:
        reg = registry.load()
        if name not in reg.workloads:
            raise WorkloadRefused(f"no workload {name!r}; registered: {', '.join(reg.workloads) or 'none'}")
        low, _, high = seeds_text.partition("-")
        if not (low.isdigit() and (high.isdigit() or not high)):
            raise WorkloadRefused(f"--seeds {seeds_text!r}: give FIRST-LAST, e.g. 0-5")
        seeds = list(range(int(low), int(high or low) + 1))
        measured = measure(reg.workloads[name]["settings"], seeds, reg.tuning_seeds)
    finally:
        registry.MEASURING.reset(token)
    print(json.dumps({"workload": name, "measured": measured}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
