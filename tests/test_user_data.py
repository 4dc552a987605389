"""A user's data set (``--dataset package.module:callable``) is checked once, before any rank starts: four arrays
of matching lengths, finite inputs, whole-number labels from 0, the same sample shape in both splits and a model
that takes them. Each miss is one line — exit 2 from the command line, a WorkbenchError from Python, the status
line in the lab panel — and nothing starts."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import workbench
from workbench.base.errors import ConfigError, WorkbenchError
from workbench.config.preflight import prepare
from workbench.launch.lab import Lab

TESTS = Path(__file__).resolve().parent
CASES = [  # loader, what the one line says
    ("all_nan", "480 of the 480 x_train samples hold NaN or infinite values"),
    ("nan_rows", "2 of the 480 x_train samples hold NaN or infinite values"),
    ("more_inputs_than_labels", "x_train has 512 samples and y_train 100 labels"),
    ("three_arrays", "returned 3 values: it must return (x_train, y_train, x_test, y_test)"),
    ("negative_labels", "y_train must hold whole-number class labels from 0 up"),
    ("other_test_shape", "a training sample is of shape (5,), a test sample (4,)"),
    ("raising", "raised FileNotFoundError: /data/mine.npz"),
]


@pytest.mark.parametrize("loader, says", CASES)
def test_the_python_api_refuses_bad_data_before_any_rank(tmp_path, loader, says):
    with pytest.raises(WorkbenchError) as refused:
        workbench.run(world_size=2, steps=5, model="user_code:tiny_model", dataset=f"user_code:{loader}",
                      out=tmp_path / "out")
    assert says in str(refused.value) and "\n" not in str(refused.value)
    assert not (tmp_path / "out").exists()  # nothing started, nothing written


@pytest.mark.parametrize("loader, says", CASES[:3])
def test_the_command_line_refuses_bad_data_in_one_line_exit_2(tmp_path, loader, says):
    done = subprocess.run([sys.executable, "-m", "workbench", "run", "--world-size", "2", "--steps", "5",
                           "--dataset", f"user_code:{loader}", "--out", str(tmp_path / "out")],
                          cwd=TESTS, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert says in done.stderr and len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr
    assert not (tmp_path / "out" / "result.h5").exists()


def test_a_model_that_does_not_take_the_inputs_is_refused():
    with pytest.raises(ConfigError, match=r"does not take 'user_code:blobs'.s inputs of shape \(5,\)"):
        prepare(world_size=2, steps=5, model="user_code:fixed_64_inputs", dataset="user_code:blobs")
    with pytest.raises(ConfigError, match=r"'mnist1d_cnn' takes 1-D signals \(length,\); 'digits' gives samples "
                                          r"of shape \(1, 8, 8\)"):
        prepare(world_size=2, steps=5, model="mnist1d_cnn", dataset="digits")
    with pytest.raises(ConfigError, match=r"'lenet5' takes images \(C, H, W\); 'mnist1d' gives samples of shape"):
        prepare(world_size=2, steps=5, model="lenet5", dataset="mnist1d")
    with pytest.raises(ConfigError, match=r"'cnn' takes 2-D inputs \(H, W\) or images"):
        prepare(world_size=2, steps=5, model="cnn", dataset="user_code:blobs")


def test_good_data_passes_and_trains(tmp_path):
    result = workbench.run(world_size=2, steps=20, model="user_code:tiny_model", dataset="user_code:blobs",
                           out=tmp_path)
    assert result.completed and result.summary["final_test_accuracy"] > 0.5


def test_the_lab_panel_says_so_before_start():
    lab = Lab(world_size=2, steps=5, model="user_code:tiny_model", dataset="user_code:nan_rows")
    try:
        assert lab.start() is None and lab.run is None
        assert "2 of the 480 x_train samples hold NaN" in lab.status.value
    finally:
        lab.close()


def test_a_model_factory_that_raises_is_the_lab_panels_status_line_not_a_traceback():
    lab = Lab(world_size=2, steps=5, model="user_code:raising_factory")
    try:
        assert lab.start() is None and lab.run is None
        assert "'user_code:raising_factory' raised RuntimeError: no weights for you" in lab.status.value
    finally:
        lab.close()
