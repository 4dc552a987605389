"""Command line verbs on files: ``workbench flip | compare | verify`` (checkpoint alteration, JPDC'24).

Each checks its files first (:mod:`workbench.base.h5files`) and answers a bad one — missing, empty, text, truncated
HDF5, a directory, a workbench file of another kind, an output place that cannot take the output — in one line
on stderr with exit 2 (:func:`workbench.launch.cli.main` prints every :class:`~workbench.base.errors.WorkbenchError`
so). ``flip`` validates everything before it writes: a refused flip leaves no file at ``--out`` and no ``--log``.
"""

from __future__ import annotations

import argparse
import functools
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from workbench.base.errors import WorkbenchError
from workbench.base.h5files import reason


class FlipUsage(WorkbenchError):
    """Options of ``workbench flip`` that do not go together."""


def add_file_parsers(sub: Any) -> None:
    """The ``flip``, ``compare`` and ``verify`` sub-commands."""
    flip = sub.add_parser("flip", help="flip bits in an HDF5 checkpoint (checkpoint alteration)",
                          description="Flip IEEE-754 bits (LSB-0: fp32 bit 31 = sign, 30..23 exponent) in a "
                          "checkpoint. Everything is checked before anything is written; the altered file is "
                          "renamed into place after the log is written.")
    flip.add_argument("checkpoint", type=Path)
    flip.add_argument("--dataset", action="append", help="dataset path, e.g. model/fc1.weight (repeatable)")
    flip.add_argument("--index", type=int, help="flat element index (exact flip)")
    flip.add_argument("--bit", type=int, help="bit to flip, LSB-0 (exact flip)")
    flip.add_argument("--count", type=int, help="random flips: this many elements")
    flip.add_argument("--probability", type=float, help="random flips: each element with this probability")
    flip.add_argument("--bits", help="random flips: bit range 23-30 or list 0,5,31")
    flip.add_argument("--field", choices=["sign", "exponent", "mantissa"], help="random flips: bits of a field")
    flip.add_argument("--burst", type=int, default=1, help="flip this many adjacent bits upwards")
    flip.add_argument("--seed", type=int)
    flip.add_argument("--out", type=Path, help="write the altered copy here (default: alter in place)")
    flip.add_argument("--log", type=Path, help="write the flip log (JSON lines) here, for replay")
    compare = sub.add_parser("compare", help="compare two HDF5 checkpoints dataset by dataset",
                             description="Per dataset: values changed, max |diff|, L2 distance. Files of other "
                             "kinds, or with datasets only in either or of another shape, exit 2 naming them.")
    compare.add_argument("a", type=Path)
    compare.add_argument("b", type=Path)
    compare.add_argument("--partial", action="store_true", help="compare the datasets both files hold alike and "
                         "list the others, instead of refusing files that differ in their datasets")
    compare.add_argument("--json", action="store_true")
    verify = sub.add_parser("verify", help="check datasets against their checksums (exit 1 if any fails)",
                            description="Check a checkpoint's datasets against their SHA-256 attributes: exit 0 "
                            "intact, 1 altered; 2 for a file that is no checkpoint (a result.h5 included).")
    verify.add_argument("checkpoint", type=Path)


def file_errors(command: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """Run a verb; an ``OSError`` that got past the checks becomes one line (a WorkbenchError: exit 2)."""
    @functools.wraps(command)
    def run(args: argparse.Namespace) -> int:
        try:
            return command(args)
        except OSError as exc:
            where = exc.filename if exc.filename is not None else "a file"
            raise WorkbenchError(f"{where}: {reason(exc)}") from None
    return run


def cmd_flip(args: argparse.Namespace) -> int:
    from workbench.faults.bitflip import parse_bits
    from workbench.faults.hdf5 import alter_checkpoint

    exact = args.index is not None or args.bit is not None
    if exact and (args.count is not None or args.probability is not None):
        raise FlipUsage("give either --index/--bit (exact) or --count/--probability (random), not both")
    if not exact and args.count is None and args.probability is None:
        raise FlipUsage("nothing to flip: give --index and --bit, or --count or --probability")
    flips = alter_checkpoint(args.checkpoint, datasets=args.dataset, index=args.index, bit=args.bit,
                             count=args.count, probability=args.probability,
                             bits=parse_bits(args.bits) if args.bits else None, field=args.field, burst=args.burst,
                             seed=args.seed, out=args.out, log=args.log)
    for f in flips[:20]:
        print(f"{f.target}[{f.index}] bits {','.join(map(str, f.bits))}: {f.old!r} -> {f.new!r}")
    if len(flips) > 20:
        print(f"... {len(flips) - 20} more")
    print(f"{len(flips)} flips in {args.out or args.checkpoint}" + (f"; log: {args.log}" if args.log else ""))
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    from workbench.faults.hdf5 import compare_checkpoints

    rows = compare_checkpoints(args.a, args.b, strict=not args.partial)
    if args.json:
        print(json.dumps(rows))
        return 0
    for row in rows:
        if row["changed"] is None:
            print(f"{row['dataset']}: {row['note']}")
        else:
            print(f"{row['dataset']}: {row['changed']} changed, max |diff| {row['max_abs_diff']:.6g}, "
                  f"L2 {row['l2']:.6g}")
    common = [r for r in rows if r["changed"] is not None]
    apart = len(rows) - len(common)
    print("total: " + (f"{sum(r['changed'] for r in common)} values changed in {len(common)} datasets" if common
                       else "no dataset in common")
          + (f"; {apart} datasets not compared (only in one file, or of another shape)" if apart else ""))
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    from workbench.base import checkpoint

    bad = checkpoint.verify(args.checkpoint)  # FileKindError (exit 2) for a file that is no checkpoint
    for name in bad:
        print(f"checksum mismatch: {name}")
    print(f"{args.checkpoint}: {'CORRUPT' if bad else 'ok'} ({len(bad)} of "
          f"{len(checkpoint.datasets(args.checkpoint))} datasets fail)")
    return 1 if bad else 0
