"""Two tiers of one suite, loaded by ``pyproject.toml`` (``-p tiers``): ``make test`` runs the fast tier (the
developer's loop: within 10 minutes on 2 cores), ``make test-slow`` the slow one (whole campaigns at small scale,
the Slurm cluster, the browser, requeues, peers' restarts); CI runs both, so a green CI still means every test ran.

The slow tier is one reviewed file, ``tests/slow.txt``: node ids, or a path (a notebook, a directory ending in
``/``), each with the seconds it took. ``tests/test_tiers.py`` fails on an entry that matches no test, so the list
cannot rot; a fast-tier test that took longer than ``FAST_LIMIT_S`` is named at the session's end, and under
``CI=true`` it fails the session: the fast tier's 10 minutes are held test by test.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from ci_guard import in_ci

SLOW_LIST = Path(__file__).with_name("slow.txt")

# a fast-tier test slower than this belongs in slow.txt (named in the session's summary; under CI it fails);
# WORKBENCH_FAST_LIMIT_S lowers it for tests/test_tiers.py's planted slow test
FAST_LIMIT_S = float(os.environ.get("WORKBENCH_FAST_LIMIT_S", "30"))

_slow_in_fast: list[tuple[str, float]] = []


def entries(text: str | None = None) -> list[str]:
    """The slow tier's entries: each line's first field; ``#`` starts a comment."""
    text = SLOW_LIST.read_text() if text is None else text
    return [line.split("#", 1)[0].split()[0] for line in text.splitlines() if line.split("#", 1)[0].strip()]


def matches(entry: str, nodeid: str) -> bool:
    """Whether ``entry`` (a node id, a file or a directory ending in ``/``) covers the test ``nodeid``."""
    if entry.endswith("/"):
        return nodeid.startswith(entry)
    return nodeid == entry or nodeid.startswith(entry + "::") or nodeid.startswith(entry + "[")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "slow: the slow tier (tests/slow.txt): make test-slow runs it, make test not")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    listed = entries()
    for item in items:
        if any(matches(entry, item.nodeid) for entry in listed):
            item.add_marker(pytest.mark.slow)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.when == "call" and report.duration > FAST_LIMIT_S and "slow" not in report.keywords:
        _slow_in_fast.append((report.nodeid, report.duration))


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    for nodeid, seconds in _slow_in_fast:
        terminalreporter.write_line(f"{'FAILED ' if in_ci() else ''}slow for the fast tier ({seconds:.0f} s > "
                                    f"{FAST_LIMIT_S:g} s): {nodeid} - list it in tests/slow.txt", yellow=not in_ci(),
                                    red=in_ci())


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if _slow_in_fast and in_ci() and exitstatus == 0:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED

