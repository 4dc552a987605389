"""Checks of a run's configuration that need more than its values: the dataset's size, the checkpoint it resumes,
the model a user's import path builds.

:func:`check` runs in :func:`workbench.launch.session.prepare`, before any rank process starts, so each mistake is one
:class:`~workbench.base.errors.ConfigError` (exit 2 on the command line) instead of a rank's error after the ranks
started, or a run that "completes" on nonsense: finite floats, a batch that fits the training set, a resume
checkpoint below ``steps`` of this run's model and dataset, an import path that returns an ``nn.Module``. The
list in full: docs/internals.md.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import math
import numbers
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from workbench.base import machine
from workbench.base.callables import IMPORT_PATH
from workbench.base.errors import ConfigError
from workbench.config import resize_rule
from workbench.config.run import RunConfig
from workbench.faults import kinds
from workbench.workloads import registry
from workbench.workloads.dataset_files import CIFAR, IDX_FILES, IDX_SOURCE, expected_files, is_file_dataset, user_arrays

_IDX_SIZES = {0x08: 1, 0x09: 1, 0x0B: 2, 0x0C: 4, 0x0D: 4, 0x0E: 8}  # IDX type code -> bytes per value


@dataclass
class DatasetInfo:
    """What a dataset is, as far as it is known without loading it (None: not known)."""

    n_train: int | None
    input_shape: tuple[int, ...] | None
    num_classes: int | None  # None where only reading every label would tell (a subset may lack classes)
    user: bool = False  # read from the user's loader: the model is tried on its inputs before any rank starts


def check(config: Any) -> None:
    """Every check of the module docstring; ConfigError (one line) for the first that fails."""
    finite_floats(config)
    try:
        machine.check_given()
    except ValueError as exc:
        raise ConfigError("environment", str(exc)) from None
    info = dataset_info(config.dataset, config.synthetic_size)
    check_batch(config, info)
    check_takes(config, info)
    if config.resume is not None:
        check_resume(config, info)
    if (IMPORT_PATH.match(config.model) or info.user) and info.input_shape is not None:
        model = build(config, info)
        if info.user:  # the user's data: the model is tried on two of its inputs
            fits(config, info, model)


def check_takes(config: Any, info: DatasetInfo) -> None:
    """A registered model takes the dataset's samples: signals (length,) or images (C, H, W), as its entry says."""
    entry = registry.model(config.model)
    if entry is None or not entry.takes or info.input_shape is None or len(info.input_shape) in entry.takes:
        return
    kinds = {1: "1-D signals (length,)", 2: "2-D inputs (H, W)", 3: "images (C, H, W)"}
    raise ConfigError("model", f"{config.model!r} takes {' or '.join(kinds[n] for n in entry.takes)}; "
                               f"{config.dataset!r} gives samples of shape {tuple(info.input_shape)}")


def finite_floats(config: Any) -> None:
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        if isinstance(value, numbers.Real) and not isinstance(value, numbers.Integral) and not math.isfinite(value):
            raise ConfigError(f.name, f"{value!r} is not a finite number")


# -- the dataset -------------------------------------------------------------------------------------------------
def dataset_info(spec: str, synthetic_size: int) -> DatasetInfo:
    """Size, input shape and classes of the dataset ``spec`` (validated by RunConfig), read cheaply; a file the
    ranks would refuse (an empty or truncated one) is a ConfigError here already."""
    entry = registry.dataset(spec)
    if entry is not None and not entry.on_disk:  # known without loading it
        if entry.sized:  # the synthetic sets draw labels at random: a small one may lack a class (fewer outputs)
            return DatasetInfo(synthetic_size, entry.input_shape, entry.classes if synthetic_size >= 1000 else None)
        return DatasetInfo(entry.train_size, entry.input_shape, entry.classes)
    if entry is None:  # the user's loader: called once here, its arrays checked (dataset_files.user_arrays)
        x_train, y_train, _, y_test = user_arrays(spec)
        return DatasetInfo(len(x_train), tuple(x_train.shape[1:]), int(max(y_train.max(), y_test.max())) + 1,
                           user=True)
    name, _, where = spec.partition(":")
    if name in CIFAR:
        return _cifar(name, Path(where))
    if name in IDX_SOURCE:
        return _idx(name, Path(where))
    return _imagefolder(Path(where))


def _cifar(name: str, directory: Path) -> DatasetInfo:
    from workbench.workloads.dataset_files import cifar_dir

    files, _, label_bytes, classes, source = CIFAR[name]
    folder = cifar_dir(name, directory)
    record = label_bytes + 3 * 32 * 32
    sizes = []
    for file in files:
        size = (folder / file).stat().st_size
        if size == 0 or size % record:
            raise ConfigError("dataset", f"{folder / file} is truncated or not a CIFAR binary file: {size} bytes is "
                              f"not a whole number of {record}-byte records; {source}")
        sizes.append(size // record)
    return DatasetInfo(sum(sizes[:-1]), (3, 32, 32), None)


def _idx(name: str, directory: Path) -> DatasetInfo:
    from workbench.workloads.dataset_files import idx_path

    dims, labels = {}, []
    for file in IDX_FILES:
        dims[file], data = _idx_header(idx_path(name, directory, file), IDX_SOURCE[name], "labels" in file)
        labels.append(data)
    for images, label_file in ((IDX_FILES[0], IDX_FILES[1]), (IDX_FILES[2], IDX_FILES[3])):
        if len(dims[images]) != 3 or len(dims[label_file]) != 1 or dims[images][0] != dims[label_file][0]:
            raise ConfigError("dataset", f"{name}: {directory / images} ({'x'.join(map(str, dims[images]))}) and "
                              f"{label_file} ({'x'.join(map(str, dims[label_file]))}) are not the images and labels "
                              f"of one set; {expected_files(name)}")
    known = [data for data in labels if data is not None]
    top = max((max(data) for data in known if data), default=-1) if len(known) == 2 else -1
    return DatasetInfo(dims[IDX_FILES[1]][0], (1, *dims[IDX_FILES[0]][1:]), top + 1 if top >= 0 else None)


def _idx_header(path: Path, source: str, labels: bool) -> tuple[tuple[int, ...], bytes | None]:
    """The dimensions of an IDX file and, for a labels file of bytes (small), its labels. A plain file's length
    is checked against its header (a gzipped images file's, by the ranks: that needs all of it)."""
    try:
        opener = gzip.open if path.suffix == ".gz" else open
        with opener(path, "rb") as f:
            raw = f.read() if labels else f.read(4 + 4 * 8)
    except (OSError, EOFError) as exc:
        raise ConfigError("dataset", f"{path} cannot be read: {exc}; {source}") from None
    if len(raw) < 4 or raw[0] or raw[1] or raw[2] not in _IDX_SIZES or not 1 <= raw[3] <= 8 or \
            len(raw) < 4 + 4 * raw[3]:
        raise ConfigError("dataset", f"{path} is not an IDX file (bad or truncated header); {source}")
    ndim = raw[3]
    dims = tuple(int.from_bytes(raw[4 + 4 * i: 8 + 4 * i], "big") for i in range(ndim))
    size = math.prod(dims) * _IDX_SIZES[raw[2]]
    length = len(raw) if labels else (None if path.suffix == ".gz" else path.stat().st_size)
    if length is not None and length != 4 + 4 * ndim + size:
        raise ConfigError("dataset", f"{path} is truncated or has extra bytes: its header says {size} bytes of data, "
                          f"it holds {length - 4 - 4 * ndim}; {source}")
    return dims, (raw[4 + 4 * ndim:] if labels and raw[2] == 0x08 else None)


def _imagefolder(directory: Path) -> DatasetInfo:
    from workbench.workloads.dataset_files import IMAGE_SUFFIXES, class_names, folder_layout, images_in

    train_dir, test_dir = folder_layout(directory)
    counts = [len(images_in(train_dir / c)) for c in class_names(train_dir)]
    if test_dir is not None:
        n_train, n_test = sum(counts), sum(len(images_in(test_dir / c)) for c in class_names(test_dir))
    else:  # a fixed 20 % of each class is the test set (workbench.workloads.datasets.imagefolder)
        n_test = sum(round(0.2 * n) for n in counts)
        n_train = sum(counts) - n_test
    for split, n in (("training", n_train), ("test", n_test)):
        if not n:
            raise ConfigError("dataset", f"imagefolder: {directory} has no {split} images "
                              f"({'/'.join(IMAGE_SUFFIXES)}); {expected_files('imagefolder')}")
    return DatasetInfo(n_train, None, None)


def check_batch(config: Any, info: DatasetInfo) -> None:
    n = info.n_train
    if n is None:
        resize_rule.check_sizes(config, None)  # a resumed checkpoint's base still has to divide batch_size
        return
    where = f"the {n} training samples of {config.dataset}"
    if config.apoptosis is not None:  # its rule decides on a validation split carved from the training data
        from workbench.workloads.apoptosis.rule import ApoptosisConfig

        n -= max(1, round(ApoptosisConfig.parse(config.apoptosis).val * n))
        where = f"the {n} training samples of {config.dataset} left beside apoptosis's validation split"
    if config.batch_size > n:
        raise ConfigError("batch_size", f"{config.batch_size} is larger than {where}")
    if config.mode.partitions and max(1, config.batch_size // config.world_size) > n // config.world_size:
        raise ConfigError("batch_size", f"{config.batch_size} over {config.world_size} ranks: each rank's batch "
                          f"exceeds its partition of {n // config.world_size} samples")
    resize_rule.check_sizes(config, n)  # linear: the global batch of every planned size


# -- a resume ----------------------------------------------------------------------------------------------------
def check_resume(config: Any, info: DatasetInfo) -> None:
    """The checkpoint ``config.resume`` (its checksums and kind checked by RunConfig) fits this run."""
    import h5py

    path = config.resume
    try:
        with h5py.File(path, "r") as f:
            step = int(f.attrs["step"])
            recorded = json.loads(f.attrs.get("config", "{}"))
            shapes = {name: tuple(d.shape) for name, d in f["model"].items()}
            narrowed = "apoptosis" in f.attrs
    except (OSError, KeyError, ValueError, TypeError) as exc:
        raise ConfigError("resume", f"{path} cannot be read as a workbench checkpoint ({exc})") from None
    if step >= config.steps:
        raise ConfigError("resume", f"checkpoint {path} is at step {step} and the run has steps={config.steps}: "
                          f"nothing is left to train (give more than {step} steps)")
    if recorded:
        _same_setup(config, recorded, path)
    if not (narrowed or config.apoptosis or recorded.get("apoptosis")) and info.num_classes is not None:
        _same_shapes(config, info, shapes, path)


def _setup(values: dict[str, Any]) -> dict[str, Any]:
    """What fixes a model's parameters: the model, its knobs, and the dataset (its kind: a copy elsewhere is fine)."""
    model, dataset = values.get("model"), str(values.get("dataset"))
    setup = {"model": model, "dataset": dataset.partition(":")[0] if is_file_dataset(dataset) else dataset}
    entry = registry.model(model)
    for knob in entry.knobs if entry else ():  # the knobs it takes fix its parameters: a checkpoint's must match
        setup[knob] = values.get(knob, 1.0) if knob == "width" else list(values.get(knob) or [])
    return setup


def _same_setup(config: Any, recorded: dict[str, Any], path: str) -> None:
    theirs = _setup(recorded)
    ours = _setup({"model": config.model, "hidden": config.hidden, "width": config.width, "dataset": config.dataset})
    differ = [k for k in ("model", "dataset") if theirs[k] != ours[k]]
    if "model" not in differ:  # the same model: its knobs (hidden widths, width)
        differ += [k for k in ours if k not in ("model", "dataset") and theirs.get(k) != ours[k]]
    if differ:
        said = ", ".join(f"{k}={theirs.get(k)!r}" for k in differ)
        asked = ", ".join(f"{k}={ours.get(k)!r}" for k in differ)
        raise ConfigError("resume", f"checkpoint {path} was written by a run of {said}; this run has {asked}: "
                          "resume with the checkpoint's settings")


def _same_shapes(config: Any, info: DatasetInfo, shapes: dict[str, tuple[int, ...]], path: str) -> None:
    model = build(config, info)
    ours = {name: tuple(t.shape) for name, t in model.state_dict().items()}
    for name in sorted(set(ours) | set(shapes)):
        if ours.get(name) != shapes.get(name):
            held = f"model/{name} of shape {shapes[name]}" if name in shapes else f"no model/{name}"
            mine = f"shape {ours[name]}" if name in ours else "no such tensor"
            raise ConfigError("resume", f"checkpoint {path} holds {held}; this run's model ({config.model}) has "
                              f"{mine}: it is another model's checkpoint")


# -- the model ---------------------------------------------------------------------------------------------------
def build(config: Any, info: DatasetInfo) -> Any:
    """The run's model, as a rank builds it (torch); a user's factory that fails or returns no ``nn.Module`` is a
    ConfigError."""
    from workbench.workloads.models import build_model

    try:
        return build_model(config, info.input_shape, info.num_classes or 10)
    except ConfigError:
        raise
    except Exception as exc:  # noqa: BLE001 - the user's factory: whatever it raises is one line
        text = " ".join(str(exc).split())
        raise ConfigError("model", f"{config.model!r} raised {type(exc).__name__}: {text}") from None


def fits(config: Any, info: DatasetInfo, model: Any) -> None:
    """The model takes two of the dataset's inputs and gives one score per class (ConfigError otherwise)."""
    import torch

    try:
        with torch.no_grad():
            out = model.eval()(torch.zeros(2, *info.input_shape))
    except Exception as exc:  # noqa: BLE001 - a model that does not take these inputs: whatever it raises
        text = " ".join(str(exc).split())
        raise ConfigError("model", f"{config.model!r} does not take {config.dataset!r}'s inputs of shape "
                                   f"{info.input_shape}: {type(exc).__name__}: {text}") from None
    if info.num_classes is not None and tuple(getattr(out, "shape", ())) != (2, info.num_classes):
        raise ConfigError("model", f"{config.model!r} gives outputs of shape {tuple(getattr(out, 'shape', ()))} for "
                                   f"2 inputs; {config.dataset!r} has {info.num_classes} classes")


# a prepared configuration's mark: its values when prepare() gave it back (the CLI prepares before it starts the
# rank template, then start() prepares again: the second time costs a comparison)
_PREPARED = "_prepared_as"


def prepare(config: RunConfig | dict[str, Any] | None = None, **overrides: Any) -> RunConfig:
    """The run's validated configuration, or a ConfigError saying what is wrong, without starting anything: what
    :func:`start` checks first (a campaign checks all its runs this way before it runs the first). Pipeline and
    hybrid configurations come back with their ``stage_cuts``. What needs more than the values (the dataset's
    size, a resumed checkpoint, a user's model) is checked here too (:func:`check`). Light on purpose: the CLI
    calls it before the session is imported, so the rank template can start importing torch that much sooner.
    A configuration it gave back, unchanged since and without overrides, comes back as it is, unchecked again (the
    CLI's, when :func:`~workbench.launch.session.start` prepares it once more)."""
    if isinstance(config, RunConfig) and not overrides and getattr(config, _PREPARED, None) == config.to_json():
        return config  # prepared already, and not changed since: what it fell back on stays kept for its run
    from workbench.base import fallbacks
    from workbench.config import devices

    if config is None or isinstance(config, dict):
        config = RunConfig.from_dict({**(config or {}), **overrides})
    else:  # its derived defaults derived again where an override changes what they follow from
        config = config.overridden(**overrides)
    with fallbacks.preparing():  # auto on a machine without a GPU: said, and recorded by the run started next
        config = devices.resolve(config)  # auto: cuda or cpu, decided on this machine
    check(config)
    flips = [f for f in config.faults if kinds.of(f).fires is kinds.Fires.INJECTOR]
    if config.mode.staged or config.apoptosis is not None or flips:
        # these checks build the model (torch); a run that needs none leaves this process without torch
        from workbench.faults.targets import check_flip_targets
        from workbench.workloads.stages import check_model

        config = check_model(config)
        check_flip_targets(config, flips)
    setattr(config, _PREPARED, config.to_json())  # as prepared: prepare() gives it back as it is
    return config
