import os
import subprocess

import pytest


def rank_processes(parent: int | None = None) -> list[str]:
    """Command lines of workbench rank processes: all of them, or the children of ``parent``."""
    out = subprocess.run(["ps", "-eo", "pid,ppid,stat,args"], capture_output=True, text=True, check=True).stdout
    rows = [line.split(None, 3) for line in out.splitlines()[1:]]
    return [" ".join(r) for r in rows if len(r) == 4 and "workbench.rank" in r[3] and "ps -eo" not in r[3]
            and (parent is None or int(r[1]) == parent)]


@pytest.fixture
def no_leaks():
    """Fails the test if it leaves behind any rank process it started (ranks are children of this process)."""
    yield
    left = rank_processes(parent=os.getpid())
    assert not left, f"rank processes left behind: {left}"
