"""The supervisor's rendezvous store speaks torch's TCPStore protocol: torch's own client and gloo use it."""

import multiprocessing
import socket
import struct
import threading
import time
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from workbench.base.tcpstore_wire import MAGIC
from workbench.supervisor.store import StoreServer


@pytest.fixture
def server():
    listen = socket.socket()
    listen.bind(("127.0.0.1", 0))
    listen.listen(64)
    store = StoreServer(listen)
    yield store, listen.getsockname()[1]
    store.close()
    listen.close()


def client(port, timeout=5.0):
    return dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=timeout))


def test_torch_clients_get_what_the_supervisor_and_other_clients_set(server):
    store, port = server
    store.set("workbench/control", "127.0.0.1:1234")
    c = client(port)
    assert c.get("workbench/control") == b"127.0.0.1:1234"
    c.set("a", "1")
    assert c.get("a") == b"1" and store.get("a") == b"1"  # (a set has no reply: the get orders them)
    assert (c.add("n", 3), c.add("n", 2), c.get("n")) == (3, 5, b"5")  # kept as its decimal string
    assert c.compare_set("x", "", "v1") == b"v1"  # absent and expected empty: set
    assert c.compare_set("x", "no", "v2") == b"v1"  # mismatch: unchanged
    assert c.compare_set("x", "v1", "v3") == b"v3"
    assert c.check(["a"]) and not c.check(["missing"])
    assert c.num_keys() == 4
    assert c.delete_key("a") and not c.delete_key("a")
    c.append("ap", "x")
    c.append("ap", "y")
    assert c.get("ap") == b"xy"
    c.multi_set(["m1", "m2"], ["1", "2"])
    assert c.multi_get(["m1", "m2"]) == [b"1", b"2"]


def test_a_wait_ends_when_the_key_is_set_and_a_timed_out_wait_is_cancelled(server):
    store, port = server
    c = client(port)
    threading.Timer(0.2, lambda: store.set("late", "ok")).start()
    started = time.monotonic()
    c.wait(["late"])
    assert 0.1 < time.monotonic() - started < 3.0 and c.get("late") == b"ok"
    with pytest.raises(dist.DistStoreError):
        c.wait(["never"], timedelta(seconds=0.2))
    c.set("after", "fine")  # the connection is still in step after the cancelled wait
    assert c.get("after") == b"fine"


def _list_keys_then_barriers(port, name, out):
    """In a process of its own, as a rank: torch's client holds the GIL through list_keys and barrier (a server
    thread in the same process could not answer)."""
    c = client(port)
    keys = sorted(c.list_keys()) if name == 2 else None  # the last caller: the first two wait in barrier "b"
    c.barrier("b", 3)  # three callers: the last releases all
    released = time.time()
    try:
        c.barrier("never", 4, timedelta(seconds=0.2))
        cancelled = False
    except dist.DistStoreError as exc:
        cancelled = "barrier timeout" in str(exc)
    c.set(f"after{name}", "fine")  # the connection is still in step after the cancelled barrier
    out.put((name, keys, released, cancelled, c.get(f"after{name}")))


def test_list_keys_and_barrier_are_answered(server):
    """The two queries torch 2.13's client adds to the older ones: every key (under the client's prefix), and a
    barrier that releases its callers when the n-th arrives (a timed-out one is cancelled, the connection goes on)."""
    store, port = server
    store.set("workbench/control", "127.0.0.1:1234")
    store.set("a", "1")
    context = multiprocessing.get_context("fork")
    results = context.Queue()
    first = [context.Process(target=_list_keys_then_barriers, args=(port, n, results)) for n in range(2)]
    for p in first:
        p.start()
    deadline = time.monotonic() + 30
    while store.data.get("/b") != b"2":  # the first two wait in the barrier
        assert time.monotonic() < deadline, "the first two callers did not reach the barrier"
        time.sleep(0.05)
    late = context.Process(target=_list_keys_then_barriers, args=(port, 2, results))
    late_began = time.time()
    late.start()  # the third caller
    got = sorted(results.get(timeout=30) for _ in range(3))
    for p in (*first, late):
        p.join(10)
    assert got[2][1] == ["a", "b", "workbench/control"]  # the supervisor's keys and the barrier's count
    assert all(released >= late_began for _, _, released, _, _ in got)  # the first two waited for the third
    assert all(cancelled and after == b"fine" for _, _, _, cancelled, after in got)
    assert store.get("b") == b"3" and store.get("never") == b"3"


def _allreduce(port, rank, out):
    pg = dist.ProcessGroupGloo(dist.PrefixStore("gen0", client(port, 20)), rank, 3)
    tensor = torch.ones(4) * (rank + 1)
    pg.allreduce([tensor]).wait()
    out.put((rank, tensor.tolist()))


def test_gloo_groups_rendezvous_through_it(server):
    _, port = server
    context = multiprocessing.get_context("fork")
    results = context.Queue()
    procs = [context.Process(target=_allreduce, args=(port, r, results)) for r in range(3)]
    for p in procs:
        p.start()
    got = sorted(results.get(timeout=30) for _ in procs)
    for p in procs:
        p.join(10)
    assert got == [(r, [6.0] * 4) for r in range(3)]


def test_a_client_that_breaks_the_protocol_is_closed_and_close_ends_everything(server):
    store, port = server
    bad = socket.create_connection(("127.0.0.1", port), timeout=5)
    bad.sendall(b"\x01" + struct.pack("<I", 1))  # a query before VALIDATE
    assert bad.recv(1) == b""  # closed by the server
    good = socket.create_connection(("127.0.0.1", port), timeout=5)
    good.sendall(b"\x00" + struct.pack("<I", MAGIC) + b"\x0d" + struct.pack("<I", 77))  # VALIDATE, PING 77
    assert struct.unpack("<I", good.recv(4))[0] == 77
    store.close()
    assert good.recv(1) == b""  # every connection closed with the server
    assert not store._thread.is_alive()
