"""Generation-numbered process groups and waits that notice a new generation.

Each rank builds a standalone ``ProcessGroupGloo`` over ``PrefixStore(f"gen{g}", store)``; there is no global
default group. Collectives are issued asynchronously and waited for in :meth:`Comm.wait`, which raises
:class:`GenerationChanged` as soon as the supervisor announces a newer generation (gloo only tells a dead rank's
ring neighbours). On failure the old group is abandoned, not destroyed (destroying a group with a stuck collective
blocks until it times out), and kept referenced so its destructor never runs mid-run.
"""

from __future__ import annotations

import functools
import os
import threading
import time
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from workbench.base.errors import WorkbenchError
from workbench.rank.channel import Channel

_RENDEZVOUS_TIMEOUT = timedelta(seconds=120)
_WAIT_SLICE = timedelta(milliseconds=5)  # how often a waiting rank looks for a newer generation


@functools.cache
def _gloo_device(address: str) -> Any:
    interface = os.environ.get("GLOO_SOCKET_IFNAME")  # the user's choice wins, as in torch.distributed
    if interface:
        return dist.ProcessGroupGloo.create_device(interface=interface)
    return dist.ProcessGroupGloo.create_device(hostname=address)


def _gloo_options(address: str) -> dist.ProcessGroupGloo._Options:
    """Groups listen on ``address``: the one this rank reaches the supervisor from (see Channel.local_address),
    so a run on one machine stays on 127.0.0.1 and a run over several hosts uses the interface between them."""
    options = dist.ProcessGroupGloo._Options()
    options._devices = [_gloo_device(address)]
    options._timeout = _RENDEZVOUS_TIMEOUT
    return options


class GenerationChanged(WorkbenchError):
    """The supervisor announced a newer generation while this rank was waiting."""


class CommError(WorkbenchError):
    """A collective failed or timed out and no new generation came to replace the group."""


class Comm:
    def __init__(self, store: dist.Store, channel: Channel, op_timeout: float) -> None:
        self.store = store
        self.channel = channel
        self.op_timeout = op_timeout
        self.gen = -1
        self.rank = 0
        self.size = 1
        self.group: dist.ProcessGroupGloo | None = None
        self._abandoned: list[Any] = []  # old groups, kept alive on purpose (see module docstring)
        self._links: dict[str, Comm] = {}  # two-member groups of this generation (see link())
        self._syncs = 0  # state transfers of this generation (each names its group, see transfer.move)
        self.path = ""  # a subgroup's name under its generation: its own subgroups are keyed below it

    def join(self, assignment: dict[str, Any]) -> None:
        """Build the group of ``assignment['gen']``, blocking until all its members have joined.

        The gloo constructor cannot be interrupted, and a member that dies during the rendezvous would hold the
        others for the whole rendezvous timeout; so it runs on a helper thread while this one watches for a
        newer generation (the abandoned constructor ends with its timeout, harmlessly).
        """
        if self.group is not None:
            self._abandoned.append(self.group)
            self.group = None
        self.gen, self.rank, self.size = assignment["gen"], assignment["rank"], assignment["size"]
        self._links = {}
        self._syncs = 0
        self.group = self._build(f"gen{self.gen}", self.rank, self.size)

    def next_sync(self) -> int:
        """A number for the next state transfer of this generation (the same on every member)."""
        self._syncs += 1
        return self._syncs

    def subgroup(self, name: str, rank: int, size: int) -> Comm:
        """A group of some members of this generation (e.g. one pipeline stage's replicas), keyed
        ``gen{g}/{name}``; it waits and notices new generations exactly like this one. Every member of the
        subgroup must call this with the same ``name`` and ``size``."""
        sub = Comm(self.store, self.channel, self.op_timeout)
        sub.gen, sub.rank, sub.size, sub.path = self.gen, rank, size, f"{self.path}{name}/"
        sub.group = self._build(f"gen{self.gen}/{self.path}{name}", rank, size) if size > 1 else None
        self._abandoned.append(sub)
        return sub

    def _build(self, prefix_key: str, rank: int, size: int) -> dist.ProcessGroupGloo:
        # a connection of its own: a store client answers one request at a time, and an abandoned rendezvous (a
        # member died before the supervisor saw it) waits on its key until its timeout, holding the next one back
        prefix = dist.PrefixStore(prefix_key, self.store.clone())
        built: dict[str, Any] = {}
        done = threading.Event()

        def build() -> None:
            try:
                built["group"] = dist.ProcessGroupGloo(prefix, rank, size, _gloo_options(self.channel.local_address))
            except Exception as exc:  # noqa: BLE001 - handed to the waiting thread
                built["error"] = exc
            done.set()

        threading.Thread(target=build, name=f"wb-join-{prefix_key}", daemon=True).start()
        while not done.wait(0.005):
            if self.newer_generation():
                raise GenerationChanged()
        if "error" in built:
            # a member that died (or left for a newer generation) during the rendezvous refuses or drops our
            # connection before the supervisor has seen its death: the generation that replaces it follows
            self._await_new_generation(RuntimeError(f"could not join {prefix_key}: {built['error']}"),
                                       "the group could not be built")
        return built["group"]

    def newer_generation(self) -> bool:
        latest = self.channel.latest_generation
        return latest is not None and latest["gen"] > self.gen

    def check(self) -> None:
        if self.newer_generation():
            raise GenerationChanged()

    def wait(self, work: dist.Work, grace: float = 0.0) -> None:
        """Wait for ``work``; raise GenerationChanged when a newer generation is announced meanwhile, after giving
        the work ``grace`` seconds more to complete (a dead member's share may still be on its way to a rank that
        the load slowed: a strategy that applies each completed sum takes it).

        The wait itself happens in C++ (``Work.wait`` with a short timeout, GIL released): a Python-side wait on a
        completion callback cost ~0.2 ms of thread wake-up per collective, 10 % of a small model's step. A timed
        out wait leaves the work intact; between slices the rank looks for a newer generation. The heartbeat says
        the rank waits meanwhile (the progress watchdog's clue).
        """
        self.channel.ops += 1
        self.channel.waiting = True
        try:
            self._wait(work, grace)
        finally:
            self.channel.waiting = False

    def _wait(self, work: dist.Work, grace: float) -> None:
        deadline = time.monotonic() + self.op_timeout
        while True:
            if self.newer_generation():
                if grace > 0 and _completes_within(work, grace):
                    return
                raise GenerationChanged()
            try:
                work.wait(_WAIT_SLICE)
                return
            except RuntimeError as exc:
                if work.is_completed():  # finished with an error, or just after the slice ended
                    try:
                        work.wait()
                        return
                    except RuntimeError as failure:
                        # a peer's connection broke (gloo tells ring neighbours); the new generation follows
                        self._await_new_generation(failure)
                if time.monotonic() > deadline:
                    raise CommError(f"a collective of generation {self.gen} did not complete in "
                                    f"{self.op_timeout:g} s") from exc

    def _await_new_generation(self, cause: Exception, what: str = "collective failed") -> None:
        deadline = time.monotonic() + self.op_timeout
        while time.monotonic() < deadline:
            if self.newer_generation():
                raise GenerationChanged()
            self.channel.wake.wait(0.1)
            self.channel.wake.clear()
        raise CommError(f"{what} in generation {self.gen} and no new generation came: {cause}")

    def allreduce(self, tensor: torch.Tensor) -> dist.Work:
        return self.group.allreduce([tensor])

    def allreduce_now(self, tensor: torch.Tensor) -> torch.Tensor:
        """Sum ``tensor`` in place over the group and wait (a no-op in a group of one)."""
        if self.size > 1:
            self.wait(self.group.allreduce([tensor]))
        return tensor

    def link(self, peer: int) -> Comm:
        """A two-member group of this rank and ``peer`` (built on first use in this generation, by both).

        Point-to-point traffic goes through these links as broadcasts rather than gloo ``send``/``recv``: a gloo
        send or recv whose wait times out closes its connection ("Application timeout caused pair closure"),
        so those cannot be waited for in slices that watch for a new generation; a collective can.
        Operations on one link must be issued in the same order by both members.
        """
        low, high = sorted((self.rank, peer))
        key = f"link{low}-{high}"
        if key not in self._links:
            self._links[key] = self.subgroup(key, 0 if self.rank == low else 1, 2)
        return self._links[key]

    def prepare_links(self, peers: list[int]) -> None:
        """Build the links to ``peers`` now, in one global order (by member pair), so that ranks building
        several links at once never wait on each other in a cycle."""
        for peer in sorted(set(peers) - {self.rank}, key=lambda q: (min(q, self.rank), max(q, self.rank))):
            self.link(peer)

    def send(self, tensor: torch.Tensor, dst: int) -> dist.Work:
        """Start sending ``tensor`` to ``dst`` (keep it alive and unchanged until the returned work is waited)."""
        link = self.link(dst)
        return link.group.broadcast(tensor, link.rank)

    def recv(self, tensor: torch.Tensor, src: int) -> torch.Tensor:
        """Receive into ``tensor`` from ``src`` and wait for it."""
        self.wait(self.recv_async(tensor, src))
        return tensor

    def recv_async(self, tensor: torch.Tensor, src: int) -> dist.Work:
        link = self.link(src)
        return link.group.broadcast(tensor, 1 - link.rank)

    def broadcast(self, tensor: torch.Tensor, root: int) -> None:
        self.wait(self.group.broadcast(tensor, root))

    def broadcast_bytes(self, payload: bytes | None, root: int) -> bytes:
        """Broadcast a byte string from ``root`` (length first, then the bytes)."""
        length = torch.tensor([len(payload) if self.rank == root else 0], dtype=torch.int64)
        self.broadcast(length, root)
        if self.rank == root:
            buffer = torch.frombuffer(bytearray(payload), dtype=torch.uint8)
        else:
            buffer = torch.empty(int(length.item()), dtype=torch.uint8)
        self.broadcast(buffer, root)
        return buffer.numpy().tobytes()


def _completes_within(work: dist.Work, seconds: float) -> bool:
    """Whether ``work`` completes without error within ``seconds``."""
    try:
        work.wait(timedelta(seconds=seconds))
        return True
    except RuntimeError:
        return False
