"""Runs that meet bad places and bad settings (issue 28, items 3 and 4): every case answers in one line with the
documented exit code (2: a configuration error, found before any rank process starts; 1: a run that failed, its
summary still printed) and leaves nothing behind (no hidden temporary file; no process: the conftest checks).

Full disks are small tmpfs mounts (root: CI is), filled up to what each case needs."""

import json
import os
import subprocess
from pathlib import Path

import pytest

import workbench
from workbench.base import checkpoint as ckpt
from workbench.base.errors import ConfigError
from workbench.base.h5files import OutputError
from workbench.config.run import RunConfig
from workbench.launch.cli import main
from workbench.launch.session import prepare

TINY = ["--world-size", "2", "--hidden", "16", "--eval-interval", "10"]


def cli(capsys, *argv):
    """``workbench ARGV`` in this process: (exit code, stdout, stderr)."""
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def one_line(err):
    assert "Traceback" not in err, err
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("workbench: error: "), err
    return lines[0]


def leftovers(where):
    return sorted(str(p) for p in Path(where).rglob("*.tmp"))


@pytest.fixture
def disk(tmp_path):
    """``disk(free_kib, read_only=False)``: a directory on a 256 KiB tmpfs with about ``free_kib`` KiB left;
    unmounted when the test ends."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root (CI runs as root)")
    mounted = []

    def make(free_kib=0, read_only=False):
        where = tmp_path / f"disk{len(mounted)}"
        where.mkdir()
        options = f"size=256k{',ro' if read_only else ''}"
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(where)], capture_output=True,
                              text=True)
        if done.returncode:
            pytest.skip(f"cannot mount a tmpfs: {done.stderr.strip()}")
        mounted.append(where)
        if not read_only:
            (where / "filler").write_bytes(b"\0" * ((256 - free_kib) * 1024))
        return where

    try:
        yield make
    finally:
        for where in mounted:
            subprocess.run(["umount", "-l", str(where)], check=False)


def checkpoint_of(path, steps=20, hidden=(16,), record_config=True, model="mlp"):
    """A checkpoint of ``model`` (digits) at step ``steps``, as a run writes it, without running one."""
    from workbench.workloads.models import build_model

    config = RunConfig(world_size=2, steps=100, hidden=list(hidden), model=model)
    net = build_model(config, (1, 8, 8), 10)
    state = {k: v.detach().clone() for k, v in net.state_dict().items()}
    ckpt.save(path, ckpt.Checkpoint(steps, state, {}, None, 0, config.to_dict() if record_config else {}))
    return str(path)


# -- configuration errors found before any rank starts: exit 2, one line -------------------------------------------
def test_settings_that_only_the_ranks_found_are_refused_before_they_start(tmp_path, capsys):
    empty, no_images, cifar = tmp_path / "empty", tmp_path / "classes", tmp_path / "cifar"
    empty.mkdir()
    for name in ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte",
                 "t10k-labels-idx1-ubyte"):
        (empty / name).write_bytes(b"")
    (no_images / "cat").mkdir(parents=True)
    (no_images / "dog").mkdir()
    cifar.mkdir()
    for name in [f"data_batch_{i}.bin" for i in range(1, 6)] + ["test_batch.bin"]:
        (cifar / name).write_bytes(b"\1" * 100)
    other_model = checkpoint_of(tmp_path / "other.h5", hidden=(32,))
    lenet = checkpoint_of(tmp_path / "lenet.h5", model="lenet5")
    no_config = checkpoint_of(tmp_path / "bare.h5", hidden=(32,), record_config=False)
    ours = checkpoint_of(tmp_path / "ours.h5", steps=40)
    cases = [
        (["--batch-size", "5000"], "batch_size: 5000 is larger than the 1438 training samples of digits"),
        (["--dataset", "synthetic", "--synthetic-size", "100", "--batch-size", "128"],
         "batch_size: 128 is larger than the 100 training samples of synthetic"),
        (["--lr", "inf"], "lr: inf is not a finite number"),
        (["--lr", "nan"], "lr: nan"),
        (["--heartbeat-timeout", "inf"], "heartbeat_timeout: inf is not a finite number"),
        (["--model", "os:getcwd"], "model: 'os:getcwd' returned str, not a torch.nn.Module"),
        (["--model", "no_such_package.models:make"], "model: cannot import module 'no_such_package.models'"),
        (["--dataset", f"mnist:{tmp_path / 'nowhere'}"], "does not exist"),
        (["--dataset", f"mnist:{tmp_path}"], "train-images-idx3-ubyte (or .gz) is missing"),
        (["--dataset", f"mnist:{empty}"], "is not an IDX file"),
        (["--dataset", f"fashion_mnist:{empty}"], "is not an IDX file"),
        (["--dataset", f"imagefolder:{no_images}"], "has no training images"),
        (["--dataset", f"cifar10:{cifar}"], "is truncated or not a CIFAR binary file"),
        (["--resume", other_model, "--steps", "50"], "was written by a run of hidden=[32]; this run has hidden=[16]"),
        (["--resume", lenet, "--steps", "50"], "was written by a run of model='lenet5'; this run has model='mlp'"),
        (["--resume", no_config, "--steps", "50"], "holds model/fc1.bias of shape (32,); this run's model (mlp) has "
         "shape (16,): it is another model's checkpoint"),
        (["--resume", ours, "--steps", "40"], "is at step 40 and the run has steps=40: nothing is left to train"),
        (["--resume", ours, "--steps", "30"], "is at step 40 and the run has steps=30"),
    ]
    for argv, needle in cases:
        out = tmp_path / "out"
        code, stdout, err = cli(capsys, "run", *TINY, "--steps", "20", *argv, "--out", str(out))
        assert code == 2, (argv, err)
        assert needle in one_line(err), (argv, err)
        assert not out.exists() and stdout == "", argv


def test_the_same_mistakes_from_python_raise_config_error(tmp_path):
    for settings in ({"batch_size": 5000}, {"lr": float("inf")}, {"guard_limit": float("inf")},
                     {"resume": checkpoint_of(tmp_path / "c.h5", hidden=(32,))}):
        with pytest.raises(ConfigError):
            prepare(world_size=2, steps=50, hidden=[16], **settings)


def test_preflight_knows_the_digits_size_without_loading_them():
    from workbench.config.preflight import dataset_info
    from workbench.workloads.data import digits

    assert len(digits().y_train) == dataset_info("digits", 4096).n_train


def test_a_resume_with_the_checkpoints_own_settings_is_accepted(tmp_path):
    config = prepare(world_size=2, steps=50, hidden=[16], resume=checkpoint_of(tmp_path / "c.h5"))
    assert config.resume.endswith("c.h5")


# -- --out: one run per directory ----------------------------------------------------------------------------------
def test_out_holding_a_run_is_refused_unless_overwrite(tmp_path, capsys):
    out = tmp_path / "run"
    (out / "checkpoints").mkdir(parents=True)
    (out / "checkpoints" / "step_000010.h5").write_bytes(b"earlier")
    (out / "result.h5").write_bytes(b"earlier")
    (out / "notes.txt").write_text("mine")
    code, stdout, err = cli(capsys, "run", *TINY, "--steps", "5", "--out", str(out))
    assert code == 2 and stdout == ""
    assert f"out: {out} already holds a run (result.h5, 1 checkpoint)" in one_line(err) and "--overwrite" in err
    assert (out / "result.h5").read_bytes() == b"earlier"
    with pytest.raises(ConfigError, match="already holds a run"):
        workbench.start(world_size=2, steps=5, out=out)

    code, stdout, err = cli(capsys, "run", *TINY, "--steps", "5", "--out", str(out), "--overwrite", "--json")
    assert code == 0, err
    assert json.loads(stdout.splitlines()[-1])["outcome"] == "completed"
    assert not (out / "checkpoints" / "step_000010.h5").exists() and (out / "notes.txt").read_text() == "mine"
    assert workbench.RunResult.load(out).completed

    result = workbench.run(world_size=2, steps=5, hidden=[16], out=out, overwrite=True)
    assert result.completed and sorted(p.name for p in (out / "checkpoints").iterdir()) == ["final.h5"]


def test_a_read_only_out_is_refused_before_the_run(disk, capsys):
    out = disk(read_only=True) / "run"
    code, stdout, err = cli(capsys, "run", *TINY, "--steps", "5", "--out", str(out))
    assert code == 2 and f"out: {out} cannot be written: Read-only file system" in one_line(err)


def test_default_out_directories_do_not_collide(tmp_path):
    from workbench.results.outdir import fresh

    (tmp_path / "run-1").mkdir()
    (tmp_path / "run-1-2").mkdir()
    assert fresh(tmp_path / "run-1") == tmp_path / "run-1-3" and fresh(tmp_path / "run-2") == tmp_path / "run-2"


# -- full disks: the run fails as such, summary printed, exit 1 ----------------------------------------------------
def test_a_checkpoint_on_a_full_disk_fails_the_run_not_a_rank(disk, capsys):
    """The first checkpoint does not fit: h5py used to crash rank 0 (SIGSEGV), checkpoint_restart "recovered"
    from it, and hidden .tmp files stayed."""
    # 4 KiB go to the run's lock file (workbench.results.outdir.LOCK_FILE); the rest holds a result of all 30 steps
    # (~24 KB: rank 0 trains on while its failed write is reported), never the 30 KB checkpoint
    out = disk(free_kib=28) / "run"
    code, stdout, err = cli(capsys, "run", *TINY, "--steps", "30", "--strategy", "checkpoint_restart",
                            "--checkpoint-every", "10", "--out", str(out), "--json")
    assert code == 1 and "Traceback" not in err and err == ""
    summary = json.loads(stdout.splitlines()[-1])
    assert summary["outcome"] == "failed" and summary["failures"] == []
    assert summary["reason"] == (f"checkpoint not written: cannot write {out}/checkpoints/step_000010.h5: "
                                 "No space left on device")
    assert leftovers(out.parent) == []
    result = workbench.RunResult.load(out)  # the result still fits
    assert not [e for e in result.events if e["kind"] in ("failure", "restart", "recovered")]


def test_a_result_that_cannot_be_written_still_prints_the_summary(disk, capsys):
    """final.h5 fits, result.h5 does not: training completed, the run failed on its result, saying where."""
    out = disk(free_kib=40) / "run"
    code, stdout, err = cli(capsys, "run", *TINY, "--steps", "20", "--out", str(out), "--json")
    assert code == 1 and "Traceback" not in err
    summary = json.loads(stdout.splitlines()[-1])
    assert summary["outcome"] == "failed" and summary["result_path"] is None
    assert summary["result_error"] == f"cannot write {out}/result.h5: No space left on device"
    assert summary["reason"].startswith("result not written: ") and "(the run completed: all 20 steps" in \
        summary["reason"]
    assert leftovers(out.parent) == [] and not (out / "result.h5").exists()

    code, stdout, err = cli(capsys, "run", *TINY, "--steps", "20", "--out", str(out), "--overwrite")
    assert code == 1 and "result: not written" in stdout and "outcome: failed (result not written" in stdout


def test_a_result_path_taken_by_a_directory_fails_the_run_in_python_too(tmp_path):
    (tmp_path / "result.h5").mkdir()
    result = workbench.run(world_size=2, steps=5, hidden=[16], out=tmp_path)
    assert result.outcome == "failed" and result.summary["result_error"].endswith("it is a directory")
    assert leftovers(tmp_path) == []


def test_a_checkpoint_write_that_fails_raises_one_line_and_leaves_nothing(disk):
    where = disk(free_kib=8)
    import torch

    big = ckpt.Checkpoint(1, {"w": torch.zeros(100, 100)}, {}, None)
    with pytest.raises(OutputError, match=f"cannot write {where}/c.h5: No space left on device"):
        ckpt.save(where / "c.h5", big)
    assert sorted(p.name for p in where.iterdir()) == ["filler"]


def test_wait_raises_what_the_monitor_thread_raised(monkeypatch):
    from workbench.supervisor.core import Supervisor

    def broken(self):
        raise RuntimeError("the supervisor broke")

    monkeypatch.setattr(Supervisor, "run", broken)
    with pytest.raises(RuntimeError, match="the supervisor broke"):
        workbench.start(world_size=2, steps=5).wait(timeout=30)


def test_a_checkpoint_that_fails_otherwise_fails_the_run_too(tmp_path, capsys):
    """Not only a full disk: any error writing a checkpoint ends the run, said (it used to be printed to the
    rank's log while the run went on without that checkpoint)."""
    out = tmp_path / "run"
    code, stdout, err = cli(capsys, "run", *TINY, "--steps", "30", "--strategy", "checkpoint_restart",
                            "--checkpoint-every", "10", "--model", "user_code:unsaveable_model", "--out", str(out),
                            "--json")
    summary = json.loads(stdout.splitlines()[-1])
    assert code == 1 and summary["outcome"] == "failed" and summary["failures"] == [], (summary, err)
    assert summary["reason"].startswith("checkpoint not written: TypeError: ") and "BFloat16" in summary["reason"]
    assert 10 <= summary["steps_completed"] < 30 and leftovers(out) == []  # ended soon after the failed write
    assert "Traceback" in (out / "logs" / "spawn0.log").read_text()  # where it failed, in the rank's log
