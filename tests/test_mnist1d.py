"""MNIST-1D built in: the committed file is the pinned package's data set, checked at every load (a missing,
truncated or altered file is a one-line settings error before any process starts), the paper's models have the
paper's parameter counts, and a run through the command line trains on it."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from workbench.base.errors import ConfigError
from workbench.config.run import RunConfig
from workbench.workloads import dataset_files, registry
from workbench.workloads import mnist1d_file as mnist1d
from workbench.workloads.data import load_dataset
from workbench.workloads.models import build_model

ROOT = Path(__file__).resolve().parents[1]
COMMITTED = ROOT / "data" / "mnist1d.npz"


def test_the_committed_file_is_the_packages_data_set(tmp_path):
    pytest.importorskip("mnist1d")  # the dev extra installs it; ci_guard fails a skip under CI
    made = mnist1d.generate()
    assert mnist1d.checksum(made) == mnist1d.CHECKSUM
    mnist1d.write(made, tmp_path / "again.npz")
    assert (tmp_path / "again.npz").read_bytes() == COMMITTED.read_bytes()  # regenerating gives the same bytes


def test_the_data_set_is_the_papers_shape():
    data = load_dataset(RunConfig(model="mnist1d_cnn", dataset="mnist1d", world_size=1))
    assert tuple(data.input_shape) == (40,) and data.num_classes == 10
    assert len(data.x_train) == 4000 and len(data.x_test) == 1000
    assert np.bincount(data.y_train.numpy()).min() > 350  # ten balanced classes
    assert abs(float(torch.cat([data.x_train, data.x_test]).mean())) < 1e-3  # centred, as the package makes it


@pytest.mark.parametrize("damage", ["missing", "truncated", "altered", "other arrays"])
def test_a_bad_file_is_a_settings_error(tmp_path, monkeypatch, damage):
    bad = tmp_path / "mnist1d.npz"
    if damage == "truncated":
        bad.write_bytes(COMMITTED.read_bytes()[:100_000])
    elif damage == "altered":
        arrays = mnist1d.read(COMMITTED)
        arrays["x"][7, 3] += 1e-3  # one value of 200,000
        mnist1d.write(arrays, bad)
    elif damage == "other arrays":
        arrays = mnist1d.read(COMMITTED)
        mnist1d.write({**arrays, "x": arrays["x"][:100]}, bad)
    monkeypatch.setattr(dataset_files, "DATA_DIR", tmp_path)  # its mnist1d.npz: the damaged one
    with pytest.raises(ConfigError) as caught:
        RunConfig(model="mnist1d_cnn", dataset="mnist1d", world_size=1)
    message = str(caught.value)
    assert "\n" not in message and str(bad) in message
    assert ("missing" if damage == "missing" else "python -m workbench.workloads.mnist1d_file") in message


def test_the_command_line_refuses_an_altered_file_before_any_rank(tmp_path):
    copy = tmp_path / "repo"
    shutil.copytree(ROOT / "workbench", copy / "workbench")
    (copy / "data").mkdir()
    arrays = mnist1d.read(COMMITTED)
    arrays["y"][0] = (arrays["y"][0] + 1) % 10  # one label changed
    mnist1d.write(arrays, copy / "data" / "mnist1d.npz")
    done = subprocess.run([sys.executable, "-m", "workbench", "run", "--dataset", "mnist1d", "--model", "mnist1d_cnn",
                           "--world-size", "2", "--steps", "5", "--out", str(tmp_path / "out")],
                          cwd=copy, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert "altered" in done.stderr and "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "out" / "result.h5").exists()


@pytest.mark.parametrize("name, params", [("mnist1d_logistic", 410), ("mnist1d_mlp", 15_210),
                                          ("mnist1d_cnn", 5_210), ("mnist1d_gru", 5_134),
                                          ("mnist1d_cnn_bn", 5_360)])
def test_the_papers_models_have_the_papers_sizes(name, params):
    model = build_model(RunConfig(model=name, dataset="mnist1d", world_size=1), (40,), 10)
    assert sum(p.numel() for p in model.parameters()) == params
    assert model(torch.zeros(3, 40)).shape == (3, 10)


def test_the_models_refuse_images():
    with pytest.raises(ConfigError, match="1-D signals"):
        registry.model("mnist1d_cnn").build((1, 8, 8), 10, RunConfig(world_size=1))


def test_a_short_run_learns(tmp_path):
    import workbench

    result = workbench.run(world_size=2, steps=300, model="mnist1d_cnn", dataset="mnist1d", optimizer="adam",
                           lr=0.01, batch_size=100, eval_interval=100, out=tmp_path)
    assert result.outcome == "completed"
    assert result.summary["final_test_accuracy"] > 0.5  # chance is 0.1; the paper's CNN passes 80 % by step 500
