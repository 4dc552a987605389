"""The workloads, each one registered entry (torchtitan's ``TrainSpec`` is the model): a :class:`Model` or a
:class:`Dataset` says its name, its builder (an import path, imported in the rank: this module needs no torch),
what it takes and gives (input shape, classes, size, knobs), and its files. Everything else reads these
entries as they stand, never a copy taken at import: the configuration's checks and choices, the settings table,
the command line's help, the lab's boxes, the pre-flight checks, the ranks' builders. A new model or dataset is one
:func:`register` call; no name is compared anywhere else (tests/test_workloads_registry.py scans for it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from workbench.base.callables import resolve_callable
from workbench.base.errors import ConfigError

SPLIT_SEED = 20240601  # every data set's held-out split (and a synthetic set's draw) is fixed: it never moves with
# the run's seed


@dataclass(frozen=True)
class Model:
    """One model: ``builder(input_shape, num_classes, **knobs)`` returns its ``nn.Module``; ``knobs``: the
    RunConfig fields it takes (and which fix its parameters, so a checkpoint's must match)."""

    name: str
    builder: str  # "package.module:callable"
    summary: str
    knobs: tuple[str, ...] = ()  # of "hidden" (the MLP's widths), "width" (a channel multiplier)
    takes: tuple[int, ...] = ()  # the sample ranks it takes: (1,) signals, (3,) images (C, H, W); (): any

    def build(self, input_shape: tuple[int, ...], num_classes: int, config: Any) -> Any:
        kwargs = {knob: KNOBS[knob](getattr(config, knob)) for knob in self.knobs}
        return resolve_callable("model", self.builder)(tuple(input_shape), num_classes, **kwargs)


@dataclass(frozen=True)
class Dataset:
    """One dataset: ``builder`` returns a :class:`workbench.workloads.datasets.Dataset`; it takes ``size=`` when
    ``sized`` (the run's ``synthetic_size``), ``spec=`` (``NAME:DIR``) when ``on_disk``, nothing else. The shape,
    classes and training size are known without loading it (None: read from its files, by pre-flight)."""

    name: str
    builder: str  # "package.module:callable"
    summary: str
    input_shape: tuple[int, ...] | None = None
    classes: int | None = None
    train_size: int | None = None  # None and sized: the run's synthetic_size
    sized: bool = False
    on_disk: bool = False  # named NAME:DIR; its files are checked by workbench.workloads.dataset_files
    bundled: str | None = None  # a file of the repository's data/ it is read from
    verify: str | None = None  # "package.module:callable": verify(path) checks the bundled file (ConfigError)
    crops: bool = True  # augment=crop_flip applies (images big enough for a 4-pixel shift)
    # "package.module:callable": ceiling(size) returns its accuracy ceiling (workbench.workloads.ceiling.Ceiling)
    ceiling: str | None = None

    @property
    def choice(self) -> str:
        """How the lab's box and the settings name it: ``NAME`` or ``NAME:`` (a directory goes after the colon)."""
        return f"{self.name}:" if self.on_disk else self.name

    def ceiling_of(self, size: int = 0) -> Any:
        """Its accuracy ceiling (a :class:`workbench.workloads.ceiling.Ceiling`); None where none is known."""
        return resolve_callable("ceiling", self.ceiling)(size) if self.ceiling else None

    def verify_file(self, path: Any) -> None:
        """Its bundled file checked by its ``verify`` (a ConfigError naming the file), before any process starts."""
        if self.verify:
            resolve_callable("dataset", self.verify)(path)

    def load(self, spec: str, size: int) -> Any:
        kwargs: dict[str, Any] = {"size": size} if self.sized else {}
        kwargs.update({"spec": spec} if self.on_disk else {})
        return resolve_callable("dataset", self.builder)(**kwargs)


# the workload `make demo` and a Lab() given no model sweep and train: accepted by the reproductions' rules
# (converged, far below its ceiling, seeds within 1.5 pt; registry.yaml's workloads.mnist1d_mlp_400 holds the figures)
DEMO_WORKLOAD = {"model": "mnist1d_mlp", "dataset": "mnist1d", "optimizer": "adam", "lr": 0.01, "lr_schedule": "cosine",
                 "batch_size": 100}
KNOBS = {"hidden": tuple, "width": float}  # a knob's RunConfig field -> the value its builder takes
MODELS: dict[str, Model] = {}
DATASETS: dict[str, Dataset] = {}


def register(entry: Model | Dataset) -> Model | Dataset:
    """Add a model or dataset (a name already taken is replaced: a notebook may register it again)."""
    if not all(knob in KNOBS for knob in getattr(entry, "knobs", ())):
        raise ConfigError("model", f"{entry.name!r}: knobs {entry.knobs} are not of {', '.join(KNOBS)}")
    (MODELS if isinstance(entry, Model) else DATASETS)[entry.name] = entry
    return entry


def unregister(name: str) -> None:
    MODELS.pop(name, None)
    DATASETS.pop(name, None)


def model(name: object) -> Model | None:
    """The registered model ``name`` (None: not one; a user's import path, say)."""
    return MODELS.get(name) if isinstance(name, str) else None


def dataset(spec: object) -> Dataset | None:
    """The registered dataset ``spec`` names (``NAME``; ``NAME:DIR`` or a bare ``NAME`` for one on disk, whose
    missing directory its check then reports); None: not one."""
    if not isinstance(spec, str):
        return None
    name, colon, _ = spec.partition(":")
    entry = DATASETS.get(name)
    return entry if entry is not None and (entry.on_disk or not colon) else None


def model_names() -> tuple[str, ...]:
    return tuple(MODELS)


def dataset_names(on_disk: bool = False) -> tuple[str, ...]:
    return tuple(name for name, entry in DATASETS.items() if entry.on_disk == on_disk)


def dataset_forms() -> tuple[str, ...]:
    """How the settings name each dataset: ``NAME``, or ``NAME:DIR`` for one on disk."""
    return tuple(f"{e.name}:DIR" if e.on_disk else e.name for e in DATASETS.values())


def dataset_choices() -> tuple[str, ...]:
    """The lab's dataset box: built-in names first, then ``NAME:`` for those on disk."""
    entries = sorted(DATASETS.values(), key=lambda e: e.on_disk)
    return tuple(e.choice for e in entries)


_MODELS = "workbench.workloads.models"
_ARCH = "workbench.workloads.architectures"
_CEILING = "workbench.workloads.ceiling"
_M1D = "workbench.workloads.mnist1d"
for _entry in (
    Model("mlp", f"{_MODELS}:mlp", "fully connected; hidden widths from --hidden", knobs=("hidden",)),
    Model("cnn", f"{_MODELS}:cnn", "two convolutions and two linear layers, sized for 8x8 digits", takes=(2, 3)),
    Model("lenet5", f"{_ARCH}:lenet5", "LeNet-5 with batch norm", takes=(3,)),
    Model("alexnet", f"{_ARCH}:alexnet", "AlexNet with batch norm; --width scales its channels", knobs=("width",),
          takes=(3,)),
    Model("vgg11", f"{_ARCH}:vgg11", "VGG-11 with batch norm; --width scales its channels", knobs=("width",),
          takes=(3,)),
    Model("resnet20", f"{_ARCH}:resnet20", "ResNet-20 (CIFAR, option A shortcuts)", takes=(3,)),
    Model("resnet18", f"{_ARCH}:resnet18", "ResNet-18 (option B shortcuts)", takes=(3,)),
    Model("mnist1d_logistic", f"{_M1D}:logistic", "MNIST-1D's logistic regression (410 parameters)", takes=(1,)),
    Model("mnist1d_mlp", f"{_M1D}:mlp", "MNIST-1D's MLP: 100 wide, one residual layer (15,210 parameters)", takes=(1,)),
    Model("mnist1d_cnn", f"{_M1D}:cnn", "MNIST-1D's 1-D CNN: three stride-2 convolutions of 25 (5,210 parameters)",
          takes=(1,)),
    Model("mnist1d_cnn_bn", f"{_M1D}:cnn_bn", "MNIST-1D's CNN with batch norm after each convolution", takes=(1,)),
    Model("mnist1d_gru", f"{_M1D}:gru", "MNIST-1D's bidirectional GRU, 6 wide (5,134 parameters)", takes=(1,)),
    Model("mnist1d_reference", f"{_M1D}:reference", "a larger CNN that measures MNIST-1D's ceiling (not the paper's)",
          takes=(1,)),
    Dataset("digits", "workbench.workloads.data:digits", "scikit-learn's 8x8 digits, 1438 training images",
            (1, 8, 8), 10, train_size=1438, bundled="digits.npz", crops=False, ceiling=f"{_CEILING}:digits_ceiling"),
    Dataset("synthetic", "workbench.workloads.data:synthetic", "Gaussian class clusters as 1x8x8 images",
            (1, 8, 8), 10, sized=True, crops=False, ceiling=f"{_CEILING}:gaussian_ceiling"),
    Dataset("synthetic_image", "workbench.workloads.datasets:synthetic_image", "CIFAR-shaped 3x32x32 images",
            (3, 32, 32), 10, sized=True, ceiling=f"{_CEILING}:synthetic_image_ceiling"),
    Dataset("synthetic_noisy", "workbench.workloads.datasets:synthetic_noisy", "synthetic_image without the "
            "second class, faint under its noise: unambiguous labels", (3, 32, 32), 10, sized=True,
            ceiling=f"{_CEILING}:synthetic_noisy_ceiling"),
    Dataset("synthetic_faint", "workbench.workloads.datasets:synthetic_faint", "synthetic_noisy fainter still: "
            "unambiguous labels, far from the ceiling after 600 steps", (3, 32, 32), 10, sized=True,
            ceiling=f"{_CEILING}:synthetic_faint_ceiling"),
    Dataset("mnist1d", f"{_M1D}:dataset", "MNIST-1D (Greydanus & Kobak): 1-D signals of 40 points, 4000 "
            "training", (40,), 10, train_size=4000, bundled="mnist1d.npz", crops=False,
            verify="workbench.workloads.mnist1d_file:read", ceiling=f"{_CEILING}:mnist1d_ceiling"),
    *(Dataset(name, "workbench.workloads.datasets:load_file_dataset", summary, on_disk=True) for name, summary in (
        ("cifar10", "CIFAR-10's binary version"), ("cifar100", "CIFAR-100's binary version"),
        ("mnist", "MNIST's IDX files"), ("fashion_mnist", "Fashion-MNIST's IDX files"),
        ("imagefolder", "your own images, class/*.png"))),
):
    register(_entry)
