"""Check the shape of the ``workbench`` package: no import circles, no forbidden reach, no private names across
modules, classes whole in one file, and functions of a size a reader holds in mind.

Standard library only (``ast``), run by ``make lint`` and ``tests/test_structure.py``:

1. **No import cycles** (:func:`find_cycles`). The graph (:func:`import_graph`) has one node per module
   (``a/b.py`` is ``pkg.a.b``, ``a/__init__.py`` is ``pkg.a``) and an edge for every import of another module of
   the package, wherever it stands (top, function, ``if TYPE_CHECKING:``). ``import pkg.a.b`` is an edge to
   ``pkg.a.b``; ``from pkg.a import x`` to ``pkg.a`` and, when ``pkg.a.x`` is a module, to it as well; relative
   forms resolve against the importer. Importing ``pkg.a.b`` runs the ``__init__`` of every package on its path,
   so it is an edge to ``pkg.a`` too, unless the importer lies inside ``pkg.a`` (that ``__init__`` already ran):
   a package ``__init__`` may import its own submodules, and a cycle through an ``__init__`` that imports more
   than its own rooms is found. A module naming itself is no edge. Each cycle is printed ``a -> b -> a``.
2. **Forbidden reach** (:func:`forbidden_edges`, :data:`FORBIDDEN`): code that runs in a rank process may not
   load, directly or through other modules, the doors (``launch``: the session, the CLI, the Lab panel, sweeps), the
   supervisor or the campaigns.
3. **No private names across modules** (:func:`private_imports`): ``from pkg.a import _x`` in another module
   (a name that is used elsewhere is public: drop the underscore, or move the code).
4. **A class lives whole in one file** (:func:`mixins`): no method annotates ``self: Any``, and no class is a
   mixin: a class that is a base of a class in another module while its methods read ``self.<attr>`` that neither
   it nor its bases in the package set (``self.x = ...`` in a method, an assignment or ``def`` in the class body, a
   field of a dataclass; a bare annotation declares, it sets nothing). Such a class is part of another one spread
   over files: fold it in, or make it an object with its own state that the other holds. A class with a base from
   outside the package (other than ``object``/``Generic``/``ABC``) may get attributes from it: not judged.
5. **Sizes** (:func:`oversized`): a function or method at most 80 lines (``def`` line to last line; a nested
   function counts in its parent and on its own) unless its docstring says ``One piece:`` and why. A module over
   1000 lines is reported too, with no marker to excuse it: a smell detector for a module holding more than one
   concept (what a module holds cannot be checked; its docstring says it, and review judges it).
6. **A short top floor** (:func:`crowded_top`): the package directory holds at most :data:`MAX_TOP` entries
   (modules and packages, ``__init__.py`` and ``__main__.py`` counted, ``__pycache__`` and dot-files not): the
   floor plan a reader takes in at a glance (docs/concepts.md, "Floor plan").
8. **Layers** (:func:`layered`, :data:`LAYERS`, :data:`BACK_EDGES`): every module of ``workbench`` lies on one
   floor, named from the ground up; an import points down or along its floor, never up, unless it is one of the
   named back edges, each with its reason (a stale one, whose import is gone, is reported too: the list only
   shrinks). An import under ``if TYPE_CHECKING:`` loads nothing and does not count; neither does one of a package
   ``__init__`` that imports nothing. The floor plan of docs/concepts.md is printed from the same table
   (``--floor-plan``), and a test holds the two equal. Two packages that import each other (outside the back
   edges) are reported unless listed in :data:`TWO_WAY_PACKAGES`, which is empty: each package is one floor.
7. **Names compared in their room only** (:func:`compared_names`, :data:`ROOMS`): a fault kind, a run event's
   kind, a model or a dataset, a parallel mode is an object registered in one module (``faults/kinds.py``,
   ``faults/events.py``, ``workloads/``, ``base/modes.py``); code elsewhere asks the object, it never compares
   the name (``fault.kind == "kill"``, ``config.model in ("alexnet", "vgg11")``, ``config.parallelism ==
   "gossip"``). A comparison counts where a side is one of the names and another side speaks of that thing (its
   words: ``kind``, ``model``, ``parallelism``, ...); ``kind == "step"`` on a bare ``kind`` that is a protocol
   message's is dispatch, not a fault. The names are read from the registries (the one rule that
   imports the package; a package without them is not judged).

Usage: ``python tools/check_structure.py [PACKAGE_DIR]`` (default: this repository's ``workbench/``). Exit 0
with a one-line summary when every check passes; exit 1 listing every problem otherwise.
``python tools/check_structure.py --floor-plan`` prints the floors as markdown (docs/concepts.md's floor plan).
"""

from __future__ import annotations

import ast
import fnmatch
import re
import sys
from dataclasses import dataclass
from pathlib import Path

MARKER = "One piece:"
MAX_LINES = 1000  # a smell detector, not a design rule: see the module docstring
MAX_FUNCTION = 80
MAX_TOP = 12  # entries on the package's top floor
DEFAULT_ROOT = Path(__file__).resolve().parent.parent / "workbench"
# (modules, the modules they may not reach, why): names relative to the package, ``fnmatch`` patterns; a
# forbidden name covers its submodules
FORBIDDEN = [
    (("rank", "rank.*"), ("launch", "supervisor", "campaigns"), "code that runs in a rank process"),
]

# The floors of ``workbench``, from the ground up: (name, what lives there, module patterns relative to the
# package). A module takes the first floor naming it exactly, else the first whose pattern matches it. Each package
# is one floor.
LAYERS: list[tuple[str, str, tuple[str, ...]]] = [
    ("floor", "errors, callables, setting types, entry points' answers and interrupts, the parallel modes, the rank "
     "protocol, fallbacks, the HDF5 files and checkpoints, the machine, hosts files, Slurm's commands, process "
     "start and reaping: leaves every package may use", ("base", "base.*")),
    ("workloads", "models, data sets, architectures, pipeline stages, apoptosis's surgery and rule",
     ("workloads", "workloads.*")),
    ("strategies", "the recovery strategies as objects, the peers' names, the scale model of their costs",
     ("strategies", "strategies.*")),
    ("faults", "fault kinds, specs and primitives; the run's event kinds", ("faults", "faults.*")),
    ("config", "RunConfig and each setting, the device choice, the checks before a run, the resizing rules",
     ("config", "config.*")),
    ("results", "RunResult, the output folder, summaries, clocks, provenance, tracking, plots",
     ("results", "results.*")),
    ("rank", "inside a rank process, the peers' rank side included", ("rank", "rank.*")),
    ("supervisor", "the parent of the ranks: the rank template that starts them, the peers' supervisor side",
     ("supervisor", "supervisor.*")),
    ("doors", "workbench.run/start, the CLI, the Lab panel, a Slurm allocation's hosts, sweeps and their report",
     ("", "__main__", "launch", "launch.*")),
    ("campaigns", "the seed papers' reproductions and the injection studies, built on the rest",
     ("campaigns", "campaigns.*")),
]
# (importer, imported) -> why the import points up (names relative to the package)
BACK_EDGES: dict[tuple[str, str], str] = {}  # none today: the core imports nothing of campaigns/
# package pairs that may import each other both ways, outside BACK_EDGES: none (a pair is refused)
TWO_WAY_PACKAGES: set[tuple[str, str]] = set()


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


def _packages_run(importer: str, target: str, known: dict[str, Path]) -> set[str]:
    """The package ``__init__`` modules that importing ``target`` runs, less those the importer lies inside."""
    parts = target.split(".")
    outer = (".".join(parts[:i]) for i in range(1, len(parts)))
    return {p for p in outer if p in known and importer != p and not importer.startswith(p + ".")}


def _imports(root: Path) -> dict[str, list[tuple[ast.AST, set[str]]]]:
    """Module -> its import statements, each with the modules of the package it loads."""
    known = modules(root)
    found: dict[str, list[tuple[ast.AST, set[str]]]] = {}
    for name, path in known.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        found[name] = []
        for node in ast.walk(tree):
            targets = _imported(name, path, node, known)
            for target in list(targets):
                targets |= _packages_run(name, target, known)
            if targets - {name}:  # ``from . import x`` in an __init__ names itself
                found[name].append((node, targets - {name}))
    return found


def import_graph(root: Path) -> dict[str, set[str]]:
    """Module -> the package's modules it imports (every import statement of the file, see the module doc)."""
    return {name: set().union(*(targets for _, targets in statements))
            for name, statements in _imports(root).items()}


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


def _reach(graph: dict[str, set[str]], source: str) -> dict[str, str]:
    """Every module ``source`` loads, directly or not -> the module that imports it on a shortest path."""
    previous: dict[str, str] = {}
    frontier = [source]
    while frontier:
        following = []
        for node in frontier:
            for child in sorted(graph[node]):
                if child != source and child not in previous:
                    previous[child] = node
                    following.append(child)
        frontier = following
    return previous


def forbidden_edges(root: Path, rules: list[tuple[tuple[str, ...], tuple[str, ...], str]] | None = None) -> list[str]:
    """Every module that reaches one it may not (:data:`FORBIDDEN`), as ``a reaches b (why): a -> ... -> b``."""
    graph = import_graph(root)
    package = Path(root).name
    problems = []
    for sources, targets, why in FORBIDDEN if rules is None else rules:
        for module in sorted(graph):
            relative = module[len(package) + 1:]
            if not any(fnmatch.fnmatchcase(relative, pattern) for pattern in sources):
                continue
            previous = _reach(graph, module)  # in breadth-first order: the first match is the nearest
            for target in targets:
                reached = next((r for r in previous if r == f"{package}.{target}"
                                or r.startswith(f"{package}.{target}.")), None)
                if reached is None:
                    continue
                path = [reached]
                while path[-1] != module:
                    path.append(previous[path[-1]])
                problems.append(f"{module} reaches {reached} ({why} may not): {' -> '.join(path[::-1])}")
    return problems


def _type_only(tree: ast.Module) -> set[int]:
    """The ids of the nodes under an ``if TYPE_CHECKING:`` (their imports load nothing at run time)."""
    found: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            found |= {id(inner) for statement in node.body for inner in ast.walk(statement)}
    return found


def _loads_nothing(path: Path) -> bool:
    """A package ``__init__`` without imports: importing it loads no other module."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return path.name == "__init__.py" and not any(isinstance(n, (ast.Import, ast.ImportFrom)) for n in ast.walk(tree))


def runtime_edges(root: Path) -> set[tuple[str, str]]:
    """(importer, imported) of every import that loads a module at run time, names relative to the package: not
    under ``TYPE_CHECKING``, not of the package itself (already loaded), not of an ``__init__`` that imports nothing."""
    root = Path(root)
    known = modules(root)
    package = root.name
    empty = {name for name, path in known.items() if _loads_nothing(path)}
    edges = set()
    for name, path in known.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        skip = _type_only(tree)
        for node in ast.walk(tree):
            if id(node) in skip:
                continue
            for target in _imported(name, path, node, known) - {name, package} - empty:
                edges.add((name[len(package) + 1:], target[len(package) + 1:]))
    return edges


def floor_of(module: str, layers: list[tuple[str, str, tuple[str, ...]]]) -> int | None:
    """The index of ``module``'s floor (a name relative to the package; ``""`` is the package itself)."""
    for i, (_, _, patterns) in enumerate(layers):
        if module in patterns:
            return i
    for i, (_, _, patterns) in enumerate(layers):
        if any("*" in p and fnmatch.fnmatchcase(module, p) for p in patterns):
            return i
    return None


def layered(root: Path, layers: list | None = None, back_edges: dict | None = None,
            two_way: set | None = None) -> list[str]:
    """Imports that point up a floor (not in ``back_edges``), back edges that no longer exist, modules on no
    floor, and package pairs importing each other both ways outside ``back_edges`` and ``two_way``. The defaults
    (:data:`LAYERS`, :data:`BACK_EDGES`, :data:`TWO_WAY_PACKAGES`) hold for the ``workbench`` package only."""
    root = Path(root)
    if layers is None:
        if root.resolve() != DEFAULT_ROOT.resolve():
            return []
        layers, back_edges, two_way = LAYERS, BACK_EDGES, TWO_WAY_PACKAGES
    back_edges, two_way = back_edges or {}, two_way or set()
    edges = runtime_edges(root)
    names = ["" if m == root.name else m[len(root.name) + 1:] for m in modules(root)]
    problems = [f"{name or root.name} lies on no floor (add it to LAYERS)" for name in names
                if floor_of(name, layers) is None]
    for importer, imported in sorted(edges):
        low, high = floor_of(importer, layers), floor_of(imported, layers)
        if None not in (low, high) and high > low and (importer, imported) not in back_edges:
            problems.append(f"{importer} ({layers[low][0]}) imports {imported} ({layers[high][0]}): an import "
                            "that points up a floor (move the code, or name the back edge with its reason)")
    problems += [f"back edge {a} -> {b} is no import any more: remove it from BACK_EDGES" for a, b in back_edges
                 if (a, b) not in edges]
    packages = {(a.split(".")[0], b.split(".")[0]) for a, b in edges - set(back_edges) if a and b}
    pairs = {tuple(sorted(p)) for p in packages if p[0] != p[1] and p[::-1] in packages}
    problems += [f"packages {a} and {b} import each other (outside the back edges)" for a, b in sorted(pairs - two_way)]
    problems += [f"packages {a} and {b} no longer import each other: remove them from TWO_WAY_PACKAGES"
                 for a, b in sorted(two_way - pairs)]
    return problems


def floor_plan(layers: list | None = None, back_edges: dict | None = None) -> str:
    """The floors and back edges as markdown: docs/concepts.md's floor plan."""
    layers, back_edges = layers or LAYERS, BACK_EDGES if back_edges is None else back_edges
    lines = ["| Floor | What lives there | Modules |", "|---|---|---|"]
    for name, what, patterns in reversed(layers):
        shown = ", ".join(f"`{p or 'workbench'}`" for p in patterns)
        lines.append(f"| {name} | {what} | {shown} |")
    if not back_edges:
        lines += ["", "Imports point down or along a floor; none points up."]
    else:
        lines += ["", f"Imports point down or along a floor. The {len(back_edges)} that point up, each with its "
                  "reason:", ""]
        lines += [f"- `{a}` -> `{b}`: {why}" for (a, b), why in sorted(back_edges.items())]
    return "\n".join(lines) + "\n"


def private_imports(root: Path) -> list[str]:
    """Every ``from pkg.a import _x`` of a private name of another module, as ``path:LINE imports _x from pkg.a``."""
    root = Path(root)
    known = modules(root)
    problems = []
    for name, statements in _imports(root).items():
        where = known[name].relative_to(root.parent)
        for node, _ in statements:
            if not isinstance(node, ast.ImportFrom):
                continue
            private = [a.name for a in node.names if a.name.startswith("_") and not a.name.startswith("__")]
            source = "." * node.level + (node.module or "")
            problems += [f"{where}:{node.lineno} imports {p} from {source}" for p in private]
    return problems


def _exempt(node: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """Whether the docstring of ``node`` says ``One piece:`` and gives a reason after it."""
    return bool(re.search(re.escape(MARKER) + r"\s*\S", ast.get_docstring(node, clean=False) or ""))


def oversized(root: Path, max_lines: int = MAX_LINES, max_function: int = MAX_FUNCTION) -> list[str]:
    """Every module over ``max_lines`` lines, and every function over ``max_function`` lines that does not carry
    the ``One piece:`` marker in its docstring, as ``path: N lines > MAX`` / ``path:LINE name: N lines > MAX``."""
    root = Path(root)
    problems = []
    for path in modules(root).values():
        text = path.read_text(encoding="utf-8")
        tree = ast.parse(text, filename=str(path))
        where = path.relative_to(root.parent)
        lines = len(text.splitlines())
        if lines > max_lines:
            problems.append(f"{where}: {lines} lines > {max_lines} (more than one concept? say each in a module of "
                            "its own)")
        functions = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
        for node in sorted(functions, key=lambda n: n.lineno):
            length = (node.end_lineno or node.lineno) - node.lineno + 1
            if length > max_function and not _exempt(node):
                problems.append(f"{where}:{node.lineno} {node.name}: {length} lines > {max_function} "
                                f"(split it, or say why in '{MARKER} ...')")
    return problems


NEUTRAL_BASES = {"object", "Generic", "ABC"}  # bases from outside the package that give a class no attributes
Functions = (ast.FunctionDef, ast.AsyncFunctionDef)


def _dotted(node: ast.expr) -> str | None:
    """``a.b.C`` of a base expression (``Generic[T]``: ``Generic``); None for anything else."""
    if isinstance(node, ast.Subscript):
        return _dotted(node.value)
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        outer = _dotted(node.value)
        return None if outer is None else f"{outer}.{node.attr}"
    return None


def _bindings(name: str, path: Path, tree: ast.Module) -> dict[str, str]:
    """Names bound at a module's top by imports of the package -> what they are (``pkg.a`` or ``pkg.a.C``)."""
    bound = {}
    for node in tree.body:
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    bound[alias.asname] = alias.name
                else:
                    bound[alias.name.split(".")[0]] = alias.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
                package = package[: len(package) - (node.level - 1)]
                base = ".".join([*package, base] if base else package)
            for alias in node.names:
                bound[alias.asname or alias.name] = f"{base}.{alias.name}"
    return bound


def _self_name(method: ast.FunctionDef | ast.AsyncFunctionDef) -> str | None:
    """The name of a method's instance argument (None for a static or class method, or none at all)."""
    decorators = {_dotted(d) for d in method.decorator_list}
    positional = [*method.args.posonlyargs, *method.args.args]
    if decorators & {"staticmethod", "classmethod"} or not positional:
        return None
    return positional[0].arg


def _is_dataclass(node: ast.ClassDef) -> bool:
    return any((_dotted(d.func if isinstance(d, ast.Call) else d) or "").split(".")[-1] == "dataclass"
               for d in node.decorator_list)


def _own_attributes(node: ast.ClassDef) -> tuple[set[str], dict[str, int]]:
    """(what a class sets: its body's names, its dataclass fields, every ``self.x`` assigned in a method;
    every ``self.x`` its methods read -> the first line reading it; ``self.x += 1`` reads ``x``)."""
    sets: set[str] = set()
    reads: dict[str, int] = {}
    for item in node.body:
        if isinstance(item, (*Functions, ast.ClassDef)):
            sets.add(item.name)
        elif isinstance(item, ast.Assign):
            sets |= {n.id for target in item.targets for n in ast.walk(target) if isinstance(n, ast.Name)}
        elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
            if item.value is not None or _is_dataclass(node):
                sets.add(item.target.id)
    for method in (item for item in node.body if isinstance(item, Functions)):
        me = _self_name(method)
        if me is None:
            continue
        updated = {id(n.target) for n in ast.walk(method) if isinstance(n, ast.AugAssign)}  # ``self.x += 1`` reads
        for sub in ast.walk(method):
            if isinstance(sub, ast.Attribute) and isinstance(sub.value, ast.Name) and sub.value.id == me:
                if isinstance(sub.ctx, ast.Store) and id(sub) not in updated:
                    sets.add(sub.attr)
                elif not (sub.attr.startswith("__") and sub.attr.endswith("__")):
                    reads.setdefault(sub.attr, sub.lineno)
    return sets, reads


def mixins(root: Path) -> list[str]:
    """Every method annotated ``self: Any``, and every mixin (see the module doc), as ``path:LINE ...``."""
    root = Path(root)
    known = modules(root)
    classes: dict[str, tuple[ast.ClassDef, Path]] = {}  # "pkg.a.C" -> its node and file
    bases: dict[str, list[str | None]] = {}  # "pkg.a.C" -> each base in the package ("pkg.b.D"), None: opaque
    problems = []
    trees = {name: ast.parse(path.read_text(encoding="utf-8"), filename=str(path)) for name, path in known.items()}
    for name, tree in trees.items():
        where = known[name].relative_to(root.parent)
        for node in ast.walk(tree):
            if isinstance(node, Functions):
                first = [*node.args.posonlyargs, *node.args.args][:1]
                if first and first[0].arg == "self" and first[0].annotation is not None \
                        and _dotted(first[0].annotation) in ("Any", "typing.Any"):
                    problems.append(f"{where}:{node.lineno} {node.name}: 'self: Any' (a mixin's method: fold it "
                                    "into its class)")
        bound = _bindings(name, known[name], tree)
        local = {n.name for n in tree.body if isinstance(n, ast.ClassDef)}
        for node in (n for n in tree.body if isinstance(n, ast.ClassDef)):
            classes[f"{name}.{node.name}"] = (node, known[name])
            resolved: list[str | None] = []
            for base in node.bases:
                dotted = _dotted(base) or ""
                head, _, rest = dotted.partition(".")
                if dotted in local:
                    resolved.append(f"{name}.{dotted}")
                elif head in bound:
                    resolved.append(bound[head] + (f".{rest}" if rest else ""))
                elif dotted.split(".")[-1] not in NEUTRAL_BASES:
                    resolved.append(None)
            bases[f"{name}.{node.name}"] = resolved
    attributes = {qualified: _own_attributes(node) for qualified, (node, _) in classes.items()}

    def sets(qualified: str, seen: frozenset[str] = frozenset()) -> set[str] | None:
        """Everything a class and its bases set; None when a base is no class defined in the package (not judged:
        it may set anything)."""
        if qualified in seen:
            return set()
        found = set(attributes[qualified][0])
        for base in bases[qualified]:
            if base is None or base not in classes:
                return None
            inherited = sets(base, seen | {qualified})
            if inherited is None:
                return None
            found |= inherited
        return found

    for qualified, (node, path) in classes.items():
        module = qualified.rsplit(".", 1)[0]
        users = sorted(c for c, bs in bases.items() if qualified in bs and c.rsplit(".", 1)[0] != module)
        given = sets(qualified) if users else None
        if given is None:
            continue
        missing = {a: line for a, line in attributes[qualified][1].items() if a not in given}
        if missing:
            names = ", ".join(f"self.{a}" for a in sorted(missing, key=missing.get))
            problems.append(f"{path.relative_to(root.parent)}:{node.lineno} {node.name} reads {names}, which it "
                            f"never sets, and is a base of {', '.join(users)}: a mixin (fold it into its class, "
                            "or make it an object with its own state)")
    return problems


def crowded_top(root: Path, max_top: int = MAX_TOP) -> list[str]:
    """One problem naming the entries when the package directory ``root`` holds more than ``max_top`` of them."""
    root = Path(root)
    entries = sorted(p.name for p in root.iterdir() if p.name != "__pycache__" and not p.name.startswith("."))
    if len(entries) <= max_top:
        return []
    return [f"{root.name}/: {len(entries)} entries > {max_top} on the top floor (move some into a package): "
            f"{', '.join(entries)}"]


@dataclass(frozen=True)
class Room:
    """Where the names of one registry may be compared: ``names``, the words that mark a comparison as about them
    (``about``), the modules they live in (``home``: paths relative to the package's parent, a folder covering its
    files) and protocol message kinds a bare ``kind`` may be compared with (``messages``: dispatch)."""

    what: str
    names: frozenset[str]
    about: tuple[str, ...]
    home: tuple[str, ...]
    messages: frozenset[str] = frozenset()


def name_comparisons(path: Path, room: Room, root: Path) -> list[str]:
    """Every comparison in the file ``path`` of one of ``room``'s names with something about it, as
    ``path:LINE: source`` (``path`` relative to ``root``)."""
    source = path.read_text(encoding="utf-8")
    found = []
    for node in ast.walk(ast.parse(source, filename=str(path))):
        if not isinstance(node, ast.Compare):
            continue
        sides = [node.left, *node.comparators]
        for i, side in enumerate(sides):
            values = side.elts if isinstance(side, (ast.Tuple, ast.List, ast.Set)) else [side]
            names = {v.value for v in values if isinstance(v, ast.Constant) and v.value in room.names}
            if not names:
                continue
            others = [s for j, s in enumerate(sides) if j != i]
            text = " ".join(ast.get_source_segment(source, s) or "" for s in others)
            dispatch = all(isinstance(s, ast.Name) and s.id == "kind" for s in others) and names <= room.messages
            if any(word in text for word in room.about) and not dispatch:
                found.append(f"{path.relative_to(root)}:{node.lineno}: {ast.get_source_segment(source, node)}")
                break
    return found


def compared_names(root: Path, rooms: list[Room] | None = None) -> list[str]:
    """Every name of ``rooms`` (default: the package's registries, :func:`registered_rooms`) compared outside its
    home, as ``path:LINE: source (what)``."""
    root = Path(root)
    rooms = registered_rooms(root) if rooms is None else rooms
    problems = []
    for room in rooms:
        homes = [root.parent / h for h in room.home]
        for path in sorted(root.rglob("*.py")):
            if any(path == h or h in path.parents for h in homes):
                continue
            problems += [f"{hit} ({room.what}: ask its object)" for hit in name_comparisons(path, room, root.parent)]
    return problems


def registered_rooms(root: Path) -> list[Room]:
    """The rooms of the ``workbench`` package at ``root``, names read from its registries (none for another
    package)."""
    if not (root / "faults" / "kinds.py").is_file() or root.name != "workbench":
        return []
    sys.path.insert(0, str(root.parent))
    try:
        from workbench.base import modes, protocol
        from workbench.faults import events, kinds
        from workbench.workloads import registry
    finally:
        sys.path.pop(0)
    messages = frozenset({*protocol.CONTROL_KINDS, *protocol.TEMPLATE_KINDS})
    return [Room("a fault kind", frozenset({*kinds.REGISTRY, kinds.RANDOM}), ("kind", "fault", "name", "command"),
                 ("workbench/faults/kinds.py",), messages),
            Room("an event kind", frozenset(events.OWN), ("kind",), ("workbench/faults/events.py",), messages),
            Room("a model or dataset", frozenset({*registry.MODELS, *registry.DATASETS}), ("model", "dataset", "spec"),
                 ("workbench/workloads",)),
            Room("a parallel mode", frozenset(modes.REGISTRY), ("parallelism", "mode"), ("workbench/base/modes.py",))]


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args == ["--floor-plan"]:
        print(floor_plan(), end="")
        return 0
    root = Path(args[0]) if args else DEFAULT_ROOT
    if not (root / "__init__.py").is_file():
        print(f"check_structure: {root} is not a package directory (no __init__.py)", file=sys.stderr)
        return 2
    cycles = find_cycles(root)
    forbidden = forbidden_edges(root)
    private = private_imports(root)
    sizes = oversized(root)
    spread = mixins(root)
    top = crowded_top(root)
    compared = compared_names(root)
    floors = layered(root)
    for cycle in cycles:
        print(f"import cycle: {' -> '.join(cycle)}")
    for problem in forbidden:
        print(f"forbidden: {problem}")
    for problem in private:
        print(f"private name: {problem}")
    for problem in spread:
        print(f"class not whole: {problem}")
    for problem in sizes:
        print(f"too large: {problem}")
    for problem in top:
        print(f"top floor: {problem}")
    for problem in compared:
        print(f"name compared: {problem}")
    for problem in floors:
        print(f"layers: {problem}")
    if cycles or forbidden or private or spread or sizes or top or compared or floors:
        print(f"check_structure: {len(cycles)} import cycle(s), {len(forbidden)} forbidden reach(es), "
              f"{len(private)} private import(s), {len(spread)} class(es) not whole, "
              f"{len(sizes)} oversized module(s)/function(s), {len(top)} crowded top floor(s), "
              f"{len(compared)} name(s) compared outside their room, {len(floors)} layer problem(s)")
        return 1
    graph = import_graph(root)
    lengths = {name: len(path.read_text(encoding="utf-8").splitlines()) for name, path in modules(root).items()}
    largest = max(lengths, key=lambda name: lengths[name])
    print(f"check_structure OK: {len(graph)} modules, {sum(map(len, graph.values()))} import edges, no cycles, "
          f"no forbidden reach, no private imports, every class whole, a short top floor, names in their rooms; "
          f"largest module {largest} ({lengths[largest]} lines)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
