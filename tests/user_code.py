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
