"""A sweep point preempted with notice resumes where it stopped: in-process (a kernel's runs), and end to end through
``workbench sweep`` and SIGUSR1 (Slurm's ``--signal=B:USR1@T``). The Slurm requeue itself: tests/cluster."""

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import workbench
from workbench.base import checkpoint
from workbench.config.preflight import prepare
from workbench.launch.sweeps import requeue
from workbench.launch.sweeps.run import load_sweep
from workbench.results.run_result import RunResult

pytestmark = pytest.mark.usefixtures("no_leaks")
TINY = Path(__file__).parent / "notebooks" / "tiny_sweep.ipynb"


def until(condition, timeout, what):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"waited {timeout} s for {what}"
        time.sleep(0.02)


def weights(result):
    return checkpoint.load(result.summary["final_checkpoint"]).model


def test_a_point_run_stopped_by_notice_resumes_there_and_its_record_continues(tmp_path, monkeypatch):
    point = tmp_path / "point"
    point.mkdir()
    config = dict(world_size=3, steps=200, eval_interval=50, seed=4, strategy="shrink")
    run = workbench.start(**config, out=tmp_path / "first", point=point)  # as the sweep's notebook hands it on
    until(lambda: len(run.metrics) >= 40, 60, "40 steps")
    run.notice(grace=30)
    first = run.wait()
    assert first.outcome == "stopped" and "kept for the point's next attempt" in first.summary["reason"]
    stop = first.summary["steps_completed"]
    (kept,) = (point / requeue.PREEMPTED_DIR).iterdir()
    assert checkpoint.load(kept / requeue.CHECKPOINT_FILE).step == stop
    assert {f["samples_lost"] for f in first.failures} == {0}  # three records: every rank was preempted

    monkeypatch.setattr(requeue, "_seen", type(requeue._seen)())  # a new attempt: a new kernel
    second = workbench.run(**config, out=tmp_path / "second", point=point)
    assert second.completed, second.summary["reason"]
    assert [r["step"] for r in second.metrics] == list(range(200))  # one record from step 0, each step once
    (mark,) = [e for e in second.events if e["kind"] == "requeued"]
    assert mark["step"] == stop and second.summary["requeues"] == 1
    times = [e["time"] for e in second.events]
    assert times == sorted(times) and second.summary["generations"] == 2
    assert second.config["resume"] is None and second.summary["failures"] == first.failures
    assert not kept.exists()  # taken: a third attempt would start afresh
    assert RunResult.load(tmp_path / "second").summary["requeues"] == 1

    golden = workbench.run(**config, out=tmp_path / "golden")  # a run of its own
    diff = max((weights(second)[k] - weights(golden)[k]).abs().max().item() for k in weights(golden))
    assert diff <= 1e-6 and second.metrics[-1]["loss"] == pytest.approx(golden.metrics[-1]["loss"], abs=1e-6)


def test_a_notice_before_training_stops_the_run_which_starts_afresh_next_time(tmp_path, monkeypatch):
    point = tmp_path / "point"
    point.mkdir()
    (point / requeue.NOTICE_FILE).write_text("{}")  # the point had notice before this run began
    result = workbench.run(world_size=2, steps=50, point=point)
    assert result.outcome == "stopped" and result.summary["reason"] == "the job was preempted before training started"
    (stopped,) = (point / requeue.PREEMPTED_DIR).iterdir()  # the point counts as preempted: it must run again
    assert list(stopped.iterdir()) == []  # with nothing to resume from

    (point / requeue.NOTICE_FILE).unlink()  # the next attempt (the worker removes the notice)
    monkeypatch.setattr(requeue, "_seen", type(requeue._seen)())
    again = workbench.run(world_size=2, steps=50, point=point)
    assert again.completed and "requeues" not in again.summary and not stopped.exists()


def test_sigusr1_preempts_a_local_sweep_and_the_next_invocation_resumes_its_point(tmp_path):
    out = tmp_path / "sweep"
    argv = [sys.executable, "-m", "workbench", "sweep", str(TINY), "-p", "a", "1", "2", "-p", "train", "true",
            "-p", "steps", "3000", "-p", "strategy", "checkpoint_restart", "-p", "checkpoint_every", "200",
            "--out", str(out), "--no-progress", "--jobs", "1"]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        # training: its first periodic checkpoint is written (a loaded machine's start-up takes seconds of CPU)
        until(lambda: proc.poll() is None and list(out.glob("*/checkpoints/step_*.h5")), 180, "a point to train")
        proc.send_signal(signal.SIGUSR1)  # Slurm's --signal=B:USR1@T reaches the task this way
        text, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1, text + err
    assert "0 completed, 0 failed, 1 preempted: run the sweep again to resume them" in text, text + err
    (pid,) = [p.parent.name for p in out.glob("*/point.json")]  # the second point never started
    status = json.loads((out / pid / "point.json").read_text())
    assert status["status"] == "preempted" and "resumes from there" in status["error"]
    stopped = RunResult.load(out / pid)
    story = f"{stopped.summary['reason']}; " + "; ".join(f"{e['kind']}: {e['detail']}" for e in stopped.events[-8:])
    assert len(list((out / pid / requeue.PREEMPTED_DIR).glob("*/checkpoint.h5"))) == 1, story

    again = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "2 points: 2 executed (2 completed, 0 failed)" in again.stdout
    result = RunResult.load(out / pid)
    assert result.completed and result.summary["requeues"] == 1
    assert [r["step"] for r in result.metrics] == list(range(3000))
    assert not (out / pid / requeue.PREEMPTED_DIR).exists() and not list(out.rglob(".*.tmp"))
    frame = load_sweep(out)
    assert set(frame.status) == {"completed"}


def test_a_notice_signal_to_the_waiting_process_preempts_the_whole_job(tmp_path):
    """``kill -USR1`` of the process that waits for the run (a ``workbench run``, a kernel): every rank stops at one
    boundary, which writes the checkpoint the reason names."""
    import os
    import threading

    run = workbench.start(world_size=2, steps=5000, eval_interval=5000, out=tmp_path / "job")

    def signal_once_training():
        until(lambda: len(run.metrics) >= 20 or run.done, 60, "20 steps")
        os.kill(os.getpid(), signal.SIGUSR1)

    previous = signal.getsignal(signal.SIGUSR1)
    sender = threading.Thread(target=signal_once_training)
    sender.start()
    result = run.wait()  # in the main thread: the notice handler is in place while it waits
    sender.join()
    assert signal.getsignal(signal.SIGUSR1) is previous  # put back after the wait
    assert result.outcome == "stopped" and "every rank was preempted" in result.summary["reason"]
    path = result.summary["reason"].split("resume from ")[1]
    assert checkpoint.load(path).step == result.summary["steps_completed"] < 5000


@pytest.mark.parametrize("point", [5, "missing"])
def test_a_point_that_is_no_directory_is_refused_before_any_process(tmp_path, point):
    given = point if isinstance(point, int) else str(tmp_path / point)
    with pytest.raises(workbench.ConfigError, match=r"^point: .* is no sweep point's directory: give the notebook"):
        workbench.start(world_size=2, steps=2, point=given)
    assert not (tmp_path / "missing").exists()


@pytest.mark.parametrize("blocker", ["file", "dangling link", "unwritable point", "unwritable folder"])
def test_a_point_whose_folder_cannot_take_a_kept_checkpoint_is_refused_before_any_rank_starts(tmp_path, monkeypatch,
                                                                                              blocker):
    """What a preempted run writes to its point, blocked: one line naming the place, before a process starts."""
    point = tmp_path / "point"
    point.mkdir()
    kept = point / requeue.PREEMPTED_DIR
    if blocker == "file":
        kept.write_text("x")
    elif blocker == "dangling link":
        kept.symlink_to(tmp_path / "gone")
    else:  # as root no mode bit denies: the permission check is what is tested
        kept.mkdir()
        denied = point if blocker == "unwritable point" else kept
        access = requeue.os.access
        monkeypatch.setattr(requeue.os, "access", lambda p, mode: Path(p) != denied and access(p, mode))
    before = {p.name for p in tmp_path.iterdir()}
    with pytest.raises(workbench.ConfigError) as refused:
        workbench.run(world_size=2, steps=5, point=point, out=tmp_path / "out")
    message = str(refused.value)
    assert message.startswith("point: ") and "\n" not in message
    assert str(kept if blocker in ("file", "dangling link", "unwritable folder") else point) in message
    assert {p.name for p in tmp_path.iterdir()} == before  # nothing made: no out directory, no process


def test_a_kept_checkpoint_that_cannot_be_written_fails_the_stopped_run_saying_where(tmp_path, monkeypatch):
    """The point's run folder blocked after the start (a file where it goes): the job stopped at its checkpoint,
    but the run fails naming the file its next attempt would have resumed from, not a supervisor traceback."""
    point = tmp_path / "point"
    (point / requeue.PREEMPTED_DIR).mkdir(parents=True)
    config = dict(world_size=2, steps=400, eval_interval=400)
    monkeypatch.setattr(requeue, "_seen", type(requeue._seen)())
    folder = requeue.PointRun.of(prepare(**config), point).dir  # where this run keeps its checkpoint
    monkeypatch.setattr(requeue, "_seen", type(requeue._seen)())
    folder.write_text("in the way")
    run = workbench.start(**config, point=point)
    until(lambda: len(run.metrics) >= 5, 60, "5 steps")
    run.notice(grace=30)
    result = run.wait(60)
    assert result.outcome == "failed", result.summary["reason"]
    assert result.summary["reason"].startswith(f"cannot write {folder / ('next-' + requeue.CHECKPOINT_FILE)}: ")
    assert "its next attempt cannot resume from it" in result.summary["reason"]
    assert folder.read_text() == "in the way"
