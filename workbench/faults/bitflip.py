"""Exact IEEE-754 bit flips in torch tensors and numpy arrays, vectorised through an integer view.

Bits are numbered LSB-0, as IEEE does: for float32 bit 31 is the sign, 30..23 the exponent, 22..0 the mantissa
(float16: 15 / 14..10 / 9..0; bfloat16: 15 / 14..7 / 6..0; float64: 63 / 62..52 / 51..0). Note the peer tool
``hdf5_corrupter`` numbers bits MSB-first (its bit 0 is the sign): its bit ``k`` is our ``width - 1 - k``.

Every flip is recorded as a :class:`Flip` (target, flat index, XOR mask, old and new value); ``replay`` applies
a log again, exactly. Flips happen in place on the memory of the tensor or array: nothing is copied per value.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch

from workbench.base.errors import WorkbenchError


class FlipError(WorkbenchError, ValueError):
    """A flip that cannot be done: bad bit, index, dtype or options."""


class FlipLog(Sequence):
    """The log of many flips, held as arrays (no Python object per flip); items are :class:`Flip`."""

    def __init__(self, targets: list[tuple[str, int]], indices: np.ndarray, masks: np.ndarray, old: np.ndarray,
                 new: np.ndarray) -> None:
        self.targets = targets  # (target name, number of consecutive entries) runs
        self.indices, self.masks, self.old, self.new = indices, masks, old, new
        self._names = np.repeat(np.arange(len(targets)), [n for _, n in targets]) if targets else np.zeros(0, int)

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, i: int) -> Flip:  # type: ignore[override]
        if isinstance(i, slice):
            return [self[k] for k in range(*i.indices(len(self)))]
        if i < 0:
            i += len(self)
        return Flip(self.targets[int(self._names[i])][0], int(self.indices[i]), int(self.masks[i]),
                    float(self.old[i]), float(self.new[i]))

    @classmethod
    def concat(cls, logs: list[FlipLog]) -> FlipLog:
        logs = [log for log in logs if len(log)]
        if not logs:
            return cls([], np.zeros(0, np.int64), np.zeros(0, np.uint64), np.zeros(0), np.zeros(0))
        return cls([t for log in logs for t in log.targets], np.concatenate([g.indices for g in logs]),
                   np.concatenate([g.masks for g in logs]), np.concatenate([g.old for g in logs]),
                   np.concatenate([g.new for g in logs]))


# dtype -> (width, sign bit, exponent bits (high, low), mantissa bits (high, low))
_FLOAT_LAYOUT = {
    "float64": (64, 63, (62, 52), (51, 0)),
    "float32": (32, 31, (30, 23), (22, 0)),
    "float16": (16, 15, (14, 10), (9, 0)),
    "bfloat16": (16, 15, (14, 7), (6, 0)),
}
_INT_WIDTH = {"int8": 8, "uint8": 8, "int16": 16, "uint16": 16, "int32": 32, "uint32": 32, "int64": 64, "uint64": 64}
_UINT = {8: np.uint8, 16: np.uint16, 32: np.uint32, 64: np.uint64}
_TORCH_INT = {8: torch.uint8, 16: torch.int16, 32: torch.int32, 64: torch.int64}
FIELDS = ("sign", "exponent", "mantissa")


@dataclass(frozen=True)
class Flip:
    """One injected fault: ``value[index] ^= mask`` in ``target``; ``bits`` are the set bits of the mask."""

    target: str
    index: int
    mask: int
    old: float
    new: float

    @property
    def bits(self) -> tuple[int, ...]:
        return tuple(b for b in range(self.mask.bit_length()) if self.mask >> b & 1)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "bits": list(self.bits)}

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> Flip:
        return cls(values["target"], int(values["index"]), int(values["mask"]), float(values["old"]),
                   float(values["new"]))


def dtype_name(x: torch.Tensor | np.ndarray | np.dtype | torch.dtype) -> str:
    dtype = x.dtype if isinstance(x, (torch.Tensor, np.ndarray)) else x
    name = str(dtype).replace("torch.", "")
    if name not in _FLOAT_LAYOUT and name not in _INT_WIDTH:
        allowed = ", ".join([*_FLOAT_LAYOUT, *_INT_WIDTH])
        raise FlipError(f"dtype {name} cannot be flipped: allowed {allowed}")
    return name


def width(dtype: Any) -> int:
    name = dtype_name(dtype)
    return _FLOAT_LAYOUT[name][0] if name in _FLOAT_LAYOUT else _INT_WIDTH[name]


def bit_field(dtype: Any, bit: int) -> str:
    """``sign``, ``exponent`` or ``mantissa`` for a float dtype; ``sign`` or ``value`` for an integer dtype."""
    name = dtype_name(dtype)
    check_bit(name, bit)
    if name in _FLOAT_LAYOUT:
        _, sign, (e_hi, e_lo), _ = _FLOAT_LAYOUT[name]
        return "sign" if bit == sign else "exponent" if e_lo <= bit <= e_hi else "mantissa"
    return "sign" if not name.startswith("uint") and bit == _INT_WIDTH[name] - 1 else "value"


def field_bits(dtype: Any, field: str) -> list[int]:
    """The bits of a field: ``bit_field(dtype, b) == field``."""
    if field not in (*FIELDS, "value"):
        raise FlipError(f"field {field!r} is not known: allowed {', '.join(FIELDS)}")
    return [b for b in range(width(dtype)) if bit_field(dtype, b) == field]


def check_bit(name: str, bit: int) -> None:
    """FlipError unless ``bit`` is a bit position (LSB-0) of the dtype named ``name``."""
    w = _FLOAT_LAYOUT[name][0] if name in _FLOAT_LAYOUT else _INT_WIDTH[name]
    if not isinstance(bit, (int, np.integer)) or not 0 <= bit < w:
        raise FlipError(f"bit {bit!r} is out of range for {name}: allowed 0..{w - 1} (LSB-0)")


def bits_view(x: torch.Tensor | np.ndarray) -> np.ndarray:
    """A flat unsigned-integer numpy view sharing ``x``'s memory (no copy)."""
    w = width(x.dtype)
    if isinstance(x, torch.Tensor):
        if x.device.type != "cpu" or not x.is_contiguous():
            raise FlipError("tensor must be a contiguous CPU tensor to be flipped in place")
        return x.detach().view(_TORCH_INT[w]).numpy().reshape(-1).view(_UINT[w])
    if not isinstance(x, np.ndarray) or not x.flags.c_contiguous:
        raise FlipError("array must be a C-contiguous numpy array to be flipped in place")
    return x.reshape(-1).view(_UINT[w])


def _values(x: torch.Tensor | np.ndarray, indices: np.ndarray) -> np.ndarray:
    flat = x.detach().reshape(-1) if isinstance(x, torch.Tensor) else x.reshape(-1)
    picked = flat[torch.as_tensor(indices)] if isinstance(x, torch.Tensor) else flat[indices]
    return picked.double().numpy() if isinstance(x, torch.Tensor) else picked.astype(np.float64)


def apply_masks(x: torch.Tensor | np.ndarray, indices: Iterable[int] | np.ndarray,
                masks: Iterable[int] | np.ndarray, target: str = "") -> FlipLog:
    """XOR ``masks`` into the elements at flat ``indices``, in place; returns the log."""
    indices = np.asarray(indices if isinstance(indices, np.ndarray) else list(indices), dtype=np.int64)
    masks_arr = np.asarray(masks if isinstance(masks, np.ndarray) else list(masks), dtype=np.uint64)
    if isinstance(x, torch.Tensor) and x.device.type != "cpu":
        return _apply_gathered(x, indices, masks_arr, target)
    view = bits_view(x)
    masks_arr = masks_arr.astype(view.dtype)
    _check_range(indices, view.size, target)
    with np.errstate(all="ignore"):  # the values are meant to become NaN or Inf sometimes
        old = _values(x, indices)
        np.bitwise_xor.at(view, indices, masks_arr)  # .at: two flips of one element both apply
        new = _values(x, indices)
    return FlipLog([(target, len(indices))], indices, masks_arr.astype(np.uint64), old, new)


def _check_range(indices: np.ndarray, size: int, target: str) -> None:
    if len(indices) and (indices.min() < 0 or indices.max() >= size):
        bad = int(indices[(indices < 0) | (indices >= size)][0])
        raise FlipError(f"index {bad} is out of range for {target or 'the tensor'} with {size} elements")


def _apply_gathered(x: torch.Tensor, indices: np.ndarray, masks: np.ndarray, target: str) -> FlipLog:
    """A tensor off the CPU (a GPU's): the elements hit come to the host, are flipped there exactly as a CPU
    tensor's would be (the same bits, the same values), and go back; nothing else moves."""
    if not x.is_contiguous():
        raise FlipError(f"{target or 'the tensor'} must be contiguous to be flipped in place")
    flat = x.detach().view(-1)
    _check_range(indices, flat.numel(), target)
    unique, inverse = np.unique(indices, return_inverse=True)
    where = torch.from_numpy(unique).to(x.device)
    host = flat[where].cpu()  # one element per distinct index: two flips of one element both apply, as on the CPU
    done = apply_masks(host, inverse, masks, target)
    flat[where] = host.to(x.device)
    return FlipLog([(target, len(indices))], indices, done.masks, done.old, done.new)


def flip(x: torch.Tensor | np.ndarray, index: int, bit: int, target: str = "") -> Flip:
    """Flip bit ``bit`` (LSB-0) of element ``index`` (flat) of ``x`` in place."""
    check_bit(dtype_name(x), bit)
    return apply_masks(x, [index], [1 << bit], target)[0]


def draw(n: int, dtype: Any, *, count: int | None = None, probability: float | None = None,
         bits: Iterable[int] | tuple[int, int] | None = None, field: str | None = None, burst: int = 1,
         xor_mask: int | None = None, seed: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The (flat indices, XOR masks) of a random injection into ``n`` elements of ``dtype`` (see :func:`inject`)."""
    name = dtype_name(dtype)
    w = width(name)
    if (count is None) == (probability is None):
        raise FlipError("give exactly one of count or probability")
    rng = np.random.default_rng(seed)
    if count is not None:
        if not 0 <= count <= n:
            raise FlipError(f"count {count} is out of range: the target has {n} elements")
        indices = np.sort(rng.choice(n, size=count, replace=False))
    else:
        if not 0 <= probability <= 1:
            raise FlipError(f"probability {probability} must be in [0, 1]")
        indices = np.sort(rng.choice(n, size=rng.binomial(n, probability), replace=False))
    if xor_mask is not None:
        if not 0 < xor_mask < (1 << w):
            raise FlipError(f"xor_mask {xor_mask:#x} does not fit {name} ({w} bits)")
        return indices, np.full(len(indices), xor_mask, dtype=np.uint64)
    candidates = _candidate_bits(name, bits, field)
    if burst < 1 or burst > w:
        raise FlipError(f"burst {burst} must be 1..{w}")
    low = rng.choice(np.asarray(candidates, dtype=np.uint64), size=len(indices))
    span = np.minimum(np.uint64(burst), np.uint64(w) - low)  # bits of the burst that fit above ``low``
    ones = np.where(span >= 64, np.uint64(2**64 - 1), (np.uint64(1) << (span % np.uint64(64))) - np.uint64(1))
    return indices, ones << low


def inject(x: torch.Tensor | np.ndarray, *, count: int | None = None, probability: float | None = None,
           bits: Iterable[int] | tuple[int, int] | None = None, field: str | None = None, burst: int = 1,
           xor_mask: int | None = None, seed: int | None = None, target: str = "") -> FlipLog:
    """Random flips: ``count`` distinct elements (or each element with ``probability``), each hit at one bit
    drawn from ``bits`` (an iterable, or an inclusive ``(low, high)`` range; default every bit) or ``field``,
    widened to ``burst`` adjacent bits upwards; or with a fixed ``xor_mask``. Reproducible from ``seed``."""
    n = x.numel() if isinstance(x, torch.Tensor) else x.size
    indices, masks = draw(n, x.dtype, count=count, probability=probability, bits=bits, field=field, burst=burst,
                          xor_mask=xor_mask, seed=seed)
    return apply_masks(x, indices, masks, target)


def _candidate_bits(name: str, bits: Iterable[int] | tuple[int, int] | None, field: str | None) -> list[int]:
    if field is not None:
        return field_bits(name, field)
    if bits is None:
        return list(range(width(name)))
    if isinstance(bits, tuple) and len(bits) == 2:
        bits = range(bits[0], bits[1] + 1)
    bits = list(bits)
    for b in bits:
        check_bit(name, b)
    if not bits:
        raise FlipError("no bits to choose from")
    return bits


def parse_bits(text: str) -> tuple[int, int] | list[int]:
    """``"23-30"`` -> (23, 30); ``"0,5,31"`` -> [0, 5, 31]."""
    try:
        if "-" in text:
            low, high = (int(v) for v in text.split("-", 1))
            return (low, high)
        return [int(v) for v in text.split(",")]
    except ValueError:
        raise FlipError(f"bits {text!r} must be a range like 23-30 or a list like 0,5,31") from None


def replay(log: Iterable[Flip | dict[str, Any]], targets: dict[str, torch.Tensor | np.ndarray]) -> FlipLog:
    """Apply a log again (each entry's XOR mask at its index, in ``targets[entry.target]``)."""
    entries = [e if isinstance(e, Flip) else Flip.from_dict(e) for e in log]
    done = []
    for name in dict.fromkeys(e.target for e in entries):
        if name not in targets:
            raise FlipError(f"log names target {name!r}, which is not among {sorted(targets)}")
        mine = [e for e in entries if e.target == name]
        done.append(apply_masks(targets[name], [e.index for e in mine], [e.mask for e in mine], name))
    return FlipLog.concat(done)
