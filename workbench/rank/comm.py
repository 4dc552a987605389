"""Generation-numbered process groups and waits that notice a new generation.

Protocol: the supervisor's store holds one key space per generation (``gen{g}/``). Each rank builds a standalone
``ProcessGroupGloo`` over ``PrefixStore(f"gen{g}", store)`` with its rank and size in that generation; there is
no global default group. Collectives are issued asynchronously and waited for in :meth:`Comm.wait`, which
returns when the work completes, and raises :class:`GenerationChanged` as soon as the supervisor announces a
newer generation (gloo only tells a dead rank's ring neighbours; the others would block until the timeout).

On failure: the old group is abandoned, not destroyed (destroying or aborting a gloo group with a stuck
collective blocks until that collective times out); a reference is kept so its destructor never runs mid-run.
The rank process ends with ``os._exit``, so those groups are never torn down by the interpreter either.
"""

from __future__ import annotations

import threading
import time
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from workbench.rank.channel import Channel

_RENDEZVOUS_TIMEOUT = timedelta(seconds=120)
_WAIT_SLICE = timedelta(milliseconds=5)  # how often a waiting rank looks for a newer generation


class GenerationChanged(Exception):
    """The supervisor announced a newer generation while this rank was waiting."""


class CommError(Exception):
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
        prefix = dist.PrefixStore(f"gen{self.gen}", self.store)
        built: dict[str, Any] = {}
        done = threading.Event()

        def build() -> None:
            try:
                built["group"] = dist.ProcessGroupGloo(prefix, self.rank, self.size, _RENDEZVOUS_TIMEOUT)
            except Exception as exc:  # noqa: BLE001 - handed to the waiting thread
                built["error"] = exc
            done.set()

        threading.Thread(target=build, name=f"wb-join-gen{self.gen}", daemon=True).start()
        while not done.wait(0.005):
            if self.newer_generation():
                raise GenerationChanged()
        if "error" in built:
            raise CommError(f"could not join generation {self.gen}: {built['error']}")
        self.group = built["group"]

    def newer_generation(self) -> bool:
        latest = self.channel.latest_generation
        return latest is not None and latest["gen"] > self.gen

    def check(self) -> None:
        if self.newer_generation():
            raise GenerationChanged()

    def wait(self, work: dist.Work) -> None:
        """Wait for ``work``; raise GenerationChanged when a newer generation is announced meanwhile.

        The wait itself happens in C++ (``Work.wait`` with a short timeout, GIL released): a Python-side wait on a
        completion callback cost ~0.2 ms of thread wake-up per collective, 10 % of a small model's step. A timed
        out wait leaves the work intact; between slices the rank looks for a newer generation.
        """
        deadline = time.monotonic() + self.op_timeout
        while True:
            if self.newer_generation():
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

    def _await_new_generation(self, cause: Exception) -> None:
        deadline = time.monotonic() + self.op_timeout
        while time.monotonic() < deadline:
            if self.newer_generation():
                raise GenerationChanged()
            self.channel.wake.wait(0.1)
            self.channel.wake.clear()
        raise CommError(f"collective failed in generation {self.gen} and no new generation came: {cause}")

    def allreduce(self, tensor: torch.Tensor) -> dist.Work:
        return self.group.allreduce([tensor])

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
