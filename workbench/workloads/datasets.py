"""Image datasets: :class:`Dataset`, readers of the standard on-disk formats (``cifar10:DIR``, ``cifar100:DIR``:
the CIFAR binary version; ``mnist:DIR``, ``fashion_mnist:DIR``: IDX files, plain or gzipped; ``imagefolder:DIR``:
``class/*.png``), with numpy and Pillow, never downloading; and ``synthetic_image``. Images stay uint8 in memory
(CIFAR-10's training set: 150 MB, 600 MB as float32, in every rank process); :meth:`Dataset.train_batch`
normalises per channel and, with ``augment="crop_flip"``, crops and flips each sample as a hash of (seed, step,
sample index) decides: the same whatever the world size. The config checks dataset settings with
:mod:`workbench.workloads.dataset_files` (no torch); :mod:`workbench.workloads.data` (which imports the config)
loads through this one.
"""

from __future__ import annotations

import gzip
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from workbench.base.errors import ConfigError
from workbench.workloads.dataset_files import (
    CIFAR,
    IDX_FILES,
    IDX_SOURCE,
    IMAGE_SUFFIXES,
    check_files,
    cifar_dir,
    class_names,
    expected_files,
    folder_layout,
    idx_path,
    images_in,
)
from workbench.workloads.registry import SPLIT_SEED

PAD = 4  # crop_flip: pixels of zero padding on each side, as in the CIFAR ResNet papers
_IDX_TYPES = {0x08: "u1", 0x09: "i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}


@dataclass
class Dataset:
    """Training and test data. ``x_train`` is float32, or uint8 images (N, C, H, W) when ``mean``/``std`` are set
    (take training batches with :meth:`train_batch`, which normalises them); ``x_test`` is always float32,
    normalised like the training batches."""

    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor
    mean: torch.Tensor | None = None  # per channel, of the uint8 training images
    std: torch.Tensor | None = None
    augment: str = "none"  # RunConfig.augment, set by workbench.workloads.data.load_dataset
    seed: int = 0  # the run's seed: augmentation depends on it
    x_val: torch.Tensor | None = None  # a validation split carved from the training data (float32, normalised)
    y_val: torch.Tensor | None = None
    held: tuple[torch.Tensor, ...] | None = None  # carve_validation's split: training x, y; validation x (raw), y

    @property
    def input_shape(self) -> tuple[int, ...]:
        return tuple(self.x_train.shape[1:])

    @property
    def num_classes(self) -> int:
        return int(max(self.y_train.max().item(), self.y_test.max().item())) + 1

    def train_batch(self, indices: torch.Tensor | np.ndarray, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Float32 inputs and int64 labels of the training samples ``indices`` at training step ``step``."""
        idx = np.asarray(indices.cpu() if isinstance(indices, torch.Tensor) else indices, dtype=np.int64)
        x = self.x_train[torch.from_numpy(idx)]
        if self.augment == "crop_flip":
            x = crop_flip(x, idx, self.seed, step)
        return (self.normalise(x) if self.mean is not None else x), self.y_train[torch.from_numpy(idx)]

    def carve_validation(self, fraction: float) -> None:
        """Hold out ``fraction`` of the training samples (a fixed draw, the same for every seed and rank) as
        ``x_val``/``y_val``; training then never sees them. Decisions taken during training (apoptosis) read
        these, never the test set, which stays for the reported accuracy."""
        n = len(self.y_train)
        held = max(1, round(fraction * n))
        if held >= n:
            raise ConfigError("apoptosis", f"val={fraction} leaves no training sample of {n}")
        order = torch.from_numpy(np.random.default_rng(SPLIT_SEED + 1).permutation(n))
        val, train = order[:held].sort().values, order[held:].sort().values
        self.held = (self.x_train[train], self.y_train[train], self.x_train[val], self.y_train[val])
        self.fold_validation(False)

    def fold_validation(self, folded: bool) -> bool:
        """Put the carved validation split back at the end of the training data (``folded``) or hold it out again;
        returns whether anything changed. Folded, there is no ``x_val``: nothing can decide on samples that
        training sees. Apoptosis folds it once its decisions are over, so the fine-tune uses every sample."""
        if self.held is None or (self.x_val is None) == folded:
            return False
        x, y, x_val, y_val = self.held
        if folded:
            self.x_train, self.y_train = torch.cat([x, x_val]), torch.cat([y, y_val])
            self.x_val = self.y_val = None
        else:
            self.x_train, self.y_train = x, y
            self.x_val, self.y_val = self.normalise(x_val), y_val
        return True

    def normalise(self, images: torch.Tensor) -> torch.Tensor:
        """uint8 images -> float32, per channel ``(x - mean) / std``; float inputs pass unchanged."""
        if self.mean is None or images.is_floating_point():
            return images
        return (images.float() - self.mean[:, None, None]) / self.std[:, None, None]


def image_dataset(x_train: np.ndarray, y_train: np.ndarray, x_test: np.ndarray, y_test: np.ndarray) -> Dataset:
    """A :class:`Dataset` of uint8 images (N, C, H, W): mean/std per channel of the training set, computed once."""
    values, mean, std = np.arange(256, dtype=np.float64), [], []
    for c in range(x_train.shape[1]):  # a histogram per channel: exact, and no float copy of the whole set
        share = np.bincount(x_train[:, c].ravel(), minlength=256) / x_train[:, c].size
        mean.append(share @ values)
        std.append(np.sqrt(share @ (values - mean[-1]) ** 2) or 1.0)  # a constant channel is not scaled
    labels = [torch.from_numpy(np.array(y, dtype=np.int64)) for y in (y_train, y_test)]  # a copy: IDX's are read-only
    data = Dataset(torch.from_numpy(np.require(x_train, np.uint8, "CW")), labels[0], torch.empty(0), labels[1],
                   *torch.tensor([mean, std], dtype=torch.float32))
    data.x_test = data.normalise(torch.from_numpy(np.require(x_test, np.uint8, "CW")))
    return data


# -- augmentation ----------------------------------------------------------------------------------------------
def splitmix64(x: np.ndarray) -> np.ndarray:
    """SplitMix64's finaliser on a uint64 array (wrapping arithmetic): a bijection with well-mixed bits."""
    with np.errstate(over="ignore"):
        z = np.asarray(x, dtype=np.uint64) + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def sample_hash(seed: int, step: int, indices: np.ndarray) -> np.ndarray:
    """One uint64 per sample from (seed, step, sample index) alone: no RNG state, so no dependence on how the
    global batch is split between ranks."""
    with np.errstate(over="ignore"):
        key = splitmix64(splitmix64(np.full(1, seed, dtype=np.uint64)) + np.uint64(step))
        return splitmix64(key + np.asarray(indices, dtype=np.int64).astype(np.uint64))


def crop_flip(images: torch.Tensor, indices: np.ndarray, seed: int, step: int, pad: int = PAD) -> torch.Tensor:
    """Random crop of the zero-padded images (offsets 0..2*pad each way) and horizontal flip, one gather."""
    if images.dim() != 4:
        raise ConfigError("augment", f"'crop_flip' needs (C, H, W) images, the dataset's are {tuple(images.shape[1:])}")
    n, _, height, width = images.shape
    h = sample_hash(seed, step, indices)
    span = np.uint64(2 * pad + 1)
    dy = torch.from_numpy((h % span).astype(np.int64))
    dx = torch.from_numpy(((h >> np.uint64(16)) % span).astype(np.int64))
    flip = torch.from_numpy(((h >> np.uint64(32)) & np.uint64(1)).astype(bool))
    padded = F.pad(images, (pad, pad, pad, pad))  # zeros: black pixels before normalisation
    rows, cols = dy[:, None] + torch.arange(height), torch.arange(width)  # rows: (n, H)
    cols = dx[:, None] + torch.where(flip[:, None], width - 1 - cols, cols)  # (n, W)
    out = padded[torch.arange(n)[:, None, None], :, rows[:, :, None], cols[:, None, :]]  # (n, H, W, C)
    return out.permute(0, 3, 1, 2).contiguous()


# -- checks before any process starts, and dispatch ------------------------------------------------------------






def load_file_dataset(spec: str) -> Dataset:
    """Read ``PREFIX:DIR``; a missing or malformed file is a ConfigError naming it and where to get it."""
    name, _, where = check_files(spec).partition(":")
    if name in CIFAR:
        return cifar(name, Path(where))
    return idx_dataset(name, Path(where)) if name in IDX_SOURCE else imagefolder(Path(where))




# -- CIFAR binary version --------------------------------------------------------------------------------------


def cifar(name: str, directory: Path) -> Dataset:
    """CIFAR-10/100 binary version: records of label byte(s) + 3072 pixel bytes (1024 R, 1024 G, 1024 B, each
    32 rows of 32); CIFAR-100's records hold the coarse then the fine label, and the fine one is used."""
    files, _, label_bytes, classes, source = CIFAR[name]
    folder = cifar_dir(name, directory)
    parts = [_cifar_file(folder / f, label_bytes, classes, source) for f in files]
    train, test = parts[:-1], parts[-1]
    return image_dataset(np.concatenate([x for x, _ in train]), np.concatenate([y for _, y in train]), *test)


def _cifar_file(path: Path, label_bytes: int, classes: int, source: str) -> tuple[np.ndarray, np.ndarray]:
    record = label_bytes + 3 * 32 * 32
    raw = np.fromfile(path, dtype=np.uint8)
    if raw.size == 0 or raw.size % record:
        raise ConfigError("dataset", f"{path} is truncated or not a CIFAR binary file: {raw.size} bytes is not a "
                          f"whole number of {record}-byte records; {source}")
    rows = raw.reshape(-1, record)
    labels = rows[:, label_bytes - 1].astype(np.int64)  # CIFAR-100: the fine label, after the coarse one
    if labels.max() >= classes:
        bad = int(np.argmax(labels >= classes))
        raise ConfigError("dataset", f"{path}: record {bad} has label {labels[bad]}, not one of 0..{classes - 1}: "
                          f"not this dataset's file; {source}")
    return rows[:, label_bytes:].reshape(-1, 3, 32, 32), labels


# -- IDX (MNIST, Fashion-MNIST) ---------------------------------------------------------------------------------


def read_idx(path: Path, source: str = "") -> np.ndarray:
    """One IDX file (plain or gzipped): magic 0x00 0x00 TYPE NDIM, NDIM big-endian uint32 sizes, then the data,
    big-endian. The header is checked against the file's length."""
    where = f"; {source}" if source else ""
    try:
        raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    except (OSError, EOFError) as exc:
        raise ConfigError("dataset", f"{path} cannot be read as gzip: {exc}{where}") from None
    if len(raw) < 4 or raw[0] or raw[1] or raw[2] not in _IDX_TYPES or not 1 <= raw[3] <= 8:
        magic = raw[:4].hex() if len(raw) >= 4 else f"{len(raw)} bytes"
        raise ConfigError("dataset", f"{path} is not an IDX file: bad magic number {magic} (expected 0000TTNN: "
                          f"TT a type code 08..0e, NN the number of dimensions){where}")
    ndim, dtype = raw[3], np.dtype(_IDX_TYPES[raw[2]])
    if len(raw) < 4 + 4 * ndim:
        raise ConfigError("dataset", f"{path} is truncated: its header needs {4 + 4 * ndim} bytes{where}")
    dims = struct.unpack(f">{ndim}I", raw[4: 4 + 4 * ndim])
    size = int(np.prod(dims)) * dtype.itemsize
    if len(raw) != 4 + 4 * ndim + size:
        raise ConfigError("dataset", f"{path} is truncated or has extra bytes: its header says {size} bytes of data "
                          f"({'x'.join(map(str, dims))} x {dtype.itemsize}), it holds {len(raw) - 4 - 4 * ndim}{where}")
    return np.frombuffer(raw, dtype=dtype, offset=4 + 4 * ndim).reshape(dims)


def idx_dataset(name: str, directory: Path) -> Dataset:
    """MNIST or Fashion-MNIST: 28x28 uint8 images (N, 1, 28, 28) and labels 0..9 from their four IDX files."""
    source = IDX_SOURCE[name]
    arrays = [read_idx(idx_path(name, directory, f), source) for f in IDX_FILES]
    for path_name, array, ndim in zip(IDX_FILES, arrays, (3, 1, 3, 1)):
        if array.dtype != np.uint8 or array.ndim != ndim:
            raise ConfigError("dataset", f"{directory / path_name}: expected {ndim}-dimensional uint8 data, found "
                              f"{array.ndim}-dimensional {array.dtype}; {source}")
    for images, labels, split in ((arrays[0], arrays[1], "train"), (arrays[2], arrays[3], "t10k")):
        if len(images) != len(labels) or (len(labels) and labels.max() > 9):
            raise ConfigError("dataset", f"{name}: {split} images ({len(images)}) and labels ({len(labels)}, max "
                              f"{labels.max() if len(labels) else '-'}) do not match as 10-class data; {source}")
    return image_dataset(arrays[0][:, None], arrays[1], arrays[2][:, None], arrays[3])


# -- image folders ---------------------------------------------------------------------------------------------






def imagefolder(directory: Path) -> Dataset:
    """Images in class folders, classes sorted by name; without train/test folders, a fixed seeded 20 % of each
    class is the test set. Every image must have the same size; grey images stay 1 channel unless some are colour."""
    train_dir, test_dir = folder_layout(directory)
    classes = class_names(train_dir)
    train = [(p, label) for label, c in enumerate(classes) for p in images_in(train_dir / c)]
    if test_dir is not None:
        unknown = sorted(set(class_names(test_dir)) - set(classes))
        if unknown:
            raise ConfigError("dataset", f"imagefolder: {test_dir / unknown[0]} is a class that {train_dir} does not "
                              f"have (classes: {', '.join(classes)})")
        test = [(p, classes.index(c)) for c in class_names(test_dir) for p in images_in(test_dir / c)]
    else:
        rng = np.random.default_rng(SPLIT_SEED)
        labels = np.array([label for _, label in train])
        held = {int(i) for c in range(len(classes)) for i in
                rng.permutation(np.flatnonzero(labels == c))[: round(0.2 * np.sum(labels == c))]}
        train, test = [s for i, s in enumerate(train) if i not in held], [s for i, s in enumerate(train) if i in held]
    for split, samples in (("training", train), ("test", test)):
        if not samples:
            raise ConfigError("dataset", f"imagefolder: {directory} has no {split} images "
                              f"({'/'.join(IMAGE_SUFFIXES)}); {expected_files('imagefolder')}")
    images = _decode([p for p, _ in train + test])
    labels = np.array([label for _, label in train + test], dtype=np.int64)
    n = len(train)
    return image_dataset(images[:n], labels[:n], images[n:], labels[n:])


def _decode(paths: list[Path]) -> np.ndarray:
    """Decode with Pillow into one uint8 array (N, C, H, W); C is 1 when every image is grey, else 3 (RGB)."""
    from PIL import Image, UnidentifiedImageError

    headers = []
    for path in paths:  # Image.open reads the header only: sizes and modes are checked before decoding
        try:
            with Image.open(path) as image:
                headers.append((image.size, image.mode))
        except (OSError, UnidentifiedImageError) as exc:
            raise ConfigError("dataset", f"imagefolder: {path} cannot be read as an image: {exc}") from None
        if headers[-1][0] != headers[0][0]:
            (w, h), (w0, h0) = headers[-1][0], headers[0][0]
            raise ConfigError("dataset", f"imagefolder: {path} is {w}x{h} but {paths[0]} is {w0}x{h0}: every image "
                              "must have the same size (resize them first)")
    grey = all(mode in ("1", "L") for _, mode in headers)
    (width, height) = headers[0][0]
    out = np.empty((len(paths), 1 if grey else 3, height, width), dtype=np.uint8)
    for i, path in enumerate(paths):
        with Image.open(path) as image:
            pixels = np.asarray(image.convert("L" if grey else "RGB"))
        out[i] = pixels[None] if grey else pixels.transpose(2, 0, 1)
    return out


# -- synthetic_image -------------------------------------------------------------------------------------------
DISTRACTOR = 1.2  # the second class's largest weight: above 1 (a sixth of the images) it outweighs the label's
GAIN = (0.6, 1.4)  # the label's pattern's weight, uniform
NOISE = 2.5  # the pixel noise's standard deviation, in units of a pattern's (1)
SCALE = 12.0  # pixel value = 128 + SCALE x, rounded and clipped to 0..255
# synthetic_noisy: no second class; the label's pattern at 0.6 of its weight under the same noise, so what makes
# it hard is signal against noise, and the Bayes rule (workbench.workloads.ceiling) is computable
NOISY_SIGNAL = 0.6
# synthetic_faint: synthetic_noisy fainter still, so that a vgg11 trained for the apoptosis design's 600 steps stays
# well below its Bayes ceiling (at 0.6 it reaches 99.6 % by step 300)
FAINT_SIGNAL = 0.3


def synthetic_image(size: int, num_classes: int = 10, side: int = 32, distractor: float = DISTRACTOR,
                    signal: float = 1.0) -> Dataset:
    """CIFAR-shaped (3 x 32 x 32) images of ``num_classes`` classes: each class is a sum of three low-frequency
    colour waves, shifted at random per sample, with random gain (``signal`` x ``GAIN``), colour cast and strong
    pixel noise, and a second class's waves laid over it at a random weight up to ``distractor`` times its own: no
    single pixel tells the class, and where the other class outweighs its own no model can (about 40 % of images
    are ambiguous; the matched-filter oracle scores 79 %, the Bayes rule at most 81.25 %:
    :mod:`workbench.workloads.ceiling`; lenet5 plateaus near 78 % after ~600 steps of 64). ``size`` training
    samples, size/4 (at least 16) test samples; the same data for the same size, whatever the run's seed."""
    patterns = class_patterns(num_classes, side)
    rng = np.random.default_rng(SPLIT_SEED + size)
    x_train, y_train = draw_images(rng, patterns, size, distractor, signal)
    x_test, y_test = draw_images(rng, patterns, max(size // 4, 16), distractor, signal)
    return image_dataset(x_train, y_train, x_test, y_test)


def synthetic_noisy(size: int) -> Dataset:
    """``synthetic_image`` without the second class (``distractor=0``) and its waves at ``NOISY_SIGNAL`` of their
    weight: every label is unambiguous and the difficulty is the noise's (the Bayes rule scores 100 %,
    :func:`workbench.workloads.ceiling.synthetic_ceiling`; lenet5 ~70-80 % after 300 steps of 64, 96-98 % after
    600)."""
    return synthetic_image(size, distractor=0.0, signal=NOISY_SIGNAL)


def synthetic_faint(size: int) -> Dataset:
    """``synthetic_noisy`` with its waves at ``FAINT_SIGNAL`` of their weight: unambiguous labels, a Bayes ceiling
    near 100 % (:func:`workbench.workloads.ceiling.synthetic_faint_ceiling`), and a long way for a trained model
    to go to it (docs/reproduce.md, "Ceilings")."""
    return synthetic_image(size, distractor=0.0, signal=FAINT_SIGNAL)


def class_patterns(num_classes: int = 10, side: int = 32) -> np.ndarray:
    """The classes' waves (num_classes, 3, side, side), each of standard deviation 1 and mean 0 per channel."""
    rng = np.random.default_rng(SPLIT_SEED)  # the classes do not depend on the size
    yy, xx = np.mgrid[0:side, 0:side].astype(np.float32)
    patterns = np.zeros((num_classes, 3, side, side), dtype=np.float32)
    for k in range(num_classes):
        for _ in range(3):
            fx, fy = 0, 0
            while fx == 0 and fy == 0:  # a constant is no pattern
                fx, fy = rng.integers(-2, 3, size=2)
            phase = rng.uniform(0, 2 * np.pi)
            colour = rng.normal(size=3).astype(np.float32)
            patterns[k] += colour[:, None, None] * np.cos(2 * np.pi * (fx * xx + fy * yy) / side + phase)
        patterns[k] /= patterns[k].std()
    return patterns


def draw_images(rng: np.random.Generator, patterns: np.ndarray, n: int, distractor: float = DISTRACTOR,
                signal: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """``n`` uint8 images of ``patterns``' classes and their labels, drawn from ``rng`` (see :func:`synthetic_image`;
    the defaults draw synthetic_image's)."""
    classes, _, side, _ = patterns.shape
    y = rng.integers(0, classes, size=n)
    # every shifted copy of a periodic pattern is a window of the pattern tiled 2x2: one vectorised gather
    windows = np.lib.stride_tricks.sliding_window_view(np.tile(patterns, (1, 1, 2, 2)), (side, side), axis=(2, 3))
    out = np.empty((n, 3, side, side), dtype=np.uint8)
    for start in range(0, n, 4096):  # in chunks: a float copy of the whole set would be 4x its uint8 size
        m = min(4096, n - start)
        dy, dx = rng.integers(0, side, size=(2, m))  # the waves are periodic: any shift keeps the class
        x = windows[y[start: start + m], :, dy, dx] * rng.uniform(*GAIN, size=(m, 1, 1, 1)).astype(np.float32)
        if signal != 1.0:
            x *= np.float32(signal)
        other = (y[start: start + m] + rng.integers(1, classes, size=m)) % classes  # a different class
        oy, ox = rng.integers(0, side, size=(2, m))
        x += windows[other, :, oy, ox] * rng.uniform(0, distractor, size=(m, 1, 1, 1)).astype(np.float32)
        x += rng.normal(0.0, 0.3, size=(m, 3, 1, 1)).astype(np.float32)
        x += NOISE * rng.standard_normal(size=x.shape, dtype=np.float32)
        out[start: start + m] = np.clip(np.round(128 + SCALE * x), 0, 255)
    return out, y.astype(np.int64)
