"""HDF5 checkpoints: one dataset per tensor, each with its SHA-256; atomic write; verify; load.

A checkpoint holds ``model/<name>`` (the model's current shapes, narrower under apoptosis), ``optimizer/<name>/<key>``,
``rng/torch`` and attributes (``format``, ``step``, ``data_cursor``, ``seed``, ``config``, ``apoptosis``,
``provenance``, and under ``resize_rule`` linear ``resize_rule``: the resizes so far and the sample cursor); the
data cursor is the step, so a restart resumes the exact data order. :func:`verify` lists the
datasets whose bytes no longer match their checksum. Files are written to ``.<name>.tmp`` and renamed; every reader
first checks the file's kind (:func:`workbench.base.h5files.require`). The full layout: docs/internals.md.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from workbench.base.errors import WorkbenchError
from workbench.base.h5files import CHECKPOINT, FORMATS, FileKindError, reason, require
from workbench.base.h5write import write_hdf5

if TYPE_CHECKING:  # torch is imported where tensors are made: the supervising process reads checkpoints'
    import torch  # steps and checksums without it (its import costs ~1.1 s of every CLI run)

FORMAT = FORMATS[CHECKPOINT]
RULE_ATTRIBUTE = "resize_rule"  # workbench.config.resize_rule.ATTRIBUTE


class CheckpointCorrupt(WorkbenchError):
    """A checkpoint's datasets do not match their checksums (a file that is no checkpoint at all is a
    :class:`~workbench.base.h5files.FileKindError`)."""

    def __init__(self, path: str | os.PathLike, datasets: list[str]) -> None:
        self.path = str(path)
        self.datasets = datasets
        super().__init__(f"checkpoint {self.path} is corrupt: checksum mismatch in {', '.join(datasets)}")


@dataclass
class Checkpoint:
    step: int
    model: dict[str, torch.Tensor]
    optimizer: dict[str, dict[str, torch.Tensor]]
    rng: torch.Tensor | None = None
    seed: int = 0
    config: dict[str, Any] = field(default_factory=dict)
    apoptosis: dict[str, torch.Tensor] = field(default_factory=dict)
    provenance: dict[str, Any] = field(default_factory=dict)
    rule: dict[str, Any] = field(default_factory=dict)  # resize_rule linear: rank.base.BaseTrainer.rule_record


def checksum(array: np.ndarray) -> str:
    # hashed from the array's own buffer: ``tobytes`` would copy it first (80 ms of a 19.2M checkpoint's 450)
    return hashlib.sha256(np.ascontiguousarray(array)).hexdigest()


def checkpoint_name(step: int) -> str:
    return f"step_{step:06d}.h5"


def save(path: str | os.PathLike, ckpt: Checkpoint) -> Path:
    """Write ``ckpt`` atomically (built in memory, written to a temporary name, renamed:
    :mod:`workbench.base.h5write`);
    a full disk or a read-only place raises :class:`~workbench.base.h5files.OutputError` and leaves nothing
    behind."""

    def fill(f: Any) -> None:
        f.attrs.update(format=FORMAT, step=ckpt.step, data_cursor=ckpt.step, seed=ckpt.seed,
                       config=json.dumps(ckpt.config), provenance=json.dumps(ckpt.provenance))
        for name, tensor in ckpt.model.items():
            _write(f, f"model/{name}", tensor)
        for name, state in ckpt.optimizer.items():
            for key, value in state.items():
                _write(f, f"optimizer/{name}/{key}", value)
        if ckpt.rng is not None:
            _write(f, "rng/torch", ckpt.rng)
        if ckpt.rule:
            f.attrs[RULE_ATTRIBUTE] = json.dumps(ckpt.rule)
        if ckpt.apoptosis:
            f.attrs["apoptosis"] = json.dumps({k: [str(v.dtype).removeprefix("torch."), v.tolist()]
                                               for k, v in ckpt.apoptosis.items()})

    return write_hdf5(path, fill)


def _write(f: Any, name: str, value: Any) -> None:
    import torch

    array = value.detach().cpu().numpy() if torch.is_tensor(value) else np.asarray(value)
    dataset = f.create_dataset(name, data=array)
    dataset.attrs["sha256"] = checksum(array)


def datasets(path: str | os.PathLike) -> list[str]:
    """Paths of every dataset in the checkpoint, e.g. ``model/fc1.weight``."""
    return list(require(path, CHECKPOINT).datasets)


def verify(path: str | os.PathLike) -> list[str]:
    """Datasets whose bytes do not match their ``sha256`` attribute (empty list: the checkpoint is intact).
    A file that is no checkpoint (a result, a sweep table, text, a truncated file) raises
    :class:`~workbench.base.h5files.FileKindError`: only checkpoints carry checksums."""
    import h5py

    require(path, CHECKPOINT, purpose="verify checks the checksums of checkpoints")
    bad: list[str] = []
    try:
        with h5py.File(path, "r") as f:
            def check(name: str, obj: Any) -> None:
                if isinstance(obj, h5py.Dataset) and obj.attrs.get("sha256") != checksum(obj[()]):
                    bad.append(name)

            f.visititems(check)
    except (OSError, RuntimeError) as exc:
        raise FileKindError(path, f"is a damaged HDF5 file ({reason(exc)})") from None
    return bad


def unusable(path: str | os.PathLike, elsewhere: bool = False) -> str | None:
    """Why a run cannot resume from the checkpoint at ``path`` (None: it verifies). ``elsewhere``: ranks run on
    other hosts too, so a file missing here may be on the disk of the rank that loads it (which checks it)."""
    if elsewhere and not Path(path).exists():
        return None
    try:
        bad = verify(path)
    except WorkbenchError as exc:
        return str(exc)
    return f"checksum mismatch in {', '.join(bad)}" if bad else None


def step_of(path: str | os.PathLike) -> int:
    """The step a checkpoint resumes at (its ``step`` attribute), without reading its tensors."""
    import h5py

    with h5py.File(path, "r") as f:
        return int(f.attrs["step"])


def load(path: str | os.PathLike, check: bool = True) -> Checkpoint:
    """Read a checkpoint; with ``check`` a checksum mismatch raises :class:`CheckpointCorrupt`; a file that is no
    checkpoint raises :class:`~workbench.base.h5files.FileKindError`."""
    import h5py
    import torch

    if check:
        bad = verify(path)
        if bad:
            raise CheckpointCorrupt(path, bad)
    else:
        require(path, CHECKPOINT)
    try:
        with h5py.File(path, "r") as f:
            model = {name: torch.from_numpy(np.array(d[()])) for name, d in f["model"].items()}
            optimizer: dict[str, dict[str, torch.Tensor]] = {}
            if "optimizer" in f:
                for name, group in f["optimizer"].items():
                    optimizer[name] = {key: torch.from_numpy(np.array(d[()])) for key, d in group.items()}
            rng = torch.from_numpy(np.array(f["rng/torch"][()])) if "rng/torch" in f else None
            apoptosis = {key: torch.tensor(value, dtype=getattr(torch, dtype)) for key, (dtype, value)
                         in json.loads(f.attrs.get("apoptosis", "{}")).items()}
            return Checkpoint(int(f.attrs["step"]), model, optimizer, rng, int(f.attrs.get("seed", 0)),
                              json.loads(f.attrs.get("config", "{}")), apoptosis,
                              json.loads(f.attrs.get("provenance", "{}")),
                              json.loads(f.attrs.get(RULE_ATTRIBUTE, "{}")))
    except (OSError, RuntimeError, KeyError, ValueError, TypeError, AttributeError) as exc:
        raise FileKindError(path, f"is a damaged workbench checkpoint ({reason(exc)})") from None
