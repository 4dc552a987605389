"""Rewrite the tree for the package floor plan (issue 30, item 2): old module names -> new ones, everywhere.

Idempotent: re-run it after merging a branch that still names the old modules. In every tracked text file but
this one and its test it rewrites ``from OLD import a, b`` (split when the names moved apart), ``from workbench
import old`` (kept under its local name), dotted names in code, strings and prose (``python -m
workbench.sweep_point``, ``:mod:``, ``::: workbench.x``, mock targets), file paths (``workbench/sweep.py``),
notebook cells (JSON as nbformat writes it) and the private names made public (:data:`RENAMES`); then ``ruff
--fix --select I`` sorts the imports it touched, and it prints the bare old names it left alone (``"sweep_point"
in cmd``) for a reader to judge.

Usage: ``python tools/floorplan_rewrite.py [--move] [--dry-run] [PATH ...]`` (default: the whole repository);
``--move`` first runs ``git mv`` on any old module file (and its ``docs/reference`` page) still present.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# old dotted module -> new dotted module (whole modules moved; ``git mv`` carried their history)
MODULES = {
    "workbench.sweep": "workbench.sweeps.run",
    "workbench.sweep_plan": "workbench.sweeps.plan",
    "workbench.sweep_point": "workbench.sweeps.point",
    "workbench.sweep_executor": "workbench.sweeps.workers",
    "workbench.sweep_table": "workbench.sweeps.table",
    "workbench.sweep_sbatch": "workbench.sweeps.slurm_run",
    "workbench.sweep_slurm": "workbench.sweeps.slurm_array",
    "workbench.tracking_sweep": "workbench.sweeps.tracking",
    "workbench.hosts": "workbench.cluster.hosts_file",
    "workbench.slurm": "workbench.cluster.slurm_commands",
    "workbench.slurm_hosts": "workbench.cluster.slurm_allocation",
    "workbench.models": "workbench.workloads.models",
    "workbench.architectures": "workbench.workloads.architectures",
    "workbench.data": "workbench.workloads.data",
    "workbench.datasets": "workbench.workloads.datasets",
    "workbench.dataset_files": "workbench.workloads.dataset_files",
    "workbench.apoptosis": "workbench.apoptosis.rule",
    "workbench.apoptosis_surgery": "workbench.apoptosis.surgery",
    "workbench.faultspec": "workbench.faults.spec",
    "workbench.faults.campaign": "workbench.studies.campaign",
    "workbench.faults.sensitivity": "workbench.studies.sensitivity",
}

# (module, name) -> the module that now defines the name (modules split, or package __init__s that no longer
# re-export: they import nothing heavy)
_FAULTS = {"workbench.faults.bitflip": "Flip bit_field flip inject replay",
           "workbench.faults.hdf5": "alter_checkpoint compare_checkpoints replay_checkpoint",
           "workbench.faults.outcomes": "classify possible_outcomes",
           "workbench.studies.campaign": "campaign flip_plan",
           "workbench.studies.sensitivity": "bit_sensitivity load_trials outcome_shares save_trials"}
SYMBOLS = {("workbench.faults", name): module for module, names in _FAULTS.items() for name in names.split()}
SYMBOLS |= {("workbench.faults.targets", name): "workbench.workloads.stages"
            for name in ("stage_cuts", "check_model", "model_tensors", "buffer_tensors")}
SYMBOLS[("workbench.supervisor", "Supervisor")] = "workbench.supervisor.core"

# private names that crossed modules, now public (issue 30, item 4): old -> (new, files it is renamed in; None: all
# Python files and notebooks)
RENAMES = {
    "_check_bit": ("check_bit", None),
    "_join_from_store": ("join_from_store", None),
    "_clone_state": ("clone_state", None),
    "_ms": ("epoch_ms", ("workbench/tracking.py", "workbench/sweeps/tracking.py")),
}

# old names that are also public attributes of ``workbench`` (the function ``workbench.sweep``): rewritten only
# where they name the module (an attribute after them, an import, ``:mod:``, ``:::``, a quoted module name)
AMBIGUOUS = {"workbench.sweep"}
NEW_PACKAGES = {"workbench.sweeps": "Sweeps of a notebook over a grid of parameters.",
                "workbench.cluster": "Where a run's ranks live beyond one machine: hosts files and Slurm.",
                "workbench.workloads": "What a run trains: models, architectures, data, datasets, pipeline stages.",
                "workbench.apoptosis": "Adaptive neuron apoptosis: the rule and the model surgery.",
                "workbench.studies": "Studies built on runs: injection campaigns and per-bit sensitivity."}
TEXT_SUFFIXES = {".py", ".md", ".ipynb", ".yml", ".yaml", ".toml", ".txt", ".cfg", ".ini", ".sh", ".html", ".json"}
TEXT_NAMES = {"Makefile"}
EXCLUDED = {"tools/floorplan_rewrite.py", "tests/test_floorplan_rewrite.py"}  # they name the old modules on purpose


def path_of(module: str) -> str:
    return module.replace(".", "/") + ".py"


def _new_modules() -> set[str]:
    return set(MODULES.values()) | set(SYMBOLS.values()) | set(NEW_PACKAGES)


def _is_child(module: str, name: str) -> bool:
    """Whether ``module.name`` is a module of the new layout (``from workbench.apoptosis import rule``)."""
    child = f"{module}.{name}"
    return child in _new_modules() or (ROOT / path_of(child)).is_file() or (ROOT / child.replace(".", "/")).is_dir()


def _target(module: str, name: str) -> tuple[str, str | None]:
    """(module to import ``name`` from, alias needed or None) for ``from module import name`` in the new layout."""
    if (module, name) in SYMBOLS:
        return SYMBOLS[(module, name)], None
    if module in MODULES and not _is_child(module, name):
        return MODULES[module], None
    old = f"{module}.{name}"
    if old in MODULES and not (module == "workbench" and old in AMBIGUOUS):  # from workbench import slurm
        parent, _, leaf = MODULES[old].rpartition(".")
        return parent, (name if leaf != name else None) if parent != module else None
    return module, None


_FROM = re.compile(r"^(?P<indent>[ \t]*)from[ \t]+(?P<module>workbench(?:\.\w+)*)[ \t]+import[ \t]+"
                   r"(?P<names>\([^)]*\)|[^\n]*)", re.MULTILINE)


def _rewrite_from(match: re.Match[str]) -> str:
    indent, module, raw = match["indent"], match["module"], match["names"]
    body = raw[1:-1] if raw.startswith("(") else raw
    comment = ""
    if not raw.startswith("(") and "#" in body:
        body, comment = body.split("#", 1)
        comment = "  #" + comment
    names = [re.sub(r"#[^\n]*", "", part).strip() for part in re.sub(r"#[^\n]*", "", body).split(",")]
    names = [n for n in names if n]
    groups: dict[str, list[str]] = {}
    for entry in names:
        name, _, alias = (part.strip() for part in entry.partition(" as "))
        target, needed = _target(module, name)
        if target == module and not needed:
            groups.setdefault(module, []).append(entry)
            continue
        if needed:  # from workbench import slurm -> from workbench.cluster import slurm_commands as slurm
            name, alias = MODULES[f"{module}.{name}"].rpartition(".")[2], alias or needed
        groups.setdefault(target, []).append(f"{name} as {alias}" if alias else name)
    if list(groups) == [module]:
        return match[0]
    lines = [f"{indent}from {target} import {', '.join(entries)}" for target, entries in groups.items()]
    lines[0] += comment
    return "\n".join(lines)


def _dotted(text: str) -> str:
    """Dotted module names (and ``module.name`` of moved names) outside ``from ... import`` statements."""
    olds = sorted({*MODULES, *{m for m, _ in SYMBOLS}}, key=len, reverse=True)
    pattern = re.compile(r"(?<![\w.])(" + "|".join(re.escape(o) for o in olds) + r")(?![\w])(\.\w+)?")

    def replace(m: re.Match[str]) -> str:
        old, attribute = m[1], m[2] or ""
        name = attribute[1:]
        if name and (old, name) in SYMBOLS:
            return f"{SYMBOLS[(old, name)]}.{name}"
        if old not in MODULES or (name and _is_child(old, name)):
            return m[0]
        if old in AMBIGUOUS and not name:
            before, after = text[max(0, m.start() - 8):m.start()], text[m.end():m.end() + 1]
            if not (re.search(r"(import |:mod:`~?|::: |# `)$", before) or (before.endswith('"') and after == '"')):
                return m[0]
        return MODULES[old] + attribute

    return pattern.sub(replace, text)


def _paths(text: str) -> str:
    for old, new in sorted(MODULES.items(), key=lambda item: -len(item[0])):
        text = re.sub(r"(?<![\w/])" + re.escape(path_of(old)), path_of(new), text)
    return text


def rewrite(text: str) -> str:
    """The text with every old module name replaced (see the module docstring). Idempotent."""
    pieces, last = [], 0
    for match in _FROM.finditer(text):
        pieces += [_dotted(text[last:match.start()]), _rewrite_from(match)]
        last = match.end()
    pieces.append(_dotted(text[last:]))
    return _paths("".join(pieces))


def rename(text: str, relative: str) -> str:
    """Private names made public (:data:`RENAMES`) in a Python file or a notebook's cells."""
    for old, (new, scope) in RENAMES.items():
        if scope is None or relative in scope:
            text = re.sub(r"(?<!\w)" + re.escape(old) + r"(?!\w)", new, text)
    return text


def rewrite_notebook(text: str) -> str:
    notebook = json.loads(text)
    for cell in notebook.get("cells", []):
        source = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
        new = rename(rewrite(source), "")
        if new != source:
            cell["source"] = new.splitlines(keepends=True)
    return json.dumps(notebook, indent=1, ensure_ascii=False) + "\n"


def tracked(paths: list[str]) -> list[Path]:
    listed = subprocess.run(["git", "ls-files", "-z", "--", *paths], cwd=ROOT, capture_output=True, text=True,
                            check=True).stdout.split("\0")
    files = [ROOT / p for p in listed if p]
    return [f for f in files if f.is_file() and (f.suffix in TEXT_SUFFIXES or f.name in TEXT_NAMES)
            and f.relative_to(ROOT).as_posix() not in EXCLUDED]


def move() -> list[str]:
    """``git mv`` every old module file (and reference page) still present; create the new packages' __init__."""
    done = []
    for old, new in MODULES.items():
        for src, dst in ((path_of(old), path_of(new)), (f"docs/reference/{old}.md", f"docs/reference/{new}.md")):
            if (ROOT / src).is_file() and not (ROOT / dst).exists():
                (ROOT / dst).parent.mkdir(parents=True, exist_ok=True)
                subprocess.run(["git", "mv", src, dst], cwd=ROOT, check=True)
                done.append(f"{src} -> {dst}")
    for package, doc in NEW_PACKAGES.items():
        init = ROOT / package.replace(".", "/") / "__init__.py"
        if not init.exists():
            init.parent.mkdir(parents=True, exist_ok=True)
            init.write_text(f'"""{doc}"""\n', encoding="utf-8")
            subprocess.run(["git", "add", str(init)], cwd=ROOT, check=True)
            done.append(f"new {init.relative_to(ROOT)}")
    return done


def leftovers(files: list[Path]) -> list[str]:
    """Lines still naming an old module's file name bare (``"sweep_point" in cmd``), for a reader to judge."""
    bare = {o.rpartition(".")[2] for o in MODULES if "_" in o.rpartition(".")[2]}
    pattern = re.compile(r"(?<![\w./])(" + "|".join(sorted(bare)) + r")(?![\w])")
    found = []
    for path in files:
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if pattern.search(line) and not re.search(r"workbench[./]", line):
                found.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()[:100]}")
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--move", action="store_true", help="git mv old module files still present first")
    parser.add_argument("--dry-run", action="store_true", help="list the files it would change, change none")
    parser.add_argument("paths", nargs="*", help="files or folders (default: the whole repository)")
    args = parser.parse_args(argv)
    if args.move and not args.dry_run:
        for line in move():
            print(f"moved: {line}")
    files = tracked(args.paths)
    changed = []
    for path in files:
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        new = rewrite_notebook(text) if path.suffix == ".ipynb" else rewrite(text)
        if path.suffix == ".py":
            new = rename(new, path.relative_to(ROOT).as_posix())
        if new != text:
            changed.append(path)
            if not args.dry_run:
                path.write_text(new, encoding="utf-8")
    for path in changed:
        print(f"{'would rewrite' if args.dry_run else 'rewrote'}: {path.relative_to(ROOT)}")
    python = [str(p) for p in changed if p.suffix == ".py"]
    ruff = shutil.which("ruff") or str(Path(sys.executable).with_name("ruff"))
    if python and not args.dry_run and Path(ruff).exists():
        subprocess.run([ruff, "check", "--fix", "--select", "I", "--quiet", *python], cwd=ROOT, check=False)
    for line in leftovers(files):
        print(f"check by hand: {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
