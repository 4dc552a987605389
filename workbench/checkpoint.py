"""HDF5 checkpoints: one dataset per tensor, each with its SHA-256; atomic write; verify; load.

Layout (``format`` 1)::

    model/<name>                  every entry of model.state_dict() (parameters by their named_parameters() name)
    optimizer/<name>/<key>        optimizer state of parameter <name> (momentum_buffer; exp_avg, exp_avg_sq, step)
    rng/torch                     torch's CPU generator state
    attrs: format, step, data_cursor, seed, config (JSON), apoptosis (JSON: the apoptosis rule's state, if on;
           an attribute like step, not a dataset, so bit-flip campaigns over the float datasets never meet it),
           provenance (JSON: the run's, as it started, see workbench.provenance; {} when a file predates it)

The model datasets hold the model's *current* shapes: under apoptosis a layer may be narrower than the
configured model, and whoever loads the checkpoint shapes its model after them (``apoptosis.resize_to``).

``data_cursor`` is the step: the batch sequence depends only on (seed, step), so a restart from this file
resumes the exact data order. Every dataset carries ``sha256`` of its bytes; :func:`verify` lists those whose
bytes no longer match (a flipped bit at rest). Files are written to ``.<name>.tmp`` and renamed.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from workbench.errors import WorkbenchError

FORMAT = 1


class CheckpointCorrupt(WorkbenchError):
    """A checkpoint's datasets do not match their checksums, or it is not a workbench checkpoint."""

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


def checksum(array: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(array).tobytes()).hexdigest()


def checkpoint_name(step: int) -> str:
    return f"step_{step:06d}.h5"


def save(path: str | os.PathLike, ckpt: Checkpoint) -> Path:
    """Write ``ckpt`` atomically (temporary name, then rename)."""
    import h5py

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with h5py.File(tmp, "w") as f:
        f.attrs.update(format=FORMAT, step=ckpt.step, data_cursor=ckpt.step, seed=ckpt.seed,
                       config=json.dumps(ckpt.config), provenance=json.dumps(ckpt.provenance))
        for name, tensor in ckpt.model.items():
            _write(f, f"model/{name}", tensor)
        for name, state in ckpt.optimizer.items():
            for key, value in state.items():
                _write(f, f"optimizer/{name}/{key}", value)
        if ckpt.rng is not None:
            _write(f, "rng/torch", ckpt.rng)
        if ckpt.apoptosis:
            f.attrs["apoptosis"] = json.dumps({k: [str(v.dtype).removeprefix("torch."), v.tolist()]
                                               for k, v in ckpt.apoptosis.items()})
    os.replace(tmp, path)
    return path


def _write(f: Any, name: str, value: Any) -> None:
    array = value.detach().cpu().numpy() if torch.is_tensor(value) else np.asarray(value)
    dataset = f.create_dataset(name, data=array)
    dataset.attrs["sha256"] = checksum(array)


def datasets(path: str | os.PathLike) -> list[str]:
    """Paths of every dataset in the file, e.g. ``model/fc1.weight``."""
    import h5py

    names: list[str] = []
    with h5py.File(path, "r") as f:
        f.visititems(lambda name, obj: names.append(name) if isinstance(obj, h5py.Dataset) else None)
    return names


def verify(path: str | os.PathLike) -> list[str]:
    """Datasets whose bytes do not match their ``sha256`` attribute (empty list: the checkpoint is intact)."""
    import h5py

    bad: list[str] = []
    try:
        with h5py.File(path, "r") as f:
            def check(name: str, obj: Any) -> None:
                if isinstance(obj, h5py.Dataset) and obj.attrs.get("sha256") != checksum(obj[()]):
                    bad.append(name)

            f.visititems(check)
    except OSError as exc:
        raise CheckpointCorrupt(path, [f"<file: {exc}>"]) from None
    return bad


def load(path: str | os.PathLike, check: bool = True) -> Checkpoint:
    """Read a checkpoint; with ``check`` a checksum mismatch raises :class:`CheckpointCorrupt`."""
    import h5py

    if check:
        bad = verify(path)
        if bad:
            raise CheckpointCorrupt(path, bad)
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
                              json.loads(f.attrs.get("provenance", "{}")))
    except (OSError, KeyError) as exc:
        raise CheckpointCorrupt(path, [f"<layout: {exc}>"]) from None
