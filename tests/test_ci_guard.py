"""tests/ci_guard.py, the plugin both halves of ``make test`` load: under CI=true a skip fails, and a notebook that
leaves a project process behind errors. Each case runs pytest on a planted file in a directory of its own."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent


def _pytest(directory: Path, *argv: str, ci: bool) -> subprocess.CompletedProcess:
    (directory / "pytest.ini").write_text("[pytest]\naddopts = -p no:cacheprovider -p ci_guard\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}
    env.pop("CI", None)
    if ci:
        env["CI"] = "true"
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", *argv], cwd=directory, env=env,
                          capture_output=True, text=True, timeout=240)


@pytest.mark.parametrize("workers", [[], ["-n", "2"]], ids=["one-process", "xdist"])  # make test: -n 2
def test_a_planted_skip_fails_under_ci_and_stays_a_skip_outside(tmp_path, workers):
    (tmp_path / "test_planted.py").write_text(
        "import pytest\n\n"
        "def test_skipped():\n    pytest.skip('no browser here')\n\n"
        "@pytest.mark.skipif(True, reason='no cluster here')\ndef test_marked():\n    pass\n\n"
        "@pytest.mark.xfail(reason='known')\ndef test_xfail():\n    assert False\n")
    (tmp_path / "test_module_skip.py").write_text("import pytest\npytest.importorskip('no_such_module_here')\n")
    outside = _pytest(tmp_path, *workers, ci=False)
    assert outside.returncode == 0 and "3 skipped" in outside.stdout and "1 xfailed" in outside.stdout, outside.stdout
    inside = _pytest(tmp_path, *workers, ci=True)
    assert inside.returncode == 1, inside.stdout
    assert "no browser here" in inside.stdout and "no cluster here" in inside.stdout, inside.stdout
    assert "no_such_module_here" in inside.stdout and "1 xfailed" in inside.stdout, inside.stdout
    assert inside.stdout.count("skipped under CI=true") >= 3, inside.stdout


def test_a_notebook_that_leaves_a_rank_behind_errors_and_the_rank_is_killed(tmp_path):
    marker = f"workbench.rank-planted-{os.getpid()}"
    cell = ("import subprocess, sys\n"
            f"subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)', {marker!r}],\n"
            "                 start_new_session=True)  # out of the kernel's process group, as a rank is")
    notebook = {"cells": [{"cell_type": "code", "execution_count": None, "id": "leak", "metadata": {},
                           "outputs": [], "source": cell}],
                "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}},
                "nbformat": 4, "nbformat_minor": 5}
    (tmp_path / "leaky.ipynb").write_text(json.dumps(notebook))
    done = _pytest(tmp_path, "--nbval-lax", "leaky.ipynb", ci=False)
    assert done.returncode == 1 and "leaky.ipynb left 1 process(es) running" in done.stdout, done.stdout[-3000:]
    left = subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True)
    assert left.stdout.strip() == "", f"the planted rank is still running: {left.stdout}"
