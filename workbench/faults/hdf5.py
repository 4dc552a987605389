"""Checkpoint alteration (JPDC'24): bit flips into the float datasets of an HDF5 file, and comparison of files.

Flips go through a memory map where a dataset is contiguous and unfiltered (others are read, flipped and written
back); checksum attributes are left as they were, so :func:`workbench.base.checkpoint.verify` finds the alteration.
Validate, then write: :func:`alter_checkpoint` and :func:`replay_checkpoint` check everything first, flip a hidden
copy, write the log, and rename the copy onto the target last; a refused or failed alteration leaves nothing
behind. Details: docs/internals.md.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

from workbench.base.errors import WorkbenchError
from workbench.base.h5files import (
    CHECKPOINT,
    FileKindError,
    atomic_output,
    check_output_place,
    inspect,
    reason,
    require,
)
from workbench.faults.bitflip import Flip, FlipError, FlipLog, apply_masks, check_bit, draw, dtype_name, width

FLOAT_KINDS = ("f",)
Plan = list[tuple[str, np.ndarray, np.ndarray]]  # (dataset, flat indices, XOR masks)


class NotComparable(WorkbenchError):
    """Two files that are not two states of one model: other kinds, or datasets only in either, or reshaped."""


def float_datasets(path: str | os.PathLike) -> dict[str, tuple[int, str]]:
    """Every float dataset of a checkpoint: path -> (number of elements, dtype name)."""
    return {name: (count, dtype) for name, (count, dtype) in _numeric(path).items()
            if np.dtype(dtype).kind in FLOAT_KINDS}


def _numeric(path: str | os.PathLike) -> dict[str, tuple[int, str]]:
    info = require(path, CHECKPOINT, purpose="flips alter checkpoints")
    return {name: (int(np.prod(shape, dtype=np.int64)), dtype) for name, (shape, dtype) in info.datasets.items()
            if _kind(dtype) in "fiu"}


def _kind(dtype: str) -> str:
    try:
        return np.dtype(dtype).kind
    except TypeError:
        return "O"


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
    # through a Python file object, a failed write (a full disk) is an OSError, not a crash in h5py's close
    with open(path, "r+b") as handle, h5py.File(handle, "r+") as f:
        f[name][...] = flat.reshape(f[name].shape)
    return flips


def alter_checkpoint(path: str | os.PathLike, *, datasets: Iterable[str] | None = None, index: int | None = None,
                     bit: int | None = None, count: int | None = None, probability: float | None = None,
                     bits: Any = None, field: str | None = None, burst: int = 1, xor_mask: int | None = None,
                     seed: int | None = None, out: str | os.PathLike | None = None,
                     log: str | os.PathLike | None = None) -> FlipLog:
    """Flip bits in a checkpoint, in place or in a copy ``out``; returns the log, also written to ``log`` (JSON
    lines, :func:`replay_checkpoint` reads them back) before the altered file takes its place.

    Either one exact flip (``index`` and ``bit`` in one dataset of ``datasets``), or random flips (``count`` or
    ``probability``, with ``bits``/``field``/``burst``/``xor_mask``/``seed`` as :func:`~.bitflip.inject`) spread
    uniformly over all elements of ``datasets`` (default: every float dataset). Everything is checked before
    anything is written (see the module docstring): a refused flip leaves no file at ``out`` and no log.
    """
    source = Path(path)
    target = Path(out) if out is not None else source.resolve()  # in place: the file a link points to
    available = float_datasets(source)
    names = list(datasets) if datasets is not None else list(available)
    for name in names:
        if name not in available:
            raise FlipError(f"{name!r} is not a float dataset of {source}; there are: {', '.join(available)}")
    if not names:
        raise FlipError(f"{source} has no float dataset")
    if index is not None or bit is not None:
        if len(names) != 1 or index is None or bit is None:
            raise FlipError("an exact flip needs one dataset, an index and a bit")
        size, dtype = available[names[0]]
        check_bit(dtype_name(np.dtype(dtype)), bit)
        if not isinstance(index, (int, np.integer)) or isinstance(index, bool):
            raise FlipError(f"index {index!r} must be an integer (a flat element index)")
        if not 0 <= index < size:
            raise FlipError(f"index {index} is out of range for {names[0]} with {size} elements (0..{size - 1})")
        plan: Plan = [(names[0], np.array([index], dtype=np.int64), np.array([1 << bit], dtype=np.uint64))]
    else:
        plan = _random_plan(available, names, count=count, probability=probability, bits=bits, field=field,
                            burst=burst, xor_mask=xor_mask, seed=seed)
    return _write_altered(source, target, plan, log)


def _random_plan(available: dict[str, tuple[int, str]], names: list[str], **options: Any) -> Plan:
    """Draw over the concatenated elements of all datasets; each dataset's share, in its own flat indices."""
    sizes = np.array([available[n][0] for n in names])
    dtypes = {available[n][1] for n in names}
    if len(dtypes) > 1:
        raise FlipError(f"the datasets mix {', '.join(sorted(dtypes))}: choose datasets of one dtype (datasets=...)")
    indices, masks = draw(int(sizes.sum()), np.dtype(available[names[0]][1]), **options)
    starts = np.concatenate([[0], np.cumsum(sizes)])
    plan = []
    for i, name in enumerate(names):
        mine = (indices >= starts[i]) & (indices < starts[i + 1])
        if mine.any():
            plan.append((name, indices[mine] - starts[i], masks[mine]))
    return plan


def _write_altered(source: Path, target: Path, plan: Plan, log: str | os.PathLike | None) -> FlipLog:
    """Copy ``source`` to a temporary file beside ``target``, flip it, write ``log``, rename the copy onto
    ``target``; on any failure remove the copy and the log (the target stays as it was)."""
    check_output_place(target)
    if log is not None:
        check_output_place(log)
        if Path(log).resolve() in (source.resolve(), target.resolve()):
            raise FlipError(f"the log {log} would overwrite the checkpoint")
    wrote_log = False
    try:
        with atomic_output(target) as tmp:
            shutil.copyfile(source, tmp)
            shutil.copymode(source, tmp)
            flips = FlipLog.concat([_flip_dataset(tmp, name, indices, masks) for name, indices, masks in plan])
            if log is not None:
                write_log(log, flips)
                wrote_log = True
    except BaseException:
        if wrote_log:
            Path(log).unlink(missing_ok=True)  # type: ignore[arg-type]
        raise
    return flips


def write_log(path: str | os.PathLike, flips: Iterable[Flip]) -> Path:
    """A flip log as JSON lines (one :meth:`~.bitflip.Flip.to_dict` each), written atomically."""
    with atomic_output(path) as tmp, tmp.open("w", encoding="utf-8") as handle:
        for f in flips:
            handle.write(json.dumps(f.to_dict()) + "\n")
    return Path(path)


def replay_checkpoint(path: str | os.PathLike, log: Iterable[Flip | dict[str, Any]],
                      out: str | os.PathLike | None = None) -> FlipLog:
    """Apply a flip log to a checkpoint again (each entry: its mask at its index of its dataset), in place or in
    a copy ``out``; every entry is checked against the file before anything is written."""
    try:
        entries = [e if isinstance(e, Flip) else Flip.from_dict(e) for e in log]
    except (KeyError, TypeError, ValueError) as exc:
        raise FlipError(f"the flip log has an entry that is not a flip: {reason(exc)}") from None
    available = _numeric(path)
    plan: Plan = []
    for name in dict.fromkeys(e.target for e in entries):
        if name not in available:
            raise FlipError(f"the log names dataset {name!r}, which {path} does not hold")
        size, dtype = available[name]
        mine = [e for e in entries if e.target == name]
        bad = next((e for e in mine if not 0 <= e.index < size or not 0 < e.mask < 1 << width(dtype)), None)
        if bad is not None:
            raise FlipError(f"the log's flip of {name}[{bad.index}] (mask {bad.mask:#x}) does not fit its {size} "
                            f"{dtype} elements")
        plan.append((name, np.array([e.index for e in mine], dtype=np.int64),
                     np.array([e.mask for e in mine], dtype=np.uint64)))
    return _write_altered(Path(path), Path(out) if out is not None else Path(path).resolve(), plan, None)


def compare_checkpoints(a: str | os.PathLike, b: str | os.PathLike, strict: bool = True) -> list[dict[str, Any]]:
    """Per numeric dataset present in both: values whose bits differ, max |a-b| and L2 distance (inf where a
    difference is not finite).

    Both files are checked first (:func:`workbench.base.h5files.inspect`) and must be workbench files of one kind.
    With ``strict`` (default) files that are not two states of one model — a dataset only in either, or of
    another shape or dtype — raise :class:`NotComparable`, naming them; otherwise each such dataset gets a row
    with ``changed`` None and a ``note`` (``only in a``, ``only in b``, ``shape or dtype differs``)."""
    ia, ib = inspect(a), inspect(b)
    if ia.kind != ib.kind:
        raise NotComparable(f"{a} is {ia.description} and {b} {ib.description}: they cannot be compared")
    na = {n: s for n, s in ia.datasets.items() if _kind(s[1]) in "fiu"}
    nb = {n: s for n, s in ib.datasets.items() if _kind(s[1]) in "fiu"}
    notes = {**{n: "only in a" for n in na if n not in nb}, **{n: "only in b" for n in nb if n not in na},
             **{n: "shape or dtype differs" for n in na if n in nb and na[n] != nb[n]}}
    if strict and notes:
        labels = {"only in a": f"only in {a}", "only in b": f"only in {b}", "shape or dtype differs":
                  "of another shape or dtype"}
        raise NotComparable(f"{a} and {b} are not two states of one model: datasets " + "; ".join(
            f"{text}: {_names(found)}" for note, text in labels.items()
            if (found := [n for n, kind in notes.items() if kind == note])) + " (--partial / strict=False compares "
            "the datasets they share)")
    try:
        rows = _compare_rows(a, b, [n for n in na if n not in notes])
    except (OSError, RuntimeError) as exc:
        raise FileKindError(f"{a} or {b}", f"is a damaged HDF5 file ({reason(exc)})") from None
    return rows + [{"dataset": n, "changed": None, "max_abs_diff": None, "l2": None, "note": note}
                   for n, note in notes.items()]


def _names(names: list[str], shown: int = 4) -> str:
    return ", ".join(names[:shown]) + (f", ... {len(names) - shown} more" if len(names) > shown else "")


def _compare_rows(a: str | os.PathLike, b: str | os.PathLike, names: list[str]) -> list[dict[str, Any]]:
    import h5py

    rows = []
    with h5py.File(a, "r") as fa, h5py.File(b, "r") as fb:
        for name in names:
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
