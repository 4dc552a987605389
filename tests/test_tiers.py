"""The suite's two tiers (tests/tiers.py): what an entry of tests/slow.txt covers, and every entry covering a test
that exists (a renamed or deleted test must leave the list with it)."""

import os
import subprocess
import sys
from pathlib import Path

import tiers

ROOT = Path(__file__).resolve().parents[1]


def test_an_entry_covers_its_test_its_parameters_its_file_or_its_directory():
    assert tiers.matches("tests/test_a.py::test_x", "tests/test_a.py::test_x")
    assert tiers.matches("tests/test_a.py::test_x", "tests/test_a.py::test_x[shrink]")
    assert not tiers.matches("tests/test_a.py::test_x", "tests/test_a.py::test_x_and_more")
    assert tiers.matches("notebooks/apoptosis.ipynb", "notebooks/apoptosis.ipynb::Cell 3")
    assert tiers.matches("tests/cluster/", "tests/cluster/test_slurm_runs.py::test_one")
    assert not tiers.matches("tests/cluster/", "tests/test_cluster.py::test_one")
    assert tiers.entries("a::b  # 12 s\n\n# a comment\n  c/  # 3 s\n") == ["a::b", "c/"]


def test_every_slow_entry_covers_a_test_that_exists():
    listed = tiers.entries()
    assert listed, "tests/slow.txt lists no test"
    paths = sorted({entry.split("::", 1)[0] for entry in listed})
    missing = [path for path in paths if not (ROOT / path).exists()]
    assert not missing, f"tests/slow.txt names files that do not exist: {missing}"
    files = [path for path in paths if path.endswith(".py")]
    collected = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", *files],
                               cwd=ROOT, capture_output=True, text=True, timeout=600)
    nodeids = [line for line in collected.stdout.splitlines() if "::" in line]
    assert nodeids, collected.stdout[-2000:] + collected.stderr[-2000:]
    stale = [entry for entry in listed if "::" in entry
             and not any(tiers.matches(entry, nodeid) for nodeid in nodeids)]
    assert not stale, f"tests/slow.txt entries that match no test: {stale}"


def test_a_fast_tier_test_over_its_limit_fails_under_ci_and_is_named_outside(tmp_path):
    """The limit lowered to 0.2 s for a planted test that takes 0.5 s (the real limit: tiers.FAST_LIMIT_S)."""
    tests = Path(__file__).resolve().parent
    (tmp_path / "pytest.ini").write_text("[pytest]\naddopts = -p no:cacheprovider -p ci_guard -p tiers\n")
    (tmp_path / "test_planted.py").write_text("import time\n\ndef test_slow():\n    time.sleep(0.5)\n\n"
                                              "def test_quick():\n    pass\n")
    env = {**os.environ, "WORKBENCH_FAST_LIMIT_S": "0.2",
           "PYTHONPATH": os.pathsep.join([str(tests), os.environ.get("PYTHONPATH", "")])}
    env.pop("CI", None)
    for ci in (False, True):
        run = subprocess.run([sys.executable, "-m", "pytest", "-q"], cwd=tmp_path, capture_output=True, text=True,
                             timeout=120, env={**env, **({"CI": "true"} if ci else {})})
        assert "slow for the fast tier" in run.stdout and "test_planted.py::test_slow" in run.stdout, run.stdout
        assert "test_quick" not in run.stdout.split("slow for the fast tier", 1)[1], run.stdout
        assert run.returncode == (1 if ci else 0), run.stdout
