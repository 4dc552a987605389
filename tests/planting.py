"""A regression or a broken strategy planted into every Python process a test starts: the text of a
``sitecustomize.py`` (put on PYTHONPATH) whose import hook patches one module as it is loaded
(tests/test_slow_paths.py, tests/test_reproduce_planted.py, tests/test_sample_checksum.py, tests/test_plants.py), a
script run in a fresh interpreter with it or without it (:func:`run_planted`), and tests of the suite run with it
(:func:`run_tests_planted`: tests/test_plants.py, each docs/testing.md plant).

Plants compose: a test run planted may plant again (a ``sitecustomize.py`` earlier on the path), and both apply,
each to its own module or, in turn, to the same one."""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FIRED_VAR = "WORKBENCH_PLANT_FIRED"  # the file a plant's ``fired(what)`` appends a line to: it changed something

HOOK = '''

import ast as _ast, importlib.abc as _abc, importlib.util as _util, os as _os, sys as _sys, types as _types


def fired(what=""):
    """The plant changed what the code does (a line "pid what" in $WORKBENCH_PLANT_FIRED, where it is set)."""
    path = _os.environ.get("WORKBENCH_PLANT_FIRED")
    if path:
        with open(path, "a") as f:
            f.write(f"{_os.getpid()} {what}\\n")


def _install():
    """The process's plants by module name, and one import hook: a planted module's code ends with a call of its
    plants (before its ``if __name__ == "__main__":`` block, so a module run by ``python -m`` is planted too)."""
    plants = _sys.modules["_plants"] = _types.ModuleType("_plants")
    plants.by_target = {}
    plants.apply = lambda name, module: [plant(module) for plant in plants.by_target[name]]

    def main_block(node):
        return isinstance(node, _ast.If) and _ast.unparse(node.test).replace("'", '"') == '__name__ == "__main__"'

    class Finder(_abc.MetaPathFinder):
        busy = False

        def find_spec(self, name, path, target=None):
            if name not in plants.by_target or self.busy:
                return None
            self.busy = True  # the finders after this one find the module
            try:
                spec = _util.find_spec(name)
            finally:
                self.busy = False
            loader = spec.loader

            def get_code(fullname):
                tree = _ast.parse(loader.get_source(fullname), spec.origin)
                at = next((i for i, node in enumerate(tree.body) if main_block(node)), len(tree.body))
                tree.body[at:at] = _ast.parse(
                    f"__import__('_plants').apply({name!r}, __import__('sys').modules[__name__])").body
                return compile(tree, spec.origin, "exec", dont_inherit=True)

            loader.get_code = get_code
            return spec

    _sys.meta_path.insert(0, Finder())
    return plants


(_sys.modules.get("_plants") or _install()).by_target.setdefault(TARGET, []).append(plant)


def _next_plant():
    """Python imports the first ``sitecustomize`` on the path only: run the next one after this one's too."""
    here, seen = _os.path.dirname(_os.path.abspath(__file__)), False
    for entry in list(_sys.path):
        entry = _os.path.abspath(entry or ".")
        if entry == here:
            seen = True
        elif seen and _os.path.isfile(_os.path.join(entry, "sitecustomize.py")):
            path = _os.path.join(entry, "sitecustomize.py")
            with open(path) as f:
                exec(compile(f.read(), path, "exec"), {"__name__": "sitecustomize", "__file__": path})
            return


_next_plant()
'''


def sitecustomize(body: str) -> str:
    """``body`` (defining ``TARGET``, the module's name, and ``plant(module)``, which may call ``fired(what)``
    where it changes what the code does), then the hook that calls ``plant`` on ``TARGET`` once it is loaded, in
    every process that starts with it."""
    return body.rstrip("\n") + "\n" + HOOK


def _planted_env(out: Path, plant: str | None) -> dict[str, str]:
    """This process's environment with the ``sitecustomize.py`` text ``plant`` first on the path (written to
    ``out / "plant"``), no shared rank template (the runs start their own, planted or not), nor this session's
    pytest-xdist worker."""
    env = {k: v for k, v in os.environ.items()
           if k != "WORKBENCH_TEMPLATE" and not k.startswith(("PYTEST_XDIST", "PYTEST_CURRENT"))}
    if plant is not None:
        (out / "plant").mkdir(parents=True)
        (out / "plant" / "sitecustomize.py").write_text(plant)
        env["PYTHONPATH"] = os.pathsep.join([str(out / "plant"), env.get("PYTHONPATH", "")])
    return env


def run_planted(script: str, out: Path, plant: str | None, timeout: float) -> dict:
    """``script`` run by a fresh interpreter with ``out / "runs"`` as its argument, its own rank template, and the
    ``sitecustomize.py`` text ``plant`` on its path (None: nothing planted); the JSON of its last stdout line."""
    done = subprocess.run([sys.executable, "-c", script, str(out / "runs")], capture_output=True, text=True,
                          timeout=timeout, env=_planted_env(out, plant), cwd=ROOT)
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-3000:])
    return json.loads(done.stdout.strip().splitlines()[-1])


REPORTER = '''\
"""Loaded by tests/planting.run_tests_planted (-p planted_reports): each test phase's outcome, its failure's last
lines and how many times the plant had fired by its end, one JSON line each to $WORKBENCH_PLANT_REPORTS."""
import json, os, re


def _fired():
    try:
        with open(os.environ["WORKBENCH_PLANT_FIRED"]) as f:
            return sum(1 for _ in f)
    except FileNotFoundError:
        return 0


def pytest_runtest_logreport(report):
    text = re.sub(r"\\x1b\\[[0-9;]*m", "", report.longreprtext)  # a notebook cell's traceback is coloured
    lines = text.strip().splitlines() if report.failed else []
    # the failing line (pytest marks it ">") however long the diff below it, then the end of the report
    message = [line for line in lines[:-40] if line.startswith(">")] + lines[-40:]
    with open(os.environ["WORKBENCH_PLANT_REPORTS"], "a") as f:
        f.write(json.dumps({"nodeid": report.nodeid, "when": report.when, "outcome": report.outcome,
                            "message": "\\n".join(message), "fired": _fired()}) + "\\n")
'''


def run_tests_planted(node_ids: list[str], plant: str, out: Path, timeout: float, options: tuple[str, ...] = (),
                      cwd: Path = ROOT) -> dict[str, dict]:
    """The tests ``node_ids`` run by a fresh pytest (in ``cwd``, one process, with ``options``) with the
    ``sitecustomize.py`` text ``plant`` first on the path of it and of every process it starts. For each test that
    ran: ``{"setup", "call", "teardown"}`` (each phase's outcome: passed, failed or skipped), ``message`` (its
    failure's last lines) and ``fired`` (the lines the plant's ``fired`` wrote while it ran)."""
    env = _planted_env(out, plant)
    (out / "plant" / "planted_reports.py").write_text(REPORTER)
    reports, fired = out / "reports.jsonl", out / "fired.txt"
    env.update({"WORKBENCH_PLANT_REPORTS": str(reports), FIRED_VAR: str(fired)})
    done = subprocess.run([sys.executable, "-m", "pytest", *node_ids, "-p", "no:cacheprovider", "-p",
                           "planted_reports", "-q", *options], capture_output=True, text=True, timeout=timeout,
                          env=env, cwd=cwd)
    assert reports.is_file(), ("no test ran", done.returncode, done.stdout[-3000:], done.stderr[-2000:])
    tests: dict[str, dict] = {}
    count = 0
    for line in reports.read_text().splitlines():
        report = json.loads(line)
        test = tests.setdefault(report["nodeid"], {"message": "", "fired": 0})
        test[report["when"]] = report["outcome"]
        test["message"] += report["message"]
        test["fired"] += report["fired"] - count
        count = report["fired"]
    return tests
