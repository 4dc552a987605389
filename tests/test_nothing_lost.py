"""Nothing the user saved is lost: ``--resume`` with ``--overwrite`` on the run it resumes keeps the checkpoint it
resumes from, and a start that is refused or fails leaves the earlier run's files as they were, from the command
line and from Python; a closed terminal (SIGHUP) ends a run as SIGTERM does: every rank stopped, ``result.h5``
written, no temporary file and no lock left, exit 129 with a one-line reason."""

import glob
import hashlib
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import h5py
import leaks
import pytest
from conftest import TAG

import workbench
from workbench.base.errors import ConfigError, WorkbenchError
from workbench.base.interrupts import HangUp, interrupted_once
from workbench.launch import session
from workbench.launch.cli import main
from workbench.results.outdir import LOCK_FILE, claim

ROOT = Path(__file__).resolve().parent.parent
CLI = [sys.executable, "-m", "workbench", "run"]
EARLIER = dict(dataset="synthetic", world_size=2, steps=40, strategy="checkpoint_restart", checkpoint_every=10,
               hidden=[16])
EARLIER_FILES = ["checkpoints/final.h5", "checkpoints/step_000010.h5", "checkpoints/step_000020.h5",
                 "checkpoints/step_000030.h5", "checkpoints/step_000040.h5", "logs/spawn0.log", "logs/spawn1.log",
                 "result.h5"]
HANGUP_LINE = "workbench: hangup (SIGHUP: the terminal closed); all ranks stopped"


def contents(out):
    """Every file under ``out`` (hidden ones too: a lock, a temporary) and a hash of its bytes."""
    return {p.relative_to(out).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(Path(out).rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def earlier_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("earlier") / "x"
    assert workbench.run(out=out, **EARLIER).completed
    assert sorted(contents(out)) == EARLIER_FILES
    return out


@pytest.fixture
def earlier(earlier_run, tmp_path):
    """A copy of the earlier run's directory (``o/x``) for one test, and its contents as they were."""
    out = tmp_path / "o" / "x"
    shutil.copytree(earlier_run, out)
    return out, contents(out)


# -- --resume with --overwrite -------------------------------------------------------------------------------------
def test_the_issues_command_resumes_in_place_and_keeps_the_checkpoint(earlier):
    out, before = earlier
    cwd = out.parent.parent
    done = subprocess.run([*CLI, "--dataset", "synthetic", "--world-size", "2", "--steps", "60", "--hidden", "16",
                           "--resume", "o/x/checkpoints/step_000020.h5", "--out", "o/x", "--overwrite"],
                          cwd=cwd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr[-2000:]
    result = workbench.RunResult.load(out)
    assert result.completed and result.summary["steps_completed"] == 60
    assert result.config["resume"] == "o/x/checkpoints/step_000020.h5"
    after = contents(out)
    assert after["checkpoints/step_000020.h5"] == before["checkpoints/step_000020.h5"]  # the one resumed: kept
    assert after["result.h5"] != before["result.h5"]  # the rest of the earlier run was replaced
    assert not any(name in after for name in ("checkpoints/step_000030.h5", "checkpoints/step_000040.h5"))
    assert LOCK_FILE not in after


def test_python_resumes_in_place_and_keeps_the_checkpoint(earlier):
    out, before = earlier
    resume = out / "checkpoints" / "step_000020.h5"
    result = workbench.run(dataset="synthetic", world_size=2, steps=60, hidden=[16], strategy="checkpoint_restart",
                           checkpoint_every=10, resume=str(resume), out=out, overwrite=True)
    assert result.completed and result.summary["steps_completed"] == 60
    after = contents(out)
    assert after["checkpoints/step_000020.h5"] == before["checkpoints/step_000020.h5"]
    assert {"checkpoints/step_000030.h5", "checkpoints/step_000060.h5"} <= set(after)
    with h5py.File(out / "checkpoints" / "step_000030.h5") as f:  # the new run's, not the earlier one's
        assert json.loads(f.attrs["config"])["steps"] == 60


def test_a_resume_through_a_link_to_the_checkpoint_keeps_it(earlier, tmp_path):
    out, before = earlier
    link = tmp_path / "latest.h5"
    link.symlink_to(out / "checkpoints" / "step_000030.h5")
    assert workbench.run(dataset="synthetic", world_size=2, steps=35, hidden=[16], resume=str(link), out=out,
                         overwrite=True).completed
    assert contents(out)["checkpoints/step_000030.h5"] == before["checkpoints/step_000030.h5"]


REFUSED = [  # (extra flags, the same in Python, what the one line says)
    ([], {}, "already holds a run (result.h5, 5 checkpoints, 2 logs)"),
    (["--overwrite", "--world-size", "0"], dict(overwrite=True, world_size=0), "world_size: 0 is out of range"),
    (["--overwrite", "--resume", "{out}/checkpoints/step_000020.h5", "--steps", "10"],
     dict(overwrite=True, resume="{out}/checkpoints/step_000020.h5", steps=10), "is at step 20"),
    (["--overwrite", "--resume", "{out}/checkpoints/step_000099.h5"],
     dict(overwrite=True, resume="{out}/checkpoints/step_000099.h5"), "step_000099.h5"),
    (["--overwrite", "--resume", "{out}/result.h5"], dict(overwrite=True, resume="{out}/result.h5"), "result.h5"),
]


@pytest.mark.parametrize("flags,_,needle", REFUSED, ids=["no overwrite", "bad setting", "resume too far",
                                                         "missing resume", "resume of a result"])
def test_a_refused_command_leaves_the_earlier_run_whole(earlier, capsys, flags, _, needle):
    out, before = earlier
    argv = ["run", "--dataset", "synthetic", "--world-size", "2", "--hidden", "16", "--steps", "60", "--out", str(out),
            *[flag.format(out=out) for flag in flags]]
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse's own refusals
        code = exc.code
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1 and needle in err, err
    assert contents(out) == before


@pytest.mark.parametrize("_,settings,needle", REFUSED, ids=["no overwrite", "bad setting", "resume too far",
                                                            "missing resume", "resume of a result"])
def test_a_refused_start_in_python_leaves_the_earlier_run_whole(earlier, _, settings, needle):
    out, before = earlier
    settings = {k: v.format(out=out) if isinstance(v, str) else v for k, v in settings.items()}
    with pytest.raises(WorkbenchError, match=needle.replace("(", r"\(").replace(")", r"\)")):
        workbench.run(**{**dict(dataset="synthetic", world_size=2, hidden=[16], steps=60), **settings}, out=out)
    assert contents(out) == before


def test_an_out_held_by_a_live_run_is_refused_with_overwrite_and_stays_whole(earlier, capsys):
    out, before = earlier
    held = claim(out, overwrite=True)  # a run that has claimed it, not yet started
    try:
        code = main(["run", "--dataset", "synthetic", "--world-size", "2", "--out", str(out), "--overwrite"])
        assert code == 2 and "is in use by another run" in capsys.readouterr().err
        with pytest.raises(ConfigError, match="is in use by another run"):
            workbench.start(dataset="synthetic", world_size=2, out=out, overwrite=True)
    finally:
        held.release()
    assert contents(out) == before


def test_a_start_that_fails_after_the_claim_leaves_the_earlier_run_whole(earlier, monkeypatch, capsys):
    """The supervisor's construction (which reads the resumed checkpoint) fails: the earlier run's files, which
    ``overwrite`` would replace, are removed only once nothing can stop the start, so they are all still there."""
    out, before = earlier

    def broken(*args, **kwargs):
        raise RuntimeError("planted: the supervisor cannot be built")

    monkeypatch.setattr(session, "Supervisor", broken)
    resume = str(out / "checkpoints" / "step_000020.h5")
    with pytest.raises(RuntimeError, match="planted"):
        main(["run", "--dataset", "synthetic", "--world-size", "2", "--hidden", "16", "--steps", "60",
              "--resume", resume, "--out", str(out), "--overwrite"])
    assert contents(out) == before
    with pytest.raises(RuntimeError, match="planted"):
        workbench.run(dataset="synthetic", world_size=2, hidden=[16], steps=60, resume=resume, out=out,
                      overwrite=True)
    assert contents(out) == before


# -- SIGHUP ----------------------------------------------------------------------------------------------------------
def training(out, proc, reader=None, timeout=90.0):
    """Wait (bounded) until the run in ``out`` has written two checkpoints; ``reader``: drained meanwhile."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        if reader is not None and select.select([reader], [], [], 0)[0]:
            try:
                os.read(reader, 65536)
            except OSError:
                pass
        if len(glob.glob(f"{out}/checkpoints/step_*.h5")) >= 2:
            return
        time.sleep(0.01)
    proc.kill()
    pytest.fail(f"the run never trained within {timeout:g} s (exit {proc.poll()})")


def judge_hangup(out, before):
    result = workbench.RunResult.load(out)
    assert result.outcome == "stopped" and result.summary["reason"].startswith("interrupted: hangup (SIGHUP"), \
        result.summary["reason"]
    assert glob.glob(f"{out}/**/.*tmp", recursive=True) == [] and not (out / LOCK_FILE).exists()
    assert leaks.wait_gone(before, TAG) == []  # every rank, the template and the CLI are gone


RUN = ["--dataset", "synthetic", "--world-size", "2", "--hidden", "512,512", "--steps", "100000", "--eval-interval",
       "100000", "--strategy", "checkpoint_restart", "--checkpoint-every", "1"]


def test_sighup_stops_every_rank_writes_the_result_and_exits_129(tmp_path):
    out = tmp_path / "x"
    before = {p.key for p in leaks.project_processes(TAG)}
    proc = subprocess.Popen([*CLI, *RUN, "--json", "--out", str(out)], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        training(out, proc)
        proc.send_signal(signal.SIGHUP)
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 129 and stdout == "" and stderr == HANGUP_LINE + "\n", (proc.returncode, stderr[-2000:])
    judge_hangup(out, before)


def test_a_closed_terminal_ends_the_run_cleanly(tmp_path):
    """The run's terminal is a pseudo-terminal it controls; closing its far end is a real hangup: the kernel sends
    SIGHUP and every later write to the terminal fails, the last line included."""
    import fcntl
    import termios

    out = tmp_path / "x"
    before = {p.key for p in leaks.project_processes(TAG)}
    master, slave = os.openpty()
    proc = subprocess.Popen([*CLI, *RUN, "--out", str(out)], cwd=ROOT, stdin=slave, stdout=slave, stderr=slave,
                            start_new_session=True, preexec_fn=lambda: fcntl.ioctl(0, termios.TIOCSCTTY, 0))
    os.close(slave)
    try:
        training(out, proc, reader=master)
        os.close(master)
        master = None
        code = proc.wait(timeout=60)
    finally:
        proc.kill()
        if master is not None:
            os.close(master)
    assert code == 129
    judge_hangup(out, before)


def test_a_sighup_ignored_before_stays_ignored_and_one_caught_exits_129():
    """``nohup``: the run goes on after a hangup. Otherwise the first SIGHUP is a :class:`HangUp`, exit code 129."""
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGHUP, signal.SIGINT, signal.SIGTERM)}
    try:
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        with interrupted_once() as seen:
            assert signal.getsignal(signal.SIGHUP) == signal.SIG_IGN
            os.kill(os.getpid(), signal.SIGHUP)
        assert not seen.signalled
        signal.signal(signal.SIGHUP, signal.SIG_DFL)
        with pytest.raises(HangUp), interrupted_once() as seen:
            os.kill(os.getpid(), signal.SIGHUP)
            time.sleep(5)  # the handler raises before this ends
        assert seen.signalled and seen.code == 129
        with pytest.raises(KeyboardInterrupt) as caught, interrupted_once() as seen:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)
        assert type(caught.value) is KeyboardInterrupt and seen.code == 130
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
