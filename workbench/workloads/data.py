"""Datasets and the global batch sequence.

The batch sequence depends only on the seed and the step, never on the world size: step ``s`` trains on the
global batch ``batch_indices(s)``, which the live ranks split between them (``shard``), so a run that loses or
regains ranks walks the same data in the same order, and a restart at step ``s`` resumes it exactly. Which samples
entered an update is told by a checksum of their ids (:func:`sample_checksum`, carried by :func:`sample_figures`).
:class:`Dataset` and the image datasets live in :mod:`workbench.workloads.datasets`
(``workbench.workloads.data.Dataset`` is the same class).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import torch

from workbench.base.errors import ConfigError
from workbench.workloads import registry
from workbench.workloads.dataset_files import bundled_file, user_arrays
from workbench.workloads.datasets import Dataset
from workbench.workloads.registry import SPLIT_SEED

if TYPE_CHECKING:
    from workbench.config.run import RunConfig



def load_dataset(config: RunConfig) -> Dataset:
    """The run's dataset, with its augmentation setting; image datasets (``synthetic_image``, ``cifar10:DIR``,
    ...: :mod:`workbench.workloads.datasets`) keep uint8 images and normalise them in :meth:`Dataset.train_batch`."""
    entry = registry.dataset(config.dataset)
    data = entry.load(config.dataset, config.synthetic_size) if entry else _user_dataset(config.dataset)
    if config.augment != "none" and len(data.input_shape) != 3:
        raise ConfigError("augment", f"{config.augment!r} needs (C, H, W) images; {config.dataset!r} gives samples of "
                          f"shape {data.input_shape}")
    data.augment, data.seed = config.augment, config.seed
    if config.apoptosis:  # the rule decides on a validation split of the training data, never on the test set
        from workbench.workloads.apoptosis.rule import ApoptosisConfig

        data.carve_validation(ApoptosisConfig.parse(config.apoptosis).val)
    return data


def digits() -> Dataset:
    """scikit-learn's 8x8 digits (1797 images), scaled to [-1, 1], with a fixed stratified 20 % test split.

    Zero-centred on purpose: in [0, 1] the always-blank border pixels are 0, so the weights reading them never
    act and a bit flip there is masked by construction; at -1 every first-layer weight contributes.

    Read from the repository's ``data/digits.npz`` (the same arrays, saved so a rank need not import
    scikit-learn: ~2.4 s of CPU per rank start). A missing file is an error, never a silent fall back to
    scikit-learn, which makes every rank start 16x slower (docs/benchmarks.md).
    """
    with np.load(bundled_file(digits.__name__)) as f:
        images, target = f["images"], f["target"]
    x = (images.astype(np.float32) / 8.0 - 1.0).reshape(-1, 1, 8, 8)
    y = target.astype(np.int64)
    rng = np.random.default_rng(SPLIT_SEED)
    test = np.concatenate([rng.permutation(np.flatnonzero(y == c))[: round(0.2 * np.sum(y == c))] for c in range(10)])
    train = np.setdiff1d(np.arange(len(y)), test)
    return tensors(x[train], y[train], x[test], y[test])


def synthetic(size: int, num_classes: int = 10, side: int = 8) -> Dataset:
    """Gaussian class clusters shaped as 1 x side x side images; ``size`` training samples, size/4 test samples."""
    rng = np.random.default_rng(SPLIT_SEED + size)
    centres = rng.normal(0.0, 1.0, size=(num_classes, side * side)).astype(np.float32)

    def draw(n: int) -> tuple[np.ndarray, np.ndarray]:
        y = rng.integers(0, num_classes, size=n)
        x = centres[y] + rng.normal(0.0, 1.2, size=(n, side * side)).astype(np.float32)
        return x.reshape(n, 1, side, side), y.astype(np.int64)

    x_train, y_train = draw(size)
    x_test, y_test = draw(max(size // 4, 16))
    return tensors(x_train, y_train, x_test, y_test)


def _user_dataset(path: str) -> Dataset:
    return tensors(*user_arrays(path))  # checked as before the run started (dataset_files.user_arrays)


def tensors(x_train, y_train, x_test, y_test) -> Dataset:  # noqa: ANN001 - array-likes of any kind
    """A dataset of four array-likes (training inputs and labels, test inputs and labels) as float32 and int64."""
    return Dataset(
        torch.as_tensor(np.asarray(x_train), dtype=torch.float32),
        torch.as_tensor(np.asarray(y_train), dtype=torch.int64),
        torch.as_tensor(np.asarray(x_test), dtype=torch.float32),
        torch.as_tensor(np.asarray(y_test), dtype=torch.int64),
    )


class BatchSequence:
    """The global batch of every step: epoch ``e`` is a permutation seeded by (seed, e); the last partial batch
    of an epoch is dropped so every step has exactly ``batch_size`` samples.

    ``segments`` (``resize_rule`` linear: :meth:`workbench.config.resize_rule.Scale.segments`): (first step, global
    batch)
    of each stretch of constant global batch. The stream is then read by a sample cursor, (epoch, offset) into the
    same permutations: a step takes the next ``batch`` samples of the epoch, or the first ``batch`` of the next one
    where fewer are left (those are dropped). The cursor of step ``s`` depends on the seed, the segments and ``s``
    only; with one segment it is the stream above, bit for bit."""

    def __init__(self, n_train: int, batch_size: int, seed: int,
                 segments: list[tuple[int, int]] | None = None) -> None:
        if batch_size > n_train:
            raise ConfigError("batch_size", f"{batch_size} is larger than the {n_train} training samples")
        self.n_train = n_train
        self.batch_size = batch_size
        self.seed = seed
        self.per_epoch = n_train // batch_size
        self._perm: tuple[int, np.ndarray] | None = None
        self.segments = list(segments) if segments and len(segments) > 1 else None
        for _, batch in self.segments or []:
            if batch > n_train:
                raise ConfigError("resize_rule", f"a global batch of {batch} exceeds the {n_train} training samples")

    def __call__(self, step: int) -> np.ndarray:
        if self.segments is None:
            epoch, offset = divmod(step, self.per_epoch)
            start, size = offset * self.batch_size, self.batch_size
        else:
            epoch, start, size = self.cursor(step)
        if self._perm is None or self._perm[0] != epoch:
            self._perm = (epoch, np.random.default_rng((self.seed, epoch)).permutation(self.n_train))
        return self._perm[1][start : start + size]

    def cursor(self, step: int) -> tuple[int, int, int]:
        """(epoch, offset, global batch) of step ``step``: where its samples start in the stream, and how many."""
        segments = self.segments or [(0, self.batch_size)]
        epoch, offset = 0, 0
        for i, (first, batch) in enumerate(segments):
            end = segments[i + 1][0] if i + 1 < len(segments) else None
            steps = (min(end, step) if end is not None else step) - first
            epoch, offset = self._advance(epoch, offset, batch, max(steps, 0))
            if end is None or step < end:
                return (epoch + 1, 0, batch) if offset + batch > self.n_train else (epoch, offset, batch)
        raise AssertionError("unreachable: the last segment has no end")

    def _advance(self, epoch: int, offset: int, batch: int, steps: int) -> tuple[int, int]:
        """The cursor after ``steps`` batches of ``batch`` samples from (epoch, offset)."""
        if offset + batch > self.n_train:
            epoch, offset = epoch + 1, 0
        left = (self.n_train - offset) // batch  # batches this epoch still holds
        if steps < left:
            return epoch, offset + steps * batch
        full, rest = divmod(steps - left, self.n_train // batch)
        return epoch + 1 + full, rest * batch

    def samples(self, step: int) -> int:
        """The sample cursor before step ``step`` as one number: epoch x n_train + offset."""
        epoch, offset, _ = self.cursor(step)
        return epoch * self.n_train + offset


# the sample-id checksum: the sum over the ids (indices into the training set) of h(id) = id * 2654435761 mod 2^20
# (Knuth's multiplicative hash). Ranks carry it in their float32 reductions as two 10-bit halves summed apart:
# each half's sum stays an exact integer in float32 (< 2^24) up to EXACT_SAMPLES samples, in any summation order
SAMPLE_HASH_BITS = 20
_HASH_MULTIPLIER = 2654435761
_HALF = SAMPLE_HASH_BITS // 2
EXACT_SAMPLES = 2 ** (24 - _HALF)
SAMPLE_SLOTS = 3  # what a reduction carries of the samples whose gradients entered it: count, checksum's halves


def sample_hash(ids: np.ndarray) -> np.ndarray:
    """h(id) = id * 2654435761 mod 2^20 of every sample id (exact: unsigned 64-bit products wrap modulo 2^64)."""
    ids = np.asarray(ids).astype(np.uint64).reshape(-1)
    return (ids * np.uint64(_HASH_MULTIPLIER)) & np.uint64(2**SAMPLE_HASH_BITS - 1)


def sample_checksum(ids: np.ndarray) -> int:
    """The checksum of a set of samples: the sum of :func:`sample_hash` over their ids (order-free, additive:
    the checksum of an update is the sum of its contributors' checksums)."""
    return int(sample_hash(ids).sum())


def sample_figures(ids: np.ndarray) -> list[float]:
    """What a rank adds to a step's reduction for the samples it contributes: their count and the two halves of
    their checksum (``SAMPLE_SLOTS`` values; :func:`checksum_of` reads the sum back)."""
    h = sample_hash(ids)
    return [float(len(h)), float((h & np.uint64(2**_HALF - 1)).sum()), float((h >> np.uint64(_HALF)).sum())]


def checksum_of(figures: list[float]) -> int | None:
    """The summed checksum of a reduction's ``sample_figures``, or None where it cannot be exact: more than
    ``EXACT_SAMPLES`` samples (float32 halves may have rounded), or halves that are not whole numbers."""
    count, low, high = (float(v) for v in figures)
    if not all(np.isfinite((count, low, high))) or count > EXACT_SAMPLES or low != round(low) or high != round(high):
        return None
    return int(round(low)) + (int(round(high)) << _HALF)


def shard(indices: np.ndarray, rank: int, size: int) -> np.ndarray:
    """Rank ``rank``'s contiguous share of a global batch split over ``size`` ranks (sizes differ by <= 1)."""
    return np.array_split(indices, size)[rank]



class LocalPartition:
    """GossipGraD's data layout (as in MaTEx-Caffe's gossip code): each rank owns a partition of the training set
    and trains on batches of it; with the ring shuffle, the batch a rank just trained on moves to its right
    neighbour and the left neighbour's batch takes its place, so the partitions mix along the ring without any
    rank holding it all.

    The partitions are a seeded split of the training set over the generation's members (a new generation
    re-shards: a dead rank's partition is not lost with it).
    """

    def __init__(self, n_train: int, position: int, size: int, batch: int, seed: int, generation: int) -> None:
        perm = np.random.default_rng((seed, generation, 1)).permutation(n_train)
        self.pool = np.array_split(perm, size)[position].copy()
        if batch > len(self.pool):
            raise ConfigError("batch_size", f"each rank's batch of {batch} exceeds its partition of {len(self.pool)}")
        self.batch = batch
        self.cursor = 0
        self._rng = np.random.default_rng((seed, generation, 2, position))
        self._rng.shuffle(self.pool)

    def next_batch(self) -> np.ndarray:
        """The sample indices of this step's batch (reshuffles the partition when a pass over it ends)."""
        if self.cursor + self.batch > len(self.pool):
            self._rng.shuffle(self.pool)
            self.cursor = 0
        return self.pool[self.cursor: self.cursor + self.batch].copy()

    def replace(self, received: np.ndarray) -> None:
        """Put the batch received from the left neighbour where this step's batch was, and move on."""
        self.pool[self.cursor: self.cursor + self.batch] = received
        self.cursor += self.batch

    def skip(self) -> None:
        self.cursor += self.batch
