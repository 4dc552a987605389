"""Issue 45, item 2: a model or dataset is one registered entry (workbench/workloads/registry.py); the config's
names, the settings' choices, the lab's boxes and the pre-flight checks read the entries; no model or dataset is
compared by its name outside workbench/workloads/; a new dataset is one ``register`` call."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from structure_tool import comparisons

from workbench.base.errors import ConfigError
from workbench.config import preflight
from workbench.config.fields import SETTINGS, help_text
from workbench.config.run import RunConfig
from workbench.launch.lab import Lab
from workbench.workloads import dataset_files, registry
from workbench.workloads.data import load_dataset
from workbench.workloads.datasets import Dataset
from workbench.workloads.models import build_model

ROOT = Path(__file__).resolve().parents[1]
ROOM = ROOT / "workbench" / "workloads"
NAMES = {*registry.MODELS, *registry.DATASETS}
ABOUT = ("model", "dataset", "spec")  # a comparison counts where the other side speaks of a model or dataset


def test_the_lists_are_read_from_the_entries():
    assert registry.model_names() == (
        "mlp", "cnn", "lenet5", "alexnet", "vgg11", "resnet20", "resnet18", "mnist1d_logistic", "mnist1d_mlp",
        "mnist1d_cnn", "mnist1d_cnn_bn", "mnist1d_gru", "mnist1d_reference")
    assert registry.dataset_names() == ("digits", "synthetic", "synthetic_image", "synthetic_noisy", "synthetic_faint",
                                        "mnist1d")
    assert registry.dataset_forms() == registry.dataset_names() + tuple(
        f"{name}:DIR" for name in registry.dataset_names(on_disk=True))
    assert SETTINGS["model"].allowed == registry.model_names()
    assert SETTINGS["dataset"].allowed == registry.dataset_forms()
    assert dataset_files.bundled_file("digits") == dataset_files.DATA_DIR / "digits.npz"
    assert dataset_files.bundled_file("mnist1d") == dataset_files.DATA_DIR / "mnist1d.npz"
    assert registry.dataset_choices() == ("digits", "synthetic", "synthetic_image", "synthetic_noisy",
                                          "synthetic_faint", "mnist1d", "cifar10:",
                                          "cifar100:",
                                          "mnist:", "fashion_mnist:", "imagefolder:")
    assert [m.name for m in registry.MODELS.values() if m.knobs] == ["mlp", "alexnet", "vgg11"]
    for name, entry in {**registry.MODELS, **registry.DATASETS}.items():
        assert entry.name == name and entry.summary and ":" in entry.builder
        with pytest.raises(AttributeError):
            entry.name = "other"  # frozen
    assert registry.dataset("cifar10:/x") is registry.DATASETS["cifar10"] and registry.dataset("digits:x") is None
    assert registry.model("pkg.mod:factory") is None


def _name_comparisons(path: Path, root: Path = ROOT) -> list[str]:
    return comparisons("a model or dataset", path, root)  # tools/check_structure.py's rule, run on one file


def test_no_model_or_dataset_is_compared_by_name_outside_the_workloads():
    files = [p for p in sorted((ROOT / "workbench").rglob("*.py")) if ROOM not in p.parents]
    assert len(files) > 50
    offenders = [hit for path in files for hit in _name_comparisons(path)]
    assert offenders == [], "read the entry's fields: workbench.workloads.registry.model / dataset"


def test_the_scan_finds_a_planted_comparison(tmp_path):
    planted = tmp_path / "planted.py"
    planted.write_text('def f(config, model, spec, name, kind):\n    a = config.model == "cnn", spec == "digits"\n'
                       '    b = model in ("alexnet", "vgg11"), config.dataset != "synthetic"\n'
                       '    return kind == "mlp", name == "other"\n')
    hits = _name_comparisons(planted, tmp_path)
    assert len(hits) == 4 and not any("kind" in hit for hit in hits)


# -- a new dataset is one entry -----------------------------------------------------------------------------------
def tiny(size: int) -> Dataset:
    """A registered dataset's builder: ``size`` 2x4x4 samples of 3 classes, a quarter of them again as the test."""
    rng = np.random.default_rng(size)
    x = torch.from_numpy(rng.normal(size=(size + size // 4, 2, 4, 4)).astype(np.float32))
    y = torch.from_numpy(rng.integers(0, 3, size=size + size // 4))
    return Dataset(x[:size], y[:size], x[size:], y[size:])


@pytest.fixture
def tiny_entry():
    entry = registry.register(registry.Dataset("tiny", f"{__name__}:tiny", "2x4x4 noise of 3 classes", (2, 4, 4), 3,
                                               sized=True, crops=False))
    yield entry
    registry.unregister("tiny")


def test_a_dataset_registered_at_run_time_is_checked_offered_and_loaded(tiny_entry):
    config = RunConfig(world_size=2, steps=3, dataset="tiny", synthetic_size=64, model="cnn")
    assert config.dataset == "tiny" and "tiny" in Lab().dataset.options
    assert "tiny" in SETTINGS["dataset"].allowed and "tiny" in help_text("dataset")  # the registry now, no copy
    assert preflight.dataset_info("tiny", 64) == preflight.DatasetInfo(64, (2, 4, 4), None)
    with pytest.raises(ConfigError, match="'crop_flip' crops and flips images; 'tiny' is 4x4"):
        RunConfig(dataset="tiny", augment="crop_flip")
    data = load_dataset(config)
    assert data.input_shape == (2, 4, 4) and len(data.y_train) == 64 and data.num_classes == 3
    model = build_model(config, data.input_shape, data.num_classes)
    assert model(data.x_train[:5]).shape == (5, 3)
    registry.unregister("tiny")
    with pytest.raises(ConfigError, match="'tiny' is not known: allowed digits, synthetic"):
        RunConfig(dataset="tiny")


def test_a_models_knobs_come_from_its_entry():
    wide, narrow = (build_model(RunConfig(model="vgg11", dataset="synthetic_image", width=w), (3, 32, 32), 10)
                    for w in (0.5, 0.25))
    assert sum(p.numel() for p in wide.parameters()) > sum(p.numel() for p in narrow.parameters())
    mlp = build_model(RunConfig(hidden=[7, 5]), (1, 8, 8), 10)
    assert [m.out_features for m in mlp if isinstance(m, torch.nn.Linear)] == [7, 5, 10]
    with pytest.raises(ConfigError, match="'cnn' needs image inputs"):
        build_model(RunConfig(model="cnn"), (64,), 10)
