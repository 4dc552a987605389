"""MNIST-1D's models and data set as the ranks load it (:mod:`workbench.workloads.mnist1d_file`: the file).

The models are the paper's ``notebooks/models.py`` (Greydanus & Kobak), layer for layer and with PyTorch's default
initialisation: logistic regression (410 parameters), the MLP (100 wide, one residual layer: 15,210), the 1-D CNN
(three strided convolutions of 25 channels: 5,210), the bidirectional GRU (6 wide: 5,134), and the CNN with batch
norm after each convolution (the seed papers' kind of model: 5,360). Each is an ``nn.Sequential`` of named layers,
so pipeline stages, bit flips and checkpoints address them like any other model.
"""

from __future__ import annotations

from collections import OrderedDict

import torch
from torch import nn

from workbench.base.errors import ConfigError


def dataset():  # noqa: ANN201 - a workbench.workloads.datasets.Dataset (imported here: it needs torch)
    """The registered dataset ``mnist1d``: the committed file, checked, as float32 signals of shape (40,)."""
    from workbench.workloads.data import tensors
    from workbench.workloads.dataset_files import bundled_file
    from workbench.workloads.mnist1d_file import read

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


def reference(input_shape: tuple[int, ...], num_classes: int, channels: int = 64) -> nn.Sequential:
    """A larger model that measures MNIST-1D's ceiling (benchmarks/mnist1d_ceiling.py), not one of the paper's:
    four convolutions of 64 (kernel 5, same padding) with batch norm, max pooling after the second and fourth."""
    length = _length(input_shape, "mnist1d_reference")
    layers: OrderedDict[str, nn.Module] = OrderedDict(signal=nn.Unflatten(1, (1, length)))
    for i in range(1, 5):
        layers[f"conv{i}"] = nn.Conv1d(1 if i == 1 else channels, channels, 5, padding=2)
        layers[f"bn{i}"] = nn.BatchNorm1d(channels)
        layers[f"relu{i}"] = nn.ReLU()
        if i % 2 == 0:
            layers[f"pool{i // 2}"] = nn.MaxPool1d(2)
            length //= 2
    layers["flatten"] = nn.Flatten()
    layers["linear"] = nn.Linear(channels * length, num_classes)
    return nn.Sequential(layers)
