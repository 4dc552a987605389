"""Checkpoint alteration (JPDC'24): bit flips into the float datasets of an HDF5 file, and comparison of files.

A contiguous, unfiltered, little-endian dataset is flipped through a memory map at its offset in the file:
no per-value read-modify-write, no decoding of the rest of the file. Other datasets (chunked, compressed) are
read, flipped and written back whole. Checksum attributes are left as they were, so :func:`workbench.checkpoint
.verify` finds the alteration — as it would find a real soft error at rest.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

from workbench.faults.bitflip import Flip, FlipError, FlipLog, apply_masks, draw

FLOAT_KINDS = ("f",)


def float_datasets(path: str | os.PathLike) -> dict[str, tuple[int, str]]:
    """Every float dataset: path -> (number of elements, dtype name)."""
    import h5py

    found: dict[str, tuple[int, str]] = {}
    with h5py.File(path, "r") as f:
        f.visititems(lambda name, obj: found.__setitem__(name, (obj.size, obj.dtype.name))
                     if isinstance(obj, h5py.Dataset) and obj.dtype.kind in FLOAT_KINDS else None)
    return found


def _flip_dataset(path: Path, name: str, indices: np.ndarray, masks: Iterable[int]) -> FlipLog:
    import h5py

    with h5py.File(path, "r") as f:
        ds = f[name]
        if ds.dtype.kind not in FLOAT_KINDS and ds.dtype.kind not in "iu":
            raise FlipError(f"dataset {name!r} holds {ds.dtype}, not numbers")
        offset = ds.id.get_offset()
        raw = offset is not None and ds.chunks is None and ds.compression is None and ds.dtype.byteorder in "<=|"
        dtype, shape = ds.dtype.newbyteorder("<") if raw else ds.dtype, (ds.size,)
        data = None if raw else ds[()]
    if raw:
        data = np.memmap(path, dtype=dtype, mode="r+", offset=offset, shape=shape)
        flips = apply_masks(data, indices, masks, name)
        data.flush()
        del data
        return flips
    flat = np.ascontiguousarray(data).reshape(-1)
    flips = apply_masks(flat, indices, masks, name)
    with h5py.File(path, "r+") as f:
        f[name][...] = flat.reshape(f[name].shape)
    return flips


def alter_checkpoint(path: str | os.PathLike, *, datasets: Iterable[str] | None = None, index: int | None = None,
                     bit: int | None = None, count: int | None = None, probability: float | None = None,
                     bits: Any = None, field: str | None = None, burst: int = 1, xor_mask: int | None = None,
                     seed: int | None = None, out: str | os.PathLike | None = None) -> FlipLog:
    """Flip bits in an HDF5 file, in place or in a copy ``out``; returns the log.

    Either one exact flip (``index`` and ``bit`` in one dataset of ``datasets``), or random flips (``count`` or
    ``probability``, with ``bits``/``field``/``burst``/``xor_mask``/``seed`` as :func:`~.bitflip.inject`) spread
    uniformly over all elements of ``datasets`` (default: every float dataset).
    """
    source = Path(path)
    if not source.is_file():
        raise FlipError(f"{source} does not exist")
    target = Path(out) if out is not None else source
    if out is not None:
        shutil.copyfile(source, target)
    available = float_datasets(target)
    names = list(datasets) if datasets is not None else list(available)
    for name in names:
        if name not in available:
            raise FlipError(f"{name!r} is not a float dataset of {source}; there are: {', '.join(available)}")
    if not names:
        raise FlipError(f"{source} has no float dataset")
    if index is not None or bit is not None:
        if len(names) != 1 or index is None or bit is None:
            raise FlipError("an exact flip needs one dataset, an index and a bit")
        from workbench.faults.bitflip import _check_bit, dtype_name

        _check_bit(dtype_name(np.dtype(available[names[0]][1])), bit)
        return _flip_dataset(target, names[0], np.array([index]), [1 << bit])
    # draw over the concatenated elements of all datasets, then flip each dataset's share through its own view
    sizes = np.array([available[n][0] for n in names])
    dtypes = {available[n][1] for n in names}
    if len(dtypes) > 1:
        raise FlipError(f"the datasets mix {', '.join(sorted(dtypes))}: choose datasets of one dtype (datasets=...)")
    indices, masks = draw(int(sizes.sum()), np.dtype(available[names[0]][1]), count=count,
                          probability=probability, bits=bits, field=field, burst=burst, xor_mask=xor_mask, seed=seed)
    starts = np.concatenate([[0], np.cumsum(sizes)])
    logs = []
    for i, name in enumerate(names):
        mine = (indices >= starts[i]) & (indices < starts[i + 1])
        if mine.any():
            logs.append(_flip_dataset(target, name, indices[mine] - starts[i], masks[mine]))
    return FlipLog.concat(logs)


def replay_checkpoint(path: str | os.PathLike, log: Iterable[Flip | dict[str, Any]]) -> FlipLog:
    """Apply a flip log to an HDF5 file again (each entry: its mask at its index of its dataset)."""
    entries = [e if isinstance(e, Flip) else Flip.from_dict(e) for e in log]
    done = []
    for name in dict.fromkeys(e.target for e in entries):
        mine = [e for e in entries if e.target == name]
        done.append(_flip_dataset(Path(path), name, np.array([e.index for e in mine]),
                                  np.array([e.mask for e in mine], dtype=np.uint64)))
    return FlipLog.concat(done)


def compare_checkpoints(a: str | os.PathLike, b: str | os.PathLike) -> list[dict[str, Any]]:
    """Per numeric dataset present in both: values whose bits differ, max |a-b| and L2 distance (inf where a
    difference is not finite)."""
    import h5py

    rows = []
    with h5py.File(a, "r") as fa, h5py.File(b, "r") as fb:
        names: list[str] = []
        fa.visititems(lambda n, o: names.append(n) if isinstance(o, h5py.Dataset) and o.dtype.kind in "fiu" else None)
        for name in names:
            if name not in fb or fb[name].shape != fa[name].shape:
                rows.append({"dataset": name, "changed": None, "max_abs_diff": None, "l2": None,
                             "note": "missing or reshaped in b"})
                continue
            x, y = np.ascontiguousarray(fa[name][()]).reshape(-1), np.ascontiguousarray(fb[name][()]).reshape(-1)
            changed = int(np.count_nonzero(x.view(f"u{x.itemsize}") != y.view(f"u{y.itemsize}")))
            with np.errstate(invalid="ignore", over="ignore"):
                diff = np.abs(x.astype(np.float64) - y.astype(np.float64))
            diff[np.isnan(diff) & (x.view(f"u{x.itemsize}") != y.view(f"u{y.itemsize}"))] = np.inf
            diff = np.nan_to_num(diff, nan=0.0)
            with np.errstate(over="ignore"):
                l2 = float(np.sqrt(np.sum(diff**2))) if changed else 0.0
            rows.append({"dataset": name, "changed": changed, "max_abs_diff": float(diff.max()) if len(diff) else 0.0,
                         "l2": l2})
    return rows
