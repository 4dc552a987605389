"""What the library must not keep: issue numbers (the git log and the docs keep history, the code says what it
means), and copies of the workloads registry taken when a module is imported (a model or dataset a notebook
registers later would never reach them). Each scan is shown a planted case first."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TEXT = {".py", ".yaml", ".yml", ".md", ".json", ".txt", ".toml", ".cfg", ".ipynb", ".html", ".css"}
# "issue #46", "issues 45", "(#31)"; not a colour (#222;), an HTML entity (&#123;) or a word (#define)
ISSUE = re.compile(r"(?i)\bissues?\s*#?\s*\d+|(?<![\w#&])#\d{1,4}(?![\w;])")
# what reads the workloads registry: a module constant built from it is a copy of it as it stood at import (a
# function of it handed on uncalled, to be called when asked, is no copy)
REGISTRY_CALLS = {"model_names", "dataset_names", "dataset_forms", "dataset_choices", "model", "dataset"}
REGISTRY_TABLES = {"MODELS", "DATASETS"}


def issue_numbers(root: Path, within: Path) -> list[str]:
    """Every issue number in the text files under ``root``, as ``path:LINE: match``."""
    found = []
    for path in sorted(p for p in root.rglob("*") if p.is_file() and p.suffix in TEXT):
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            found += [f"{path.relative_to(within)}:{number}: {m.group(0)}" for m in ISSUE.finditer(line)]
    return found


def registry_copies(root: Path, within: Path) -> list[str]:
    """Every module-level assignment under ``root`` whose value reads the workloads registry: calls
    ``registry.model_names()`` (and the like) or reads ``registry.MODELS`` / ``registry.DATASETS``."""

    def of_registry(node: ast.AST, names: set[str]) -> bool:
        return (isinstance(node, ast.Attribute) and node.attr in names and isinstance(node.value, ast.Name)
                and node.value.id == "registry")

    found = []
    for path in sorted(root.rglob("*.py")):
        source = path.read_text()
        for node in ast.parse(source).body:
            if not isinstance(node, (ast.Assign, ast.AnnAssign)) or node.value is None:
                continue
            inside = list(ast.walk(node.value))
            if any(isinstance(n, ast.Call) and of_registry(n.func, REGISTRY_CALLS) for n in inside) or any(
                    of_registry(n, REGISTRY_TABLES) for n in inside):
                found.append(f"{path.relative_to(within)}:{node.lineno}: {ast.get_source_segment(source, node)}")
    return found


def test_the_issue_scan_finds_planted_numbers(tmp_path):
    (tmp_path / "a.yaml").write_text("# Pre-registration (issue #31): ...\nwhy: \"issue 46: checks\"\n")
    (tmp_path / "b.py").write_text('"""A fix (#54)."""\nCSS = "color: #222; &#123;"\n')
    hits = issue_numbers(tmp_path, tmp_path)
    assert [h.split(": ", 1)[1] for h in hits] == ["issue #31", "issue 46", "#54"], hits


def test_no_issue_numbers_in_the_library():
    assert issue_numbers(ROOT / "workbench", ROOT) == [], "say what the change means, not its issue's number"


def test_the_copy_scan_finds_a_planted_snapshot(tmp_path):
    (tmp_path / "planted.py").write_text("from workbench.workloads import registry\n\n"
                                         "MODELS = registry.model_names()  # as imported\n"
                                         "FILES = {e.name: e for e in registry.DATASETS.values()}\n"
                                         "ASKED = {'model': registry.model_names}  # called when asked\n\n\n"
                                         "def models():\n    return registry.model_names()\n")
    hits = registry_copies(tmp_path, tmp_path)
    assert len(hits) == 2 and "MODELS" in hits[0] and "FILES" in hits[1], hits


def test_no_module_keeps_a_copy_of_the_workloads_registry():
    assert registry_copies(ROOT / "workbench", ROOT) == [], "read workbench.workloads.registry when asked"
