"""Settling the state of a new generation: agree first, then move only what must move.

Every member calls :func:`agree` (one allreduce of a table of each member's progress, step, state digest and
applied buckets, so source and receivers are decided identically everywhere), then :func:`move`: over a group of
the source and the receivers only, a JSON header, then each tensor's raw buffer broadcast in place (no pickle).
Members equal to the source receive nothing. The digest is a checksum over raw bytes (any single bit flip
changes it). A member dying meanwhile raises :class:`~.comm.GenerationChanged`. Details: docs/internals.md.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Callable
from dataclasses import dataclass

import torch

from workbench.rank.comm import Comm

_MASK = (1 << 63) - 1


def digest(named: list[tuple[str, torch.Tensor]]) -> int:
    """Checksum of a training state (named tensors, in a fixed order); equal states give equal digests."""
    total = 0
    for i, (name, tensor) in enumerate(named):
        value = _bit_sum(tensor)
        value = (value & _MASK) ^ (value >> 63)  # 63 bits kept, bit 63 folded into bit 0: a flip there shows too
        tag = zlib.crc32(f"{name}{tuple(tensor.shape)}{tensor.dtype}".encode())
        total = (total * 1_000_003 + value * (2 * i + 1) + tag) & _MASK
    return total


def _bit_sum(tensor: torch.Tensor) -> int:
    """The sum, modulo 2**64, of a tensor's raw bytes read as 64-bit words (the tail as one short word).

    Flipping bit k of a word changes the sum by 2**k, which is never 0 modulo 2**64: any single flip shows. Read
    as int64 the sum is one native pass over memory (~6 ms for 38M fp32 values here); summing int32 words
    into an int64 accumulator converts every element and costs ~40x more.
    """
    raw = tensor.detach().contiguous().reshape(-1).view(torch.uint8)
    whole = raw.numel() // 8 * 8
    value = int(raw[:whole].view(torch.int64).sum()) if whole else 0
    if whole < raw.numel():
        value += int.from_bytes(raw[whole:].cpu().numpy().tobytes(), "little")
    return value % (1 << 64)


@dataclass
class Agreement:
    rows: list[list[int]]  # per generation rank: score, step, digest, applied
    source: int

    @property
    def receivers(self) -> list[int]:
        """Generation ranks whose state differs from the source's."""
        key = self.rows[self.source][1:]
        return [r for r, row in enumerate(self.rows) if r != self.source and row[1:] != key]

    @property
    def applied(self) -> int:
        """Buckets of the step in flight the source applied (-1: it was not in a step)."""
        return self.rows[self.source][3]


def agree(comm: Comm, score: int, step: int, state_digest: int, applied: int, source: int | None) -> Agreement:
    """Everyone's row (one small allreduce); ``source`` None: the highest score wins, lowest rank on ties."""
    table = torch.zeros(comm.size, 4, dtype=torch.int64)
    table[comm.rank] = torch.tensor([score, step, state_digest, applied], dtype=torch.int64)
    comm.allreduce_now(table)
    rows = table.tolist()
    if source is None:
        best = max(row[0] for row in rows)
        source = next(r for r, row in enumerate(rows) if row[0] == best)
    return Agreement(rows, source)


Placer = Callable[[dict], dict[str, torch.Tensor]]


def move(comm: Comm, agreement: Agreement, named: list[tuple[str, torch.Tensor]] | None, meta: dict | None,
         place: Placer | None, receivers: list[int] | None = None) -> tuple[dict | None, int]:
    """Stream the source's named tensors to the receivers; returns (the header, bytes received).

    Source: ``named`` and ``meta`` (JSON-able). Receivers: ``place(header)`` returns, by name, the tensors to
    receive into (each of the header's shape and dtype) — the rank's own where they fit, fresh ones where not.
    Other members return (None, 0) at once. ``receivers`` overrides the agreement's (members whose state differs):
    gossip replicas differ by design, and only its newcomers receive.
    """
    receivers = agreement.receivers if receivers is None else receivers
    number = comm.next_sync()  # on every member, taking part or not: later transfers' groups keep one name
    if not receivers or (comm.rank != agreement.source and comm.rank not in receivers):
        return None, 0
    group = [agreement.source, *receivers]
    sub = comm.subgroup(f"sync{number}-" + "-".join(map(str, group)), group.index(comm.rank), len(group))
    source = comm.rank == agreement.source
    header = None
    if source:
        header = {"meta": meta, "tensors": [[name, list(t.shape), str(t.dtype).removeprefix("torch.")]
                                            for name, t in named]}
    header = json.loads(sub.broadcast_bytes(json.dumps(header).encode() if source else None, 0))
    if source:
        tensors = [t.detach().contiguous() for _, t in named]
    else:
        targets = place(header)
        tensors = [targets[name] for name, _, _ in header["tensors"]]
    received = 0
    for tensor in tensors:
        if tensor.numel():
            sub.broadcast(tensor, 0)
            received += 0 if source else tensor.numel() * tensor.element_size()
    return header, received


def send_named(comm: Comm, source: int, receivers: list[int],
               named: list[tuple[str, torch.Tensor]] | None) -> dict[str, torch.Tensor] | None:
    """The source's named tensors to ``receivers`` only (:func:`move`, raw buffers into fresh tensors); returns,
    by name, what this rank holds afterwards: the source its own tensors, a receiver what it received, any other
    member None. Every member calls it with the same ``source`` and ``receivers``."""
    received: dict[str, torch.Tensor] = {}

    def place(header: dict) -> dict[str, torch.Tensor]:
        received.update({name: torch.empty(shape, dtype=dtype_of(dtype)) for name, shape, dtype in header["tensors"]})
        return received

    is_source = comm.rank == source
    move(comm, Agreement([[0, 0, 0, 0]] * comm.size, source), named if is_source else None, {} if is_source else None,
         place, receivers)
    if is_source:
        return dict(named or [])
    return received if comm.rank in receivers else None


def dtype_of(name: str) -> torch.dtype:
    return getattr(torch, name)
