"""What the configuration checks about a dataset before any process starts, without importing torch (the process
that starts a run need not): the built-in names, the on-disk forms ``PREFIX:DIR`` and the files each needs, and
where the user gets them. :mod:`workbench.workloads.datasets` reads the files.
"""

from __future__ import annotations

import os
from pathlib import Path

from workbench.base.callables import IMPORT_PATH, resolve_callable
from workbench.base.errors import ConfigError
from workbench.workloads import registry

DATA_DIR = Path(__file__).resolve().parents[2] / "data"  # the repository's data/ folder: the bundled files
AUGMENTS = ("none", "crop_flip")
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg")
CIFAR = {  # name: (files, extracted folder, label bytes per record, classes, where the user gets the files)
    "cifar10": ([f"data_batch_{i}.bin" for i in range(1, 6)] + ["test_batch.bin"], "cifar-10-batches-bin", 1, 10,
                "the CIFAR-10 binary version from https://www.cs.toronto.edu/~kriz/cifar-10-binary.tar.gz, extracted"),
    "cifar100": (["train.bin", "test.bin"], "cifar-100-binary", 2, 100,
                 "the CIFAR-100 binary version from https://www.cs.toronto.edu/~kriz/cifar-100-binary.tar.gz, "
                 "extracted"),
}
IDX_FILES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")
IDX_SOURCE = {
    "mnist": "MNIST's four IDX files (.gz or unpacked) from https://ossci-datasets.s3.amazonaws.com/mnist/ "
             "(a mirror of http://yann.lecun.com/exdb/mnist/)",
    "fashion_mnist": "Fashion-MNIST's four IDX files (.gz or unpacked) from "
                     "https://github.com/zalandoresearch/fashion-mnist (data/fashion/)",
}


def is_file_dataset(spec: object) -> bool:
    """Whether ``spec`` names a dataset on disk (``cifar10:DIR``, ...), before it could pass for an import path."""
    entry = registry.dataset(spec)
    return entry is not None and entry.on_disk


def check_dataset(spec: object, augment: object = "none", synthetic_size: object = 4096) -> str:
    """RunConfig's check of ``dataset``, ``augment``, ``synthetic_size``: a DIR must hold the expected files (read
    at load), and comes back absolute, so every rank finds it whatever its working directory."""
    entry = registry.dataset(spec)
    if entry is not None and entry.on_disk:  # first: "cifar10:data" also reads as an import path
        spec = check_files(str(spec))
    elif entry is None and isinstance(spec, str) and IMPORT_PATH.match(spec):
        resolve_callable("dataset", spec)
    elif entry is not None and entry.bundled:
        entry.verify_file(bundled_file(str(spec)))
    elif entry is None:
        raise ConfigError("dataset", f"{spec!r} is not known: allowed {', '.join(registry.dataset_forms())} or an "
                          "import path 'package.module:callable'")
    if type(synthetic_size) is not int or not 16 <= synthetic_size <= 100_000_000:
        raise ConfigError("synthetic_size", f"{synthetic_size!r} is out of range: allowed integers 16..100000000")
    if augment not in AUGMENTS:
        raise ConfigError("augment", f"{augment!r} is not known: allowed {', '.join(AUGMENTS)}")
    if augment != "none" and entry is not None and not entry.crops:
        side = "x".join(map(str, (entry.input_shape or ("?", "?"))[-2:]))
        raise ConfigError("augment", f"{augment!r} crops and flips images; {spec!r} is {side} (a 4-pixel shift loses "
                          "half of it): use it with synthetic_image or a dataset on disk")
    return str(spec)


def bundled_file(name: str) -> Path:
    """The file a built-in dataset is read from. Missing, it is an error, never a silent fall back to rebuilding
    it (digits from scikit-learn costs each rank ~2.4 s of CPU at start: docs/concepts.md, "No silent
    fallback")."""
    entry = registry.dataset(name)
    path = DATA_DIR / str(entry.bundled if entry and entry.bundled else name)
    if not path.is_file():
        raise ConfigError("dataset", f"{name!r} reads its bundled file {path}, which is missing: restore it from the "
                                     f"repository (git checkout -- data/{path.name})")
    return path


def check_files(spec: str) -> str:
    name, _, where = spec.partition(":")
    if not where:
        raise ConfigError("dataset", f"{spec!r} names no directory: use {name}:DIR")
    directory = Path(os.path.abspath(os.path.expanduser(where)))
    if not directory.is_dir():
        raise ConfigError("dataset", f"{name}: directory {str(directory)!r} does not exist; {expected_files(name)}")
    if name in CIFAR:
        cifar_dir(name, directory)
    elif name in IDX_SOURCE:
        for file in IDX_FILES:
            idx_path(name, directory, file)
    else:
        folder_layout(directory)
    return f"{name}:{directory}"


def expected_files(name: str) -> str:
    if name in CIFAR:
        files, folder, *_, source = CIFAR[name]
        return f"expected {', '.join(files)} in it or in its {folder}/: {source}"
    if name in IDX_SOURCE:
        return f"expected {', '.join(IDX_FILES)} (each optionally .gz): {IDX_SOURCE[name]}"
    return "expected train/<class>/*.png and test/<class>/*.png (or val/), or <class>/*.png: your own images"


def cifar_dir(name: str, directory: Path) -> Path:
    """DIR itself when it holds the files, else the extracted folder inside it when there is one."""
    files, folder = CIFAR[name][:2]
    if not all((directory / f).is_file() for f in files) and (directory / folder).is_dir():
        directory = directory / folder
    missing = [f for f in files if not (directory / f).is_file()]
    if missing:
        raise ConfigError("dataset", f"{name}: {directory / missing[0]} is missing; {expected_files(name)}")
    return directory


def idx_path(name: str, directory: Path, file: str) -> Path:
    for candidate in (directory / file, directory / f"{file}.gz"):
        if candidate.is_file():
            return candidate
    raise ConfigError("dataset", f"{name}: {directory / file} (or .gz) is missing; {expected_files(name)}")


def folder_layout(directory: Path) -> tuple[Path, Path | None]:
    """(train folder, test folder) of ``DIR/train`` + ``DIR/test`` (or ``val``), or (DIR, None) for class
    folders directly in DIR (the test split is then drawn from them)."""
    if (directory / "train").is_dir():
        test = next((directory / t for t in ("test", "val") if (directory / t).is_dir()), None)
        if test is None:
            raise ConfigError("dataset", f"imagefolder: {directory / 'test'} (or val/) is missing beside train/; "
                              f"{expected_files('imagefolder')}")
        layout: tuple[Path, Path | None] = (directory / "train", test)
    else:
        layout = (directory, None)
    if not class_names(layout[0]):
        raise ConfigError("dataset", f"imagefolder: {layout[0]} holds no class folders; "
                          f"{expected_files('imagefolder')}")
    return layout


def class_names(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.is_dir() and not p.name.startswith("."))


def images_in(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES and p.is_file())


def user_arrays(spec: str) -> tuple:
    """The four arrays a user's loader ``spec`` (``package.module:callable``) returns, as numpy arrays, checked
    before any rank starts: four array-likes (a tuple or a dict of x_train, y_train, x_test, y_test), matching
    lengths, at least one sample each, the same sample shape in both splits, finite numeric inputs, and labels that
    are whole numbers from 0 up (the classes: the largest label + 1). Each miss is a one-line ConfigError."""
    import numpy as np

    loader = resolve_callable("dataset", spec)
    try:
        parts = loader()
    except Exception as exc:  # noqa: BLE001 - the user's loader: whatever it raises is one line
        raise ConfigError("dataset", f"{spec!r} raised {type(exc).__name__}: {' '.join(str(exc).split())}") from None
    names = ("x_train", "y_train", "x_test", "y_test")
    if isinstance(parts, dict):
        parts = tuple(parts.get(k) for k in names)
    if not isinstance(parts, (tuple, list)) or len(parts) != 4 or any(p is None for p in parts):
        got = f"{len(parts)} values" if isinstance(parts, (tuple, list)) else type(parts).__name__
        raise ConfigError("dataset", f"{spec!r} returned {got}: it must return (x_train, y_train, x_test, y_test) "
                                     "or a dict of those four")
    try:
        arrays = [np.asarray(p) for p in parts]
    except (ValueError, TypeError) as exc:
        raise ConfigError("dataset", f"{spec!r} returned values that are not arrays: {exc}") from None
    for x, y, split in ((arrays[0], arrays[1], "train"), (arrays[2], arrays[3], "test")):
        if x.ndim < 1 or y.ndim != 1 or len(x) != len(y) or not len(y):
            raise ConfigError("dataset", f"{spec!r}: x_{split} has {len(x) if x.ndim else 0} samples and y_{split} "
                                         f"{len(y) if y.ndim else 0} labels of shape {y.shape}: they must be equal in "
                                         "number, at least 1, and the labels one per sample")
        if not np.issubdtype(x.dtype, np.number) or np.issubdtype(x.dtype, np.complexfloating):
            raise ConfigError("dataset", f"{spec!r}: x_{split} is of type {x.dtype}, not real numbers")
        bad = int(np.count_nonzero(~np.isfinite(x.reshape(len(x), -1)).all(axis=1)))
        if bad:
            raise ConfigError("dataset", f"{spec!r}: {bad} of the {len(x)} x_{split} samples hold NaN or infinite "
                                         "values: inputs must be finite")
        whole = np.issubdtype(y.dtype, np.integer) or (np.issubdtype(y.dtype, np.floating)
                                                      and np.isfinite(y).all() and (y == np.round(y)).all())
        if not whole or y.min() < 0:
            raise ConfigError("dataset", f"{spec!r}: y_{split} must hold whole-number class labels from 0 up "
                                         f"(found {y.dtype}, smallest {y.min()!r})")
    if arrays[0].shape[1:] != arrays[2].shape[1:]:
        raise ConfigError("dataset", f"{spec!r}: a training sample is of shape {arrays[0].shape[1:]}, a test sample "
                                     f"{arrays[2].shape[1:]}: they must match")
    return tuple(arrays)
