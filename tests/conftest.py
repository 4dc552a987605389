from pathlib import Path

import leaks
import pytest
from ci_guard import in_ci
from hypothesis import settings
from hypothesis.database import DirectoryBasedExampleDatabase

# Hypothesis: under CI the examples are derandomized (drawn from a hash of each test: every CI run tries the same
# ones, so a failure found there repeats on every run and on a developer's machine with CI=true). Hypothesis refuses
# a database with derandomize=True (the same examples every time make it redundant), so the examples database is
# the developers': one directory in the repository, .hypothesis/ (git-ignored), named here since pytest runs with
# -p no:cacheprovider; a failing example found by a random run is replayed first on the next.
HYPOTHESIS_DB = DirectoryBasedExampleDatabase(Path(__file__).resolve().parent.parent / ".hypothesis" / "examples")
settings.register_profile("ci", derandomize=True, database=None)
settings.register_profile("dev", database=HYPOTHESIS_DB)
settings.load_profile("ci" if in_ci() else "dev")

# Every process this session starts inherits the tag, so another user's suite on the same machine is not ours.
TAG = leaks.tag_this_process()
# The project's processes that were there before the session (a developer's own Jupyter, say): never reported.
_AT_START = {p.key for p in leaks.project_processes()}
# a process of a test may take this long to go (a kernel shutting down, ranks reaped). Measured by
# tools/teardown_times.py (20 each of a 4-rank run, a killed 4-rank run, a kernel with a 2-rank run, 2 loaded cores):
# at most 0.13 s; 3 s is 23x that, and costs nothing unless a test leaks (the wait ends when the processes do)
LEAK_WAIT_S = 3.0


def rank_processes(parent: int | None = None) -> list[str]:
    """``"pid ppid args"`` of the workbench rank processes: all of them, or those below ``parent`` in the process
    tree (a rank is a child of its supervisor's process, or of that process's rank template)."""
    procs = leaks.all_processes()
    below = None if parent is None else leaks.descendants(parent, procs)
    return [f"{p.pid} {p.ppid} {p.args}" for p in leaks.project_processes(procs=procs)
            if "workbench.rank" in p.args and (below is None or p.pid in below)]


def _check_leaks(before: set[tuple[int, int]], what: str) -> None:
    """Fail if project processes started since ``before`` are still there after a bounded wait; kill them so a
    leak does not fail the tests after it too."""
    left = leaks.wait_gone(before | _AT_START, TAG, timeout=LEAK_WAIT_S)
    if left:
        leaks.kill(left)
        pytest.fail(f"{what} left {len(left)} process(es) running {LEAK_WAIT_S:g} s after it ended (now killed):\n"
                    + "\n".join(f"  {p}" for p in left), pytrace=False)


def _snapshot() -> set[tuple[int, int]]:
    return {p.key for p in leaks.project_processes(TAG)}


@pytest.fixture(autouse=True, scope="module")
def _no_leaks_from_module():
    """The same check around a test module: catches what module-scoped fixtures (runs shared by its tests) leave."""
    before = _snapshot()
    yield
    _check_leaks(before, "this test module (its module-scoped fixtures)")


@pytest.fixture(autouse=True)
def _no_leaks_from_test():
    """Every test: the project's processes it started — ranks, templates, peers, CLI runs and sweeps, papermill
    workers, Jupyter kernels and servers, found by command line whoever their parent is — are gone within
    ``LEAK_WAIT_S`` after it; this process's own idle rank template may stay (the next run reuses it)."""
    before = _snapshot()
    yield
    _check_leaks(before, "the test")


@pytest.fixture
def no_leaks():
    """Kept for the tests that ask for it: every test is checked now (``_no_leaks_from_test``)."""
    yield

