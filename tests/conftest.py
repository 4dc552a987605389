import os
import subprocess

import pytest


def rank_processes(parent: int | None = None) -> list[str]:
    """Command lines of workbench rank processes: all of them, or the descendants of ``parent`` (a forked rank is
    a child of its rank template, which is a child of the process that ran it)."""
    out = subprocess.run(["ps", "-eo", "pid,ppid,stat,args"], capture_output=True, text=True, check=True).stdout
    rows = [line.split(None, 3) for line in out.splitlines()[1:]]
    ppid = {int(r[0]): int(r[1]) for r in rows if len(r) >= 2}

    def descends(pid: int) -> bool:
        for _ in range(8):
            pid = ppid.get(pid, 0)
            if pid == parent:
                return True
            if pid <= 1:
                return False
        return False

    return [" ".join(r) for r in rows if len(r) == 4 and "workbench.rank" in r[3] and "ps -eo" not in r[3]
            and (parent is None or descends(int(r[0])))]


@pytest.fixture
def no_leaks():
    """Fails the test if it leaves behind any rank process it started (ranks are children of this process)."""
    yield
    left = rank_processes(parent=os.getpid())
    assert not left, f"rank processes left behind: {left}"
