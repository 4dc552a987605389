"""The seed papers' kind of models, with batch norm: LeNet-5, AlexNet, VGG-11, ResNet-20 and ResNet-18.

Every model is an ``nn.Sequential`` of named top-level blocks, so pipeline and hybrid runs cut it between
children and parameter names read well in fault plans (``conv1.weight``, ``layer2_0.bn1.running_var``). Plain
chains keep ``convN``, ``bnN``, ``reluN`` as separate children (:func:`conv_bn_pairs` finds the pairs); a
residual block is one child (:class:`BasicBlock`). Any input shape works; convolutions have no bias; the
initialisation is the papers'. Each model's layers and parameter counts: docs/internals.md and docs/settings.md.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from workbench.base.errors import ConfigError

ALEXNET = [(64, 11, 4, 5), (192, 5, 1, 2), (384, 3, 1, 1), (256, 3, 1, 1), (256, 3, 1, 1)]  # (out, kernel, stride, pad)
ALEXNET_POOLS = (1, 2, 5)  # a max pool after these convolutions
VGG11 = [64, "M", 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M"]  # channels; M: 2x2 max pool
RESNET20 = [(16, 3), (32, 3), (64, 3)]  # (channels, blocks) per stage
RESNET18 = [(64, 2), (128, 2), (256, 2), (512, 2)]


def _image(name: str, input_shape: tuple[int, ...]) -> int:
    """Input channels; the models take images (C, H, W)."""
    if len(input_shape) != 3:
        raise ConfigError("model", f"{name!r} needs image inputs (C, H, W), the dataset gives {tuple(input_shape)}")
    return int(input_shape[0])


def _scaled(channels: int, width: float) -> int:
    return max(1, round(channels * width))


def _conv(layers: OrderedDict, i: int, cin: int, cout: int, kernel: int, stride: int = 1, padding: int = 1) -> None:
    """Append ``conv{i}``, ``bn{i}``, ``relu{i}``: a convolution directly followed by its batch norm."""
    layers[f"conv{i}"] = nn.Conv2d(cin, cout, kernel, stride=stride, padding=padding, bias=False)
    layers[f"bn{i}"] = nn.BatchNorm2d(cout)
    layers[f"relu{i}"] = nn.ReLU()


def _pool(layers: OrderedDict, i: int) -> None:
    layers[f"pool{i}"] = nn.MaxPool2d(2, ceil_mode=True)  # rounds up: a 1x1 map (8x8 digits) stays 1x1


def _head(layers: OrderedDict, side: int, features: int, num_classes: int) -> None:
    layers["pool"] = nn.AdaptiveAvgPool2d(side)
    layers["flatten"] = nn.Flatten()
    layers["fc"] = nn.Linear(features * side * side, num_classes)


def _initialise(model: nn.Sequential) -> nn.Sequential:
    for module in model.modules():
        if isinstance(module, nn.Conv2d):
            nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")
        elif isinstance(module, nn.BatchNorm2d):
            nn.init.ones_(module.weight)
            nn.init.zeros_(module.bias)
    return model


def lenet5(input_shape: tuple[int, ...], num_classes: int) -> nn.Sequential:
    channels = _image("lenet5", input_shape)
    layers: OrderedDict[str, nn.Module] = OrderedDict()
    _conv(layers, 1, channels, 6, 5, padding=2)
    _pool(layers, 1)
    _conv(layers, 2, 6, 16, 5, padding=2)
    _pool(layers, 2)
    layers["pool"] = nn.AdaptiveAvgPool2d(5)
    layers["flatten"] = nn.Flatten()
    layers["fc1"] = nn.Linear(16 * 5 * 5, 120)
    layers["relu3"] = nn.ReLU()
    layers["fc2"] = nn.Linear(120, 84)
    layers["relu4"] = nn.ReLU()
    layers["fc3"] = nn.Linear(84, num_classes)
    return _initialise(nn.Sequential(layers))


def alexnet(input_shape: tuple[int, ...], num_classes: int, width: float = 1.0) -> nn.Sequential:
    cin = _image("alexnet", input_shape)
    layers: OrderedDict[str, nn.Module] = OrderedDict()
    pools = 0
    for i, (channels, kernel, stride, padding) in enumerate(ALEXNET, start=1):
        cout = _scaled(channels, width)
        _conv(layers, i, cin, cout, kernel, stride, padding)
        if i in ALEXNET_POOLS:
            pools += 1
            _pool(layers, pools)
        cin = cout
    _head(layers, 1, cin, num_classes)
    return _initialise(nn.Sequential(layers))


def vgg11(input_shape: tuple[int, ...], num_classes: int, width: float = 1.0) -> nn.Sequential:
    cin = _image("vgg11", input_shape)
    layers: OrderedDict[str, nn.Module] = OrderedDict()
    convs = pools = 0
    for item in VGG11:
        if item == "M":
            pools += 1
            _pool(layers, pools)
            continue
        convs += 1
        cout = _scaled(int(item), width)
        _conv(layers, convs, cin, cout, 3)
        cin = cout
    _head(layers, 1, cin, num_classes)
    return _initialise(nn.Sequential(layers))


class PadShortcut(nn.Module):
    """He et al.'s option A: keep every ``stride``-th pixel and zero-pad the new channels (no parameters)."""

    def __init__(self, stride: int, extra: int) -> None:
        super().__init__()
        self.stride, self.extra = stride, extra

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x[:, :, :: self.stride, :: self.stride]
        return F.pad(x, (0, 0, 0, 0, self.extra // 2, self.extra - self.extra // 2))


class BasicBlock(nn.Module):
    """Two 3x3 convolutions with batch norm and a shortcut: ``relu(bn2(conv2(relu(bn1(conv1 x)))) + shortcut x)``.
    Where the shape changes the shortcut is option A (:class:`PadShortcut`) or B (``shortcut.conv``,
    ``shortcut.bn``: a 1x1 convolution with batch norm); elsewhere the identity."""

    def __init__(self, cin: int, cout: int, stride: int = 1, option: str = "A") -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut: nn.Module = nn.Identity()
        if (stride, cin) != (1, cout):
            self.shortcut = PadShortcut(stride, cout - cin) if option == "A" else nn.Sequential(OrderedDict(
                conv=nn.Conv2d(cin, cout, 1, stride=stride, bias=False), bn=nn.BatchNorm2d(cout)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(out)) + self.shortcut(x))


def _resnet(name: str, input_shape: tuple[int, ...], num_classes: int, stages: list[tuple[int, int]],
            option: str) -> nn.Sequential:
    cin = _image(name, input_shape)
    layers: OrderedDict[str, nn.Module] = OrderedDict()
    _conv(layers, 1, cin, stages[0][0], 3)
    cin = stages[0][0]
    for s, (channels, blocks) in enumerate(stages, start=1):
        for b in range(blocks):
            layers[f"layer{s}_{b}"] = BasicBlock(cin, channels, 2 if s > 1 and b == 0 else 1, option)
            cin = channels
    _head(layers, 1, cin, num_classes)
    return _initialise(nn.Sequential(layers))


def resnet20(input_shape: tuple[int, ...], num_classes: int) -> nn.Sequential:
    return _resnet("resnet20", input_shape, num_classes, RESNET20, option="A")


def resnet18(input_shape: tuple[int, ...], num_classes: int) -> nn.Sequential:
    return _resnet("resnet18", input_shape, num_classes, RESNET18, option="B")


# the seed papers' models by name (their entries in workbench.workloads.registry name these builders)
ARCHITECTURES: dict[str, Callable[..., nn.Sequential]] = {
    f.__name__: f for f in (lenet5, alexnet, vgg11, resnet20, resnet18)}


def conv_bn_pairs(model: nn.Sequential) -> list[tuple[str, str, str | None]]:
    """(convolution, its batch norm, the next layer with weights) for each top-level ``Conv2d`` directly followed
    by a ``BatchNorm2d`` in a plain chain: removing the convolution's output channel ``c`` removes ``bn``'s entry
    ``c`` and the next layer's input channel ``c`` (for the final Linear after the adaptive pool: its ``side**2``
    input features of channel ``c``). None when nothing with weights follows."""
    children = list(model.named_children())
    found = []
    for i, (name, module) in enumerate(children[:-1]):
        if isinstance(module, nn.Conv2d) and isinstance(children[i + 1][1], nn.BatchNorm2d):
            after = [n for n, m in children[i + 2:] if isinstance(m, (nn.Conv2d, nn.Linear))]
            found.append((name, children[i + 1][0], after[0] if after else None))
    return found
