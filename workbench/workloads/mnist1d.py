"""MNIST-1D (Greydanus & Kobak, *Scaling down deep learning with MNIST-1D*, ICML 2024): 10 classes of 1-D
signals of 40 points, 4,000 training and 1,000 test examples, and the paper's models.

The data is the ``mnist1d`` package's ``make_dataset(get_dataset_args())`` (version 0.0.2.post1, seed 42; equal
to the ``mnist1d_data.pkl`` its repository publishes, to 1e-15), committed as ``data/mnist1d.npz`` (float32) and
checked against :data:`CHECKSUM` at every load: a missing or altered file is an error, never a rebuild. Regenerate
it (the ``dev`` extra installs the package) with ``python -m workbench.workloads.mnist1d --write data/mnist1d.npz``.

The models are the paper's ``notebooks/models.py``, layer for layer and with PyTorch's default initialisation:
logistic regression (410 parameters), the MLP (100 wide, one residual layer: 15,210), the 1-D CNN (three strided
convolutions of 25 channels: 5,210), the bidirectional GRU (6 wide: 5,134), and the CNN with batch norm after each
convolution (the seed papers' kind of model: 5,360). Each is an ``nn.Sequential`` of named layers, so pipeline
stages, bit flips and checkpoints address them like any other model.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import sys
import zipfile
from collections import OrderedDict
from pathlib import Path

import numpy as np
import torch
from torch import nn

from workbench.config.errors import ConfigError

LENGTH = 40  # points per signal
CLASSES = 10
TRAIN, TEST = 4000, 1000
# sha256 of the arrays x, y, x_test, y_test as stored (float32, int64; C order), in that order
CHECKSUM = "b09ad3e22c854bc5a1948b85c373aab653ceb38c9170f5ed05b7d054e4160db9"
PACKAGE = "mnist1d==0.0.2.post1"


def checksum(arrays: dict[str, np.ndarray]) -> str:
    digest = hashlib.sha256()
    for key in ("x", "y", "x_test", "y_test"):
        digest.update(np.ascontiguousarray(arrays[key]).tobytes())
    return digest.hexdigest()


def read(path: Path) -> dict[str, np.ndarray]:
    """The four arrays of ``path``, checked: shapes, types and :data:`CHECKSUM` (ConfigError otherwise)."""
    fix = f"restore it (git checkout -- data/{path.name}) or regenerate it: python -m workbench.workloads.mnist1d " \
          f"--write {path}"
    try:
        with np.load(path, allow_pickle=False) as f:
            arrays = {key: f[key] for key in ("x", "y", "x_test", "y_test")}
    except (OSError, ValueError, KeyError, zipfile.BadZipFile, EOFError) as exc:
        raise ConfigError("dataset", f"'mnist1d' cannot read {path} ({type(exc).__name__}: {exc}): {fix}") from None
    shapes = {key: a.shape for key, a in arrays.items()}
    if shapes != {"x": (TRAIN, LENGTH), "y": (TRAIN,), "x_test": (TEST, LENGTH), "y_test": (TEST,)} or \
            arrays["x"].dtype != np.float32 or arrays["y"].dtype != np.int64:
        raise ConfigError("dataset", f"'mnist1d': {path} holds arrays of shapes {shapes}, not MNIST-1D's: {fix}")
    if checksum(arrays) != CHECKSUM:
        raise ConfigError("dataset", f"'mnist1d': {path} was altered (its checksum is not MNIST-1D's): {fix}")
    return arrays


def generate() -> dict[str, np.ndarray]:
    """The data set from the ``mnist1d`` package's defaults (needs ``pip install mnist1d==0.0.2.post1``)."""
    try:
        from mnist1d.data import get_dataset_args, make_dataset
    except ImportError:
        raise ConfigError("dataset", f"regenerating MNIST-1D needs the package: pip install {PACKAGE}") from None
    made = make_dataset(get_dataset_args())
    return {"x": np.asarray(made["x"], dtype=np.float32), "y": np.asarray(made["y"], dtype=np.int64),
            "x_test": np.asarray(made["x_test"], dtype=np.float32),
            "y_test": np.asarray(made["y_test"], dtype=np.int64)}


def write(arrays: dict[str, np.ndarray], path: Path) -> None:
    """``path`` as an uncompressed .npz with fixed member dates: the same arrays give the same bytes."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_STORED) as archive:
        for key in ("x", "y", "x_test", "y_test"):
            member = io.BytesIO()
            np.save(member, np.ascontiguousarray(arrays[key]), allow_pickle=False)
            archive.writestr(zipfile.ZipInfo(f"{key}.npy", date_time=(1980, 1, 1, 0, 0, 0)), member.getvalue())
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(buffer.getvalue())
    tmp.replace(path)


def dataset():  # noqa: ANN201 - a workbench.workloads.datasets.Dataset (imported here: it needs torch)
    """The registered dataset ``mnist1d``: the committed file, checked, as float32 signals of shape (40,)."""
    from workbench.workloads.data import tensors
    from workbench.workloads.dataset_files import bundled_file

    arrays = read(bundled_file("mnist1d"))
    return tensors(arrays["x"], arrays["y"], arrays["x_test"], arrays["y_test"])


# -- the paper's models ------------------------------------------------------------------------------------------
def _length(input_shape: tuple[int, ...], name: str) -> int:
    if len(input_shape) != 1:
        raise ConfigError("model", f"{name!r} takes 1-D signals (length,), the dataset gives {input_shape}: use it "
                                   "with --dataset mnist1d")
    return input_shape[0]


class Residual(nn.Module):
    """``h + relu(linear(h))``: the MLP's second layer."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.linear = nn.Linear(width, width)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return h + self.linear(h).relu()


class GRUFeatures(nn.Module):
    """A GRU over the signal's points (one feature each) from a zero state; its outputs at every point, flat."""

    def __init__(self, hidden: int, bidirectional: bool = True) -> None:
        super().__init__()
        self.gru = nn.GRU(input_size=1, hidden_size=hidden, batch_first=True, bidirectional=bidirectional)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        output, _ = self.gru(x.unsqueeze(-1))  # [batch, points, 1] -> [batch, points, directions * hidden]
        return output.flatten(1)


def logistic(input_shape: tuple[int, ...], num_classes: int) -> nn.Sequential:
    """The paper's ``LinearBase``: one linear layer."""
    return nn.Sequential(OrderedDict(flatten=nn.Flatten(), linear=nn.Linear(_length(input_shape, "mnist1d_logistic"),
                                                                            num_classes)))


def mlp(input_shape: tuple[int, ...], num_classes: int, hidden: int = 100) -> nn.Sequential:
    """The paper's ``MLPBase``: linear, ReLU, a residual linear + ReLU, linear."""
    length = _length(input_shape, "mnist1d_mlp")
    return nn.Sequential(OrderedDict(
        flatten=nn.Flatten(), linear1=nn.Linear(length, hidden), relu1=nn.ReLU(), residual=Residual(hidden),
        linear3=nn.Linear(hidden, num_classes)))


def _convs(length: int, channels: int, batch_norm: bool) -> tuple[OrderedDict, int]:
    layers: OrderedDict[str, nn.Module] = OrderedDict(signal=nn.Unflatten(1, (1, length)))
    shapes = ((1, 5), (channels, 3), (channels, 3))  # (input channels, kernel) of each stride-2 convolution
    for i, (cin, kernel) in enumerate(shapes, start=1):
        layers[f"conv{i}"] = nn.Conv1d(cin, channels, kernel, stride=2, padding=1)
        if batch_norm:
            layers[f"bn{i}"] = nn.BatchNorm1d(channels)
        layers[f"relu{i}"] = nn.ReLU()
        length = (length + 2 - kernel) // 2 + 1
    layers["flatten"] = nn.Flatten()
    return layers, channels * length


def cnn(input_shape: tuple[int, ...], num_classes: int, channels: int = 25) -> nn.Sequential:
    """The paper's ``ConvBase``: three stride-2 convolutions (kernels 5, 3, 3), ReLU, a linear classifier."""
    layers, features = _convs(_length(input_shape, "mnist1d_cnn"), channels, batch_norm=False)
    layers["linear"] = nn.Linear(features, num_classes)
    return nn.Sequential(layers)


def cnn_bn(input_shape: tuple[int, ...], num_classes: int, channels: int = 25) -> nn.Sequential:
    """``ConvBase`` with batch norm after each convolution: running statistics, as the seed papers' models have."""
    layers, features = _convs(_length(input_shape, "mnist1d_cnn_bn"), channels, batch_norm=True)
    layers["linear"] = nn.Linear(features, num_classes)
    return nn.Sequential(layers)


def gru(input_shape: tuple[int, ...], num_classes: int, hidden: int = 6) -> nn.Sequential:
    """The paper's ``GRUBase``: a bidirectional GRU of 6 over the 40 points, a linear layer on all its outputs."""
    length = _length(input_shape, "mnist1d_gru")
    return nn.Sequential(OrderedDict(gru=GRUFeatures(hidden), linear=nn.Linear(2 * hidden * length, num_classes)))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m workbench.workloads.mnist1d",
                                     description=f"Regenerate MNIST-1D from {PACKAGE} and check it.")
    parser.add_argument("--write", metavar="PATH", required=True, help="where to write the .npz (data/mnist1d.npz)")
    args = parser.parse_args(argv)
    try:
        arrays = generate()
    except ConfigError as exc:
        print(f"mnist1d: {exc}", file=sys.stderr)
        return 2
    made = checksum(arrays)
    if made != CHECKSUM:
        print(f"mnist1d: the package made other data (checksum {made}, expected {CHECKSUM}): is it {PACKAGE}?",
              file=sys.stderr)
        return 1
    write(arrays, Path(args.write))
    print(f"wrote {args.write}: {TRAIN} + {TEST} signals of {LENGTH}, checksum {made}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
