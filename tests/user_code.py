"""A user's own model factory and dataset loader, referenced by import path in tests."""

import numpy as np
from torch import nn


def tiny_model(input_shape, num_classes):
    return nn.Sequential(nn.Flatten(), nn.Linear(int(np.prod(input_shape)), 32), nn.Tanh(), nn.Linear(32, num_classes))


def blobs():
    rng = np.random.default_rng(0)
    centres = rng.normal(size=(3, 5)) * 3
    y = rng.integers(0, 3, size=600)
    x = centres[y] + rng.normal(size=(600, 5))
    return x[:480], y[:480], x[480:], y[480:]


class Broken(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(64, 10)

    def forward(self, x):
        raise ValueError("this model is broken on purpose")


def bn_cnn(input_shape, num_classes):
    """A small conv net with batch norm (running statistics are training state that is not a parameter)."""
    from collections import OrderedDict

    channels = input_shape[0] if len(input_shape) == 3 else 1
    return nn.Sequential(OrderedDict(
        conv1=nn.Conv2d(channels, 8, 3, padding=1), bn1=nn.BatchNorm2d(8), relu1=nn.ReLU(),
        conv2=nn.Conv2d(8, 16, 3, padding=1), bn2=nn.BatchNorm2d(16), relu2=nn.ReLU(),
        pool=nn.AdaptiveAvgPool2d(1), flatten=nn.Flatten(), fc=nn.Linear(16, num_classes)))


def blobs_holding_the_interpreter():
    """``blobs`` after a C call that holds the interpreter lock for ~1.5 s (a heavy import or native loader does):
    no other thread of the process, the heartbeat's included, runs meanwhile."""
    import time

    started = time.perf_counter()
    sum(range(10**6))  # one C call: the lock is not given up inside it
    per_million = time.perf_counter() - started
    sum(range(int(1.5 / max(per_million, 1e-4) * 10**6)))
    return blobs()


def probing_model(input_shape, num_classes):
    """``tiny_model``, after writing the scikit-learn modules this rank has imported to ``$WORKBENCH_TEST_PROBE.<pid>``
    (built after the dataset is loaded: whatever its start imported is there)."""
    import os
    import sys

    heavy = sorted(m for m in sys.modules if m.split(".")[0] == "sklearn")
    with open(f"{os.environ['WORKBENCH_TEST_PROBE']}.{os.getpid()}", "w") as f:
        f.write("\n".join(heavy))
    return tiny_model(input_shape, num_classes)


def unsaveable_model(input_shape, num_classes):
    """``tiny_model`` with a bfloat16 buffer, which numpy (and so a checkpoint) cannot hold: its write raises a
    TypeError, no OutputError."""
    import torch

    model = tiny_model(input_shape, num_classes)
    model.register_buffer("scale", torch.ones(1, dtype=torch.bfloat16))
    return model


# loaders that return bad data (tests/test_user_data.py): each must be a one-line settings error before any rank
def all_nan():
    x_train, y_train, x_test, y_test = blobs()
    return np.full_like(x_train, np.nan), y_train, x_test, y_test


def nan_rows():
    x_train, y_train, x_test, y_test = blobs()
    x_train = x_train.copy()
    x_train[[3, 7]] = np.inf
    return x_train, y_train, x_test, y_test


def more_inputs_than_labels():
    rng = np.random.default_rng(0)
    return rng.normal(size=(512, 5)), rng.integers(0, 3, 100), rng.normal(size=(64, 5)), rng.integers(0, 3, 64)


def three_arrays():
    return blobs()[:3]


def negative_labels():
    x_train, y_train, x_test, y_test = blobs()
    return x_train, y_train - 1, x_test, y_test


def other_test_shape():
    x_train, y_train, x_test, y_test = blobs()
    return x_train, y_train, x_test[:, :4], y_test


def raising():
    raise FileNotFoundError("/data/mine.npz")


def fixed_64_inputs(input_shape, num_classes):
    """A model written for 8x8 digits whatever the data: it takes 64 inputs."""
    return nn.Sequential(nn.Flatten(), nn.Linear(64, num_classes))


def raising_factory(input_shape, num_classes):
    raise RuntimeError("no weights for you")
