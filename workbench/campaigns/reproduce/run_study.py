"""Run a registered study at the paper scale without its notebook: the campaign of registry entry ``KEY`` (a paper's
later study, e.g. ``ccgrid22_study2``; its paper's campaign module runs it) on reporting seeds drawn at run time into
``--out``, its verdict saved there with the figures and the per-run table, and its record written into the archive
(commit it)::

    python -m workbench.campaigns.reproduce.run_study ccgrid22_study2 --out runs/reproduce/ccgrid22_study2

Resumable (the same ``--out`` reuses every finished run, on the same seeds). Prints the verdict; exit 0 when it
holds, 1 when it does not or is inconclusive, 2 in one line for bad input, 130 on Ctrl-C.
"""

from __future__ import annotations

import importlib
import sys
from typing import Any

from workbench.base.entry import OneLineParser, answer
from workbench.base.errors import WorkbenchError


class StudyRefused(WorkbenchError):
    """A key that is no registered study whose campaign takes ``entry``."""


def module_of(key: str) -> Any:
    """The campaign module that runs registry entry ``key``: its paper's, which must take ``entry``."""
    import inspect

    from workbench.campaigns.reproduce import registry

    reg = registry.load()
    if key not in reg.papers:
        raise StudyRefused(f"no registry entry {key!r}; registered: {', '.join(reg.papers)}")
    module = importlib.import_module(f"workbench.campaigns.reproduce.{reg.campaign_of(key)}")
    if "entry" not in inspect.signature(module.campaign).parameters:
        raise StudyRefused(f"{key!r}: its campaign ({module.__name__}) runs its own registration only; run its "
                           "notebook")
    return module


def run(key: str, out: str) -> int:
    """The paper-scale campaign of ``key`` into ``out``, decided and saved; 0 when its verdict holds."""
    from workbench.campaigns.reproduce.common import HOLDS

    module = module_of(key)
    frame = module.campaign("paper", out, entry=key)
    verdict = module.verdict(frame, "paper", entry=key)
    figures = [draw(frame) for draw in (getattr(module, "figure", None), getattr(module, "curve", None)) if draw]
    path = verdict.save(out, figures=figures, table=frame)
    print(verdict.summary())
    print(f"verdict: {path}")
    return 0 if verdict.status == HOLDS else 1


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(prog="python -m workbench.campaigns.reproduce.run_study", description=__doc__.split("\n")[0])
    parser.add_argument("key", help="a registry entry, e.g. ccgrid22_study2")
    parser.add_argument("--out", default=None, help="the campaign's folder (default runs/reproduce/KEY)")
    args = parser.parse_args(argv)
    out = args.out or f"runs/reproduce/{args.key}"
    return answer("run_study", lambda: run(args.key, out), process=argv is None)


if __name__ == "__main__":
    sys.exit(main())
