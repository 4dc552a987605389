import subprocess

import pytest


def rank_processes() -> list[str]:
    """Command lines of every workbench rank process on this machine."""
    out = subprocess.run(["ps", "-eo", "pid,stat,args"], capture_output=True, text=True, check=True).stdout
    return [line for line in out.splitlines() if "workbench.rank" in line and "ps -eo" not in line]


@pytest.fixture
def no_leaks():
    """Fails the test if it leaves any rank process behind."""
    before = set(rank_processes())
    yield
    left = [p for p in rank_processes() if p not in before]
    assert not left, f"rank processes left behind: {left}"
