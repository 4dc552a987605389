"""Check the ``workbench`` package's module docstrings: short, and about this repository only.

A module's docstring says what the module is and its protocol in a few lines; history, measurements and the
protocol in detail belong in the documentation (docs/internals.md, docs/benchmarks.md). Offenders: a module
docstring longer than 10 lines (counted from its opening quotes to its closing ones), or one that mentions a
design document users do not have (``DESIGN``, ``§``). Standard library only; run by ``make lint`` and
``tests/test_docstrings.py``. Usage: ``python tools/check_docstrings.py [PACKAGE_DIR]`` (default: this
repository's ``workbench/``); exit 0 with a one-line summary, else exit 1 listing every offender.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

MAX_LINES = 10
FORBIDDEN = ("DESIGN", "§")
DEFAULT_ROOT = Path(__file__).resolve().parent.parent / "workbench"


def module_docstring(source: str) -> tuple[str, int] | None:
    """The module's docstring and the number of lines it spans in the source, or None when it has none."""
    body = ast.parse(source).body
    if not body or not isinstance(body[0], ast.Expr):
        return None
    node = body[0].value
    if not (isinstance(node, ast.Constant) and isinstance(node.value, str)):
        return None
    return node.value, node.end_lineno - node.lineno + 1


def offenders(root: Path) -> list[str]:
    """One line per problem of every module docstring under ``root``, as ``path: what is wrong``."""
    problems = []
    for path in sorted(root.rglob("*.py")):
        found = module_docstring(path.read_text(encoding="utf-8"))
        if found is None:
            continue
        text, lines = found
        name = path.relative_to(root.parent)
        if lines > MAX_LINES:
            problems.append(f"{name}: module docstring of {lines} lines (at most {MAX_LINES}: "
                            "move the detail to docs/)")
        for word in FORBIDDEN:
            if word in text:
                problems.append(f"{name}: module docstring mentions {word!r} (a design document users do not have: "
                                "say the reason itself, or point at a docs/ page)")
    return problems


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    root = Path(args[0]) if args else DEFAULT_ROOT
    if not root.is_dir():
        print(f"check_docstrings: {root} is not a directory", file=sys.stderr)
        return 2
    problems = offenders(root)
    if problems:
        print("\n".join(problems))
        return 1
    count = sum(1 for _ in root.rglob("*.py"))
    print(f"check_docstrings: {count} modules of {root.name}/, every module docstring at most {MAX_LINES} lines")
    return 0


if __name__ == "__main__":
    sys.exit(main())
