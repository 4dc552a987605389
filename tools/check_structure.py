"""Check the shape of the ``workbench`` package: no import circles, and rooms of a size a reader holds in mind.

Two checks, standard library only (``ast``), run by ``make lint`` and ``tests/test_structure.py``:

1. **No import cycles** (:func:`find_cycles`). The graph has one node per module of the package (``a/b.py`` is
   ``pkg.a.b``, ``a/__init__.py`` is ``pkg.a``) and an edge for every import of another module of the package,
   wherever it stands: at the top, inside a function, or under ``if TYPE_CHECKING:`` (an import for the type
   checker still couples the two modules). ``import pkg.a.b`` is an edge to ``pkg.a.b``; ``from pkg.a import x``
   is an edge to ``pkg.a`` and, when ``pkg.a.x`` is a module, to ``pkg.a.x`` as well. Relative forms
   (``from . import x``, ``from ..a import y``) are resolved against the importing module. ``import pkg.a.b``
   adds no edge to the parent packages ``pkg`` and ``pkg.a``, so a package ``__init__`` may import its own
   submodules; it is a cycle only when one of them imports back from the ``__init__`` (``from pkg import x``,
   also when ``x`` is a submodule, counts as that); a module naming itself (``from . import x`` in an
   ``__init__``) is no edge. Every strongly connected component of more than one module is reported as cycles
   through all its modules, each printed ``a -> b -> a``.
2. **Sizes** (:func:`oversized`). A module may have at most 400 lines and a function or method at most 80 (its
   ``def`` line to its last line, docstring included; a nested function counts in its parent and on its own).
   A module or function that must stay one piece says so in its docstring with the marker ``One piece:``
   followed by the reason, e.g. ``One piece: the step's phases share twelve locals; split, they would travel
   as a bag.`` The marker in a module's docstring exempts the module's line count only, not its functions.

Usage: ``python tools/check_structure.py [PACKAGE_DIR]`` (default: this repository's ``workbench/``). Exit 0
with a one-line summary when both checks pass; exit 1 listing every cycle and every oversized module or
function otherwise.
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

MARKER = "One piece:"
MAX_LINES = 400
MAX_FUNCTION = 80
DEFAULT_ROOT = Path(__file__).resolve().parent.parent / "workbench"


def modules(root: Path) -> dict[str, Path]:
    """Module name -> file for every ``.py`` file below the package directory ``root`` (itself a module name)."""
    root = Path(root)
    found = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _imported(name: str, path: Path, node: ast.AST, known: dict[str, Path]) -> set[str]:
    """The modules of ``known`` that the import statement ``node`` in module ``name`` (file ``path``) loads."""
    if isinstance(node, ast.Import):
        return {alias.name for alias in node.names if alias.name in known}
    if not isinstance(node, ast.ImportFrom):
        return set()
    base = node.module or ""
    if node.level:
        package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        if node.level > 1:
            package = package[: len(package) - (node.level - 1)]
        base = ".".join([*package, base] if base else package)
    targets = set()
    for alias in node.names:
        submodule = f"{base}.{alias.name}"
        if submodule in known:
            targets.add(submodule)
        if base in known:
            targets.add(base)
    return targets


def import_graph(root: Path) -> dict[str, set[str]]:
    """Module -> the package's modules it imports (every import statement of the file, see the module doc)."""
    known = modules(root)
    graph: dict[str, set[str]] = {}
    for name, path in known.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        graph[name] = set()
        for node in ast.walk(tree):
            graph[name] |= _imported(name, path, node, known) - {name}  # ``from . import x`` in an __init__
    return graph


def _components(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components (Tarjan's algorithm, iterative), each sorted, in sorted order."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                found.append(sorted(component))
    return sorted(found)


def _path(graph: dict[str, set[str]], members: set[str], source: str, target: str) -> list[str]:
    """The shortest import path ``[source, ..., target]`` inside ``members`` (breadth-first; one exists: they are
    strongly connected)."""
    previous: dict[str, str] = {}
    frontier = [source]
    while frontier:
        following = []
        for node in frontier:
            for child in sorted(graph[node] & members):
                if child in previous:
                    continue
                previous[child] = node
                if child == target:
                    path = [target]
                    while path[-1] != source or len(path) == 1:
                        path.append(previous[path[-1]])
                    return path[::-1]
                following.append(child)
        frontier = following
    raise ValueError(f"no path from {source} to {target}")


def find_cycles(root: Path) -> list[list[str]]:
    """Every import cycle of the package at ``root`` as a closed path ``[a, b, ..., a]``; empty when there is none.

    Per strongly connected component of more than one module: the shortest cycle through each of its modules
    (in name order) that is not on a cycle reported before, so every module of the component is on one."""
    graph = import_graph(root)
    cycles = []
    for component in (c for c in _components(graph) if len(c) > 1):
        members = set(component)
        uncovered = set(component)
        for module in component:
            if module in uncovered:
                cycle = _path(graph, members, module, module)
                cycles.append(cycle)
                uncovered -= set(cycle)
    return cycles


def _exempt(node: ast.Module | ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """Whether the docstring of ``node`` says ``One piece:`` and gives a reason after it."""
    return bool(re.search(re.escape(MARKER) + r"\s*\S", ast.get_docstring(node, clean=False) or ""))


def oversized(root: Path, max_lines: int = MAX_LINES, max_function: int = MAX_FUNCTION) -> list[str]:
    """Every module over ``max_lines`` lines and every function over ``max_function`` lines that does not carry
    the ``One piece:`` marker in its docstring, as ``path: N lines > MAX`` / ``path:LINE name: N lines > MAX``."""
    root = Path(root)
    problems = []
    for path in modules(root).values():
        text = path.read_text(encoding="utf-8")
        tree = ast.parse(text, filename=str(path))
        where = path.relative_to(root.parent)
        lines = len(text.splitlines())
        if lines > max_lines and not _exempt(tree):
            problems.append(f"{where}: {lines} lines > {max_lines} (split it, or say why in '{MARKER} ...')")
        functions = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
        for node in sorted(functions, key=lambda n: n.lineno):
            length = (node.end_lineno or node.lineno) - node.lineno + 1
            if length > max_function and not _exempt(node):
                problems.append(f"{where}:{node.lineno} {node.name}: {length} lines > {max_function} "
                                f"(split it, or say why in '{MARKER} ...')")
    return problems


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    root = Path(args[0]) if args else DEFAULT_ROOT
    if not (root / "__init__.py").is_file():
        print(f"check_structure: {root} is not a package directory (no __init__.py)", file=sys.stderr)
        return 2
    cycles = find_cycles(root)
    sizes = oversized(root)
    for cycle in cycles:
        print(f"import cycle: {' -> '.join(cycle)}")
    for problem in sizes:
        print(f"too large: {problem}")
    if cycles or sizes:
        print(f"check_structure: {len(cycles)} import cycle(s), {len(sizes)} oversized module(s)/function(s)")
        return 1
    graph = import_graph(root)
    lengths = {name: len(path.read_text(encoding="utf-8").splitlines()) for name, path in modules(root).items()}
    largest = max(lengths, key=lambda name: lengths[name])
    print(f"check_structure OK: {len(graph)} modules, {sum(map(len, graph.values()))} import edges, no cycles; "
          f"largest module {largest} ({lengths[largest]} lines)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
