"""A pytest plugin for both halves of ``make test`` (``tests/`` and the notebooks through nbval), loaded by
``pyproject.toml`` (``-p ci_guard``):

- **Under ``CI=true`` a skip is a failure.** A test that cannot run there (a browser or a Slurm that did not
  install, a missing extra, a kernel feature that is off) fails with the reason it would have been skipped for,
  so a green CI means every test ran. ``xfail`` is left alone. Outside CI a skip stays a skip (``-rs`` lists it).
- **The notebooks get the leak check ``tests/`` has** (``conftest.py`` there): once nbval has shut a notebook's
  kernel down, every project process the notebook started (ranks, templates, papermill workers, kernels) must be
  gone within ``LEAK_WAIT_S``; what is left is killed and reported as an error of the notebook's last cell.
- **Under ``pytest -n`` (xdist) it schedules the workers**: a notebook's cells together, ``tests/cluster``
  together, every other test on its own (``make test`` runs both halves over two workers); a reproduction
  notebook's cells get ``REPRODUCTION_TIMEOUT_S`` instead of the suite's 300 s.
"""

from __future__ import annotations

import os

import leaks
import pytest

# a process of a test may take this long to go (a kernel shutting down, ranks reaped). Measured by
# tools/teardown_times.py (20 each of a 4-rank run, a killed 4-rank run, a kernel with a 2-rank run, 2 loaded cores):
# at most 0.13 s; 3 s is 23x that, and costs nothing unless a test leaks (the wait ends when the processes do)
LEAK_WAIT_S = 3.0


def in_ci() -> bool:
    """``CI`` set to anything but empty, 0 or false (GitHub Actions, GitLab and ``.ci/run`` set ``CI=true``)."""
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def _skip_reason(report: pytest.CollectReport | pytest.TestReport) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:  # (path, line, "Skipped: reason")
        return str(longrepr[2]).removeprefix("Skipped: ")
    return str(longrepr)


def _fail_skip(report: pytest.CollectReport | pytest.TestReport) -> None:
    if in_ci() and report.skipped and not hasattr(report, "wasxfail"):
        report.outcome = "failed"
        report.longrepr = (f"skipped under CI=true, which counts as a failure (a test that cannot run in CI must "
                           f"be made to run there): {_skip_reason(report)}")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> pytest.TestReport:
    report = yield
    _fail_skip(report)
    return report


_skipped_files: list[str] = []  # under CI: files a module-level skip left out, failed at the session's end


def pytest_collectreport(report: pytest.CollectReport) -> None:
    """Where the report is logged (the controller under xdist): a module-level importorskip or
    skip(allow_module_level=True) skips the whole file. Not failed here: a collection error would stop the other
    files from running."""
    if in_ci() and report.skipped:
        _skipped_files.append(f"{report.nodeid}: {_skip_reason(report)}")


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    for line in _skipped_files:
        terminalreporter.write_line(f"FAILED (skipped under CI=true, which counts as a failure) {line}", red=True)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if _skipped_files and exitstatus == 0:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


# -- the notebooks' leak check --------------------------------------------------------------------------------

_before: dict[str, set[tuple[int, int]]] = {}  # notebook path -> project processes before its first cell


def _is_notebook_cell(item: pytest.Item) -> bool:
    return str(getattr(item, "path", "")).endswith(".ipynb")


def _notebook(item: pytest.Item) -> str:
    return str(item.path)


def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    """Under ``pytest -n`` (xdist) the tests spread one by one over the workers, but a notebook's cells run in
    order in one worker (nbval runs them in one kernel) and ``tests/cluster``'s tests in one worker (they share
    the session's one-node Slurm cluster: one machine runs one slurmd of its node). nbval's cells ignore
    ``xdist_group`` marks, hence a scheduler whose scopes are those."""
    from xdist.scheduler import LoadScopeScheduling

    class Scopes(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            if path.endswith(".ipynb"):
                return path
            return "tests/cluster" if path.startswith("tests/cluster/") else nodeid

    return Scopes(config, log)


# the reproductions' small scale runs whole campaigns in one cell (CCGrid'22: 261 s in CI on 2 cores, past the
# suite's 300 s per test under load): still bounded, at twice the time they take
REPRODUCTION_TIMEOUT_S = 600


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if _is_notebook_cell(item) and "/notebooks/reproduce/" in _notebook(item):
            item.add_marker(pytest.mark.timeout(REPRODUCTION_TIMEOUT_S))


def pytest_runtest_setup(item: pytest.Item) -> None:
    if _is_notebook_cell(item) and _notebook(item) not in _before:  # before nbval starts the notebook's kernel
        _before[_notebook(item)] = {p.key for p in leaks.project_processes(os.environ.get(leaks.TAG_VAR))}


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    result = yield  # after the last cell, nbval's teardown of the notebook has shut its kernel down
    if _is_notebook_cell(item) and (nextitem is None or _notebook(nextitem) != _notebook(item)):
        before = _before.pop(_notebook(item), set())
        left = leaks.wait_gone(before, os.environ.get(leaks.TAG_VAR), timeout=LEAK_WAIT_S)
        if left:
            leaks.kill(left)
            pytest.fail(f"{os.path.basename(_notebook(item))} left {len(left)} process(es) running "
                        f"{LEAK_WAIT_S:g} s after its kernel was shut down (now killed):\n"
                        + "\n".join(f"  {p}" for p in left), pytrace=False)
    return result


def pytest_configure(config: pytest.Config) -> None:
    """Tag this process unless tests/conftest.py did (the notebook run has only this plugin). A tag of another
    process was inherited — from an xdist controller, whose workers must each see only their own processes, or
    from an outer pytest — and is replaced."""
    if os.environ.get(leaks.TAG_VAR, "").split("-")[0] != str(os.getpid()):
        leaks.tag_this_process()
