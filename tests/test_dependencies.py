"""The package declares what it imports: every third-party module imported under ``workbench/`` comes from a
distribution named in pyproject.toml's dependencies, or, for the optional integrations, in their extra; and the
Makefile installs the runtime alone for the demo and adds the dev extras for the tests."""

import ast
import re
import subprocess
import sys
from importlib.metadata import packages_distributions
from pathlib import Path

try:
    import tomllib
except ImportError:  # Python 3.10
    from pip._vendor import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
OPTIONAL = {"mlflow": "tracking", "torchft": "peers", "mpi4py": "mpi",  # imported only when asked for
            "scipy": "studies",  # the reproductions and the Bayes ceilings: workbench.base.extras.need
            "mnist1d": "dev"}  # regenerating data/mnist1d.npz (workbench.workloads.mnist1d_file)


def _imported() -> dict[str, Path]:
    """Top-level third-party module -> the first file under workbench/ that imports it."""
    found: dict[str, Path] = {}
    for path in sorted((ROOT / "workbench").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            elif (isinstance(node, ast.Call) and getattr(node.func, "id", None) == "need" and node.args
                  and isinstance(node.args[0], ast.Constant)):  # an extra's module: workbench.base.extras.need
                names = [node.args[0].value]
            else:
                continue
            for top in (name.split(".")[0] for name in names):
                if top != "workbench" and top not in sys.stdlib_module_names:
                    found.setdefault(top, path.relative_to(ROOT))
    return found


def _names(requirements: list[str]) -> set[str]:
    return {re.split(r"[\s\[<>=!~;]", r, maxsplit=1)[0].lower().replace("_", "-") for r in requirements}


def test_every_module_the_package_imports_is_declared():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    runtime = _names(project["dependencies"])
    extras = {name: _names(reqs) for name, reqs in project["optional-dependencies"].items()}
    providers = packages_distributions()
    imported = _imported()
    assert {"torch", "numpy", "scipy", "IPython", "mlflow"} <= set(imported)  # the walk sees lazy imports too
    for module, where in imported.items():
        dists = {d.lower().replace("_", "-") for d in providers.get(module, [])}
        declared = extras[OPTIONAL[module]] if module in OPTIONAL else runtime
        assert dists & declared, (f"{module} (imported in {where}, from {sorted(dists) or 'nothing installed'}) "
                                  f"is not declared in pyproject.toml's "
                                  f"{'[' + OPTIONAL[module] + '] extra' if module in OPTIONAL else 'dependencies'}")


def test_the_demo_installs_the_runtime_and_the_tests_add_the_dev_extras():
    """``make -n`` on a fresh virtualenv: torch's pin first, then ``.`` for demo, ``.[dev]`` after it for test."""
    def plan(target: str) -> list[str]:
        done = subprocess.run(["make", "-n", target, "VENV=/nonexistent/venv"], cwd=ROOT, capture_output=True,
                              text=True, timeout=30)
        assert done.returncode == 0, done.stderr
        return [line for line in done.stdout.splitlines() if "pip install" in line]

    runtime = ["-m pip install --upgrade pip", "-m pip install torch==2.13.0", "-m pip install -e . torch==2.13.0"]
    assert [line.split("python ", 1)[1].split(" >")[0] for line in plan("demo")] == runtime
    for target in ("test", "lint", "docs", "bench"):
        assert [line.split("python ", 1)[1].split(" >")[0] for line in plan(target)] == [
            *runtime, "-m pip install -e '.[dev]' torch==2.13.0"], target
    for target in ("lab", "reproduce"):
        assert not any("[dev]" in line for line in plan(target)), target
    assert "-m pip install -q -e '.[studies]' torch==2.13.0" in plan("reproduce")[-1]  # scipy: the studies extra


def test_a_run_loads_neither_the_campaigns_nor_scipy():
    """The studies are built on the package, not in its core: ``import workbench; workbench.run(...)`` (and the
    result's summary) loads no module of ``workbench.campaigns`` and no scipy."""
    script = ("import sys, workbench\n"
              "result = workbench.run(world_size=2, steps=3, eval_interval=3)\n"
              "assert result.completed, result.summary['reason']\n"
              "print(sorted(m for m in sys.modules if m.startswith(('workbench.campaigns', 'scipy'))))\n")
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "[]"
