"""A regression or a broken strategy planted into every Python process a test starts: the text of a
``sitecustomize.py`` (put on PYTHONPATH) whose import hook patches one module as it is loaded
(tests/test_slow_paths.py, tests/test_reproduce_planted.py, tests/test_sample_checksum.py), and a script run in a
fresh interpreter with it or without it (:func:`run_planted`)."""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

HOOK = '''

import importlib.abc as _abc, importlib.machinery as _machinery, sys as _sys


class _Finder(_abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != TARGET:
            return None
        spec = _machinery.PathFinder.find_spec(name, path)
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            plant(module)

        spec.loader.exec_module = exec_module
        return spec


_sys.meta_path.insert(0, _Finder())
'''


def sitecustomize(body: str) -> str:
    """``body`` (defining ``TARGET``, the module's name, and ``plant(module)``), then the hook that calls ``plant``
    on ``TARGET`` once it is loaded, in every process that starts with it."""
    return body.rstrip("\n") + "\n" + HOOK


def run_planted(script: str, out: Path, plant: str | None, timeout: float) -> dict:
    """``script`` run by a fresh interpreter with ``out / "runs"`` as its argument, its own rank template, and the
    ``sitecustomize.py`` text ``plant`` on its path (None: nothing planted); the JSON of its last stdout line."""
    env = {k: v for k, v in os.environ.items() if k != "WORKBENCH_TEMPLATE"}  # its own template: planted or not
    if plant is not None:
        (out / "plant").mkdir(parents=True)
        (out / "plant" / "sitecustomize.py").write_text(plant)
        env["PYTHONPATH"] = os.pathsep.join([str(out / "plant"), env.get("PYTHONPATH", "")])
    done = subprocess.run([sys.executable, "-c", script, str(out / "runs")], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=ROOT)
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-3000:])
    return json.loads(done.stdout.strip().splitlines()[-1])
