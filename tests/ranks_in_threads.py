"""Ranks as threads of this process over a HashStore (gloo works across threads): collectives tested without
paying a process start-up per rank."""

import threading

import torch.distributed as dist

from workbench.rank.comm import Comm


class FakeChannel:
    latest_generation = None
    local_address = "127.0.0.1"
    waiting, ops = False, 0  # the heartbeat's clues, kept by Comm.wait
    throttle = pause = None  # a live slow-down, a step boundary: none here

    def __init__(self):
        self.wake = threading.Event()

    def end(self, steps):  # the step the run ends at: no run.finish here
        return steps


def run_ranks(size, body, timeout=60):
    """Run ``body(comm)`` on ``size`` threads, each with its rank's Comm of generation 0; their results in order."""
    store = dist.HashStore()
    results, errors = [None] * size, []

    def worker(rank):
        try:
            comm = Comm(store, FakeChannel(), op_timeout=20)
            comm.join({"gen": 0, "rank": rank, "size": size})
            results[rank] = body(comm)
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(r,)) for r in range(size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
    assert not any(t.is_alive() for t in threads), "a rank thread did not finish in time"
    assert not errors, errors
    return results
