"""The documentation: README's relative links resolve, and the mkdocs site builds strictly (no warning at all)."""

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")


def relative_links(markdown: str) -> list[str]:
    """Targets of the Markdown links that are files of the repository (no scheme, not a bare #anchor)."""
    targets = []
    for target in LINK.findall(markdown):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I) or target.startswith("#"):
            continue
        targets.append(target.split("#", 1)[0])
    return targets


def test_readme_relative_links_point_to_files():
    links = relative_links((ROOT / "README.md").read_text(encoding="utf-8"))
    assert links, "README.md has no relative link: the check would pass vacuously"
    missing = [link for link in links if not (ROOT / link).exists()]
    assert not missing, f"README.md links to files that do not exist: {missing}"


def test_relative_links_finds_only_files():
    text = "[a](docs/x.md) [b](https://e.org) [c](#anchor) [d](docs/y.md#part) [e](mailto:x@y.z)"
    assert relative_links(text) == ["docs/x.md", "docs/y.md"]


@pytest.mark.skipif(importlib.util.find_spec("mkdocs") is None,
                    reason="mkdocs is not installed (pip install -e .[docs]; make setup-dev installs it)")
def test_site_builds_strictly(tmp_path):
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")  # mkdocs-material's end-of-life banner, not a build warning
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-4000:]
    warnings = [line for line in output.splitlines() if "WARNING" in line]
    assert not warnings, "\n".join(warnings)
    site = tmp_path / "site"
    for page in ("index.html", "reference/workbench.launch.session/index.html", "notebooks/quickstart/index.html"):
        assert (site / page).is_file(), page
    # the notebooks' own runs (under notebooks/, seen through docs/notebooks) are results, not documentation
    assert not [p for p in site.rglob("*") if p.name in ("runs", ".ipynb_checkpoints")]


MAX_PAGE_LINES = 400  # a page a reader takes in; records and derivations go to pages of their own


def pages_over(root: Path, limit: int = MAX_PAGE_LINES) -> list[str]:
    """Markdown pages under ``root`` longer than ``limit`` lines, each with its length."""
    return [f"{p.relative_to(root)}: {n} lines" for p in sorted(root.rglob("*.md"))
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > limit]


def test_every_page_under_docs_is_at_most_400_lines(tmp_path):
    assert pages_over(ROOT / "docs") == []
    (tmp_path / "wall.md").write_text("line\n" * (MAX_PAGE_LINES + 1))  # a plant: one line too many
    (tmp_path / "fits.md").write_text("line\n" * MAX_PAGE_LINES)
    assert pages_over(tmp_path) == ["wall.md: 401 lines"]
