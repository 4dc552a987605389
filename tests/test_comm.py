"""Generation-aware group building (workbench/rank/comm.py) when a member vanishes during the rendezvous."""

from __future__ import annotations

import threading
import time

import pytest
import torch.distributed as dist

from workbench.rank import comm as comm_module
from workbench.rank.comm import Comm, CommError, GenerationChanged


class _Channel:
    local_address = "127.0.0.1"
    waiting, ops = False, 0  # the heartbeat's clues, kept by Comm.wait

    def __init__(self) -> None:
        self.wake = threading.Event()
        self.latest_generation = None


@pytest.fixture
def refused(monkeypatch):
    """gloo's constructor fails as it does when a member's listening socket is gone (it died, or left)."""
    def fail(*args, **kwargs):  # noqa: ANN002, ANN003
        raise RuntimeError("Gloo connectFullMesh failed ... SO_ERROR: Connection refused")

    monkeypatch.setattr(comm_module.dist, "ProcessGroupGloo", type("PG", (), {"__new__": fail}))
    monkeypatch.setattr(comm_module, "_gloo_options", lambda address: None)


def test_a_refused_rendezvous_waits_for_the_generation_that_replaces_it(refused) -> None:
    channel = _Channel()
    comm = Comm(dist.HashStore(), channel, op_timeout=30.0)

    def announce() -> None:
        time.sleep(0.1)  # the supervisor sees the death a little after the refused connection
        channel.latest_generation = {"gen": 4}
        channel.wake.set()

    threading.Thread(target=announce, daemon=True).start()
    started = time.monotonic()
    with pytest.raises(GenerationChanged):
        comm.join({"gen": 3, "rank": 1, "size": 4})
    assert time.monotonic() - started < 5


def test_a_refused_rendezvous_with_no_new_generation_is_an_error_within_the_bound(refused) -> None:
    comm = Comm(dist.HashStore(), _Channel(), op_timeout=0.3)
    started = time.monotonic()
    with pytest.raises(CommError, match="could not join gen3.*Connection refused"):
        comm.join({"gen": 3, "rank": 1, "size": 4})
    assert time.monotonic() - started < 3
