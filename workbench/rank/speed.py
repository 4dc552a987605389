"""The host-speed probe of the rank clock (``speed_probe``): a fixed piece of a rank's kind of work — small
matrix products and Python — whose thread CPU time says how fast this core runs *now*. A rank runs it every
:data:`EVERY_S` of its CPU and scales its CPU time by ``reference / probe`` (:mod:`workbench.rank.channel`), so a
host that slows down (a busy neighbour on the same physical core, frequency, cache refills after a switch) does
not slow the rank clock. The reference is the same probe on one idle core, measured once per machine
(:func:`workbench.base.machine.probe_us`). Model and evidence: docs/concepts.md ("Two clocks").
"""

from __future__ import annotations

import statistics
import sys
import time

EVERY_S = 0.025  # a probe after each 25 ms of a rank's CPU (a probe is ~0.5 ms: ~2 % of the wall time)
KEEP = 15  # the speed is the lower quartile of the last KEEP probes
_ROUNDS = 8
_operands: list = []


def probe() -> float:
    """Thread CPU seconds of one fixed probe: 8 rounds of a 64x256 by 256x64 product, its ReLU and 200 Python
    multiply-adds."""
    import torch

    if not _operands:
        generator = torch.Generator().manual_seed(0)
        _operands.extend((torch.randn(64, 256, generator=generator), torch.randn(256, 64, generator=generator)))
    a, b = _operands
    started = time.thread_time()
    for _ in range(_ROUNDS):
        torch.mm(a, b).relu_()
        total = 0
        for k in range(200):
            total += k * k
    return time.thread_time() - started


def lower_quartile(values: list[float]) -> float:
    """The lower quartile of ``values`` (not empty): a probe that was switched out mid-way reads slow, not fast."""
    return statistics.quantiles(values, n=4)[0] if len(values) > 1 else values[0]


def calibrate(rounds: int = 300) -> float:
    """Microseconds of one probe on this (idle, pinned) core: the lower quartile of ``rounds`` probes."""
    import torch

    torch.set_num_threads(1)  # as a rank runs
    for _ in range(10):
        probe()  # warm: the first calls pay for loading kernels
    return lower_quartile([probe() for _ in range(rounds)]) * 1e6


def main(argv: list[str] | None = None) -> int:
    """``python -m workbench.rank.speed [ROUNDS]``: print :func:`calibrate`'s microseconds; a ROUNDS that is no
    integer >= 1 is refused in one line, exit 2; Ctrl-C exits 130."""
    from workbench.base.entry import OneLineParser, answer, positive_int

    parser = OneLineParser(prog="python -m workbench.rank.speed", description="Microseconds of one speed probe "
                           "on this core (run it pinned to an idle one).")
    parser.add_argument("rounds", nargs="?", type=positive_int, default=300, help="probes to take (default 300)")
    args = parser.parse_args(argv)

    def work() -> int:
        print(round(calibrate(args.rounds), 2))
        return 0

    return answer("speed", work, process=argv is None)


if __name__ == "__main__":
    sys.exit(main())
