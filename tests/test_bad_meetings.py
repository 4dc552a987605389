"""Two runs that meet on one ``out``, Ctrl-C pressed twice, and the last bad inputs of issue 48: one run keeps the
directory and its result, the other is refused in one line (exit 2) naming the holder; any number of interrupts
ends in 130 with every rank stopped and no temporary file left; the rest answer in one line.

The meetings and the interrupts are real ``workbench run`` processes (and two Python processes for the API); a
terminal's Ctrl-C is a SIGINT to the whole foreground process group, so each CLI leads its own group and gets it
there. The rest run in this process."""

import glob
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import workbench
from workbench.base.errors import ConfigError
from workbench.launch.cli import main
from workbench.results.outdir import LOCK_FILE, claim, holder, run_files

ROOT = Path(__file__).resolve().parent.parent
CLI = [sys.executable, "-m", "workbench", "run"]
TINY = ["--dataset", "synthetic", "--world-size", "2", "--hidden", "16", "--eval-interval", "1000"]
MEET_STEPS = "20"  # the first holds the place from its claim through its template's start to its result


def one_line(err, code, expected_code):
    assert "Traceback" not in err and code == expected_code, (code, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("workbench: error: "), err
    return lines[0]


def launch(argv, **options):
    return subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **options)


def finish(proc, timeout=120):
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        pytest.fail(f"{proc.args} still ran after {timeout} s: {err[-2000:]}")
    return proc.returncode, out, err


def temporaries(where):
    return sorted(glob.glob(f"{where}/**/.*tmp", recursive=True))


def judge_meeting(procs, out, seeds):
    """One of ``procs`` completed and its run is the one in ``out``; the other was refused in one line, exit 2,
    naming the completed one as the holder."""
    done = [finish(p) for p in procs]
    winners = [i for i, (code, _, _) in enumerate(done) if code == 0]
    assert len(winners) == 1, done
    won, lost = winners[0], 1 - winners[0]
    line = one_line(done[lost][2], done[lost][0], 2)
    assert f"out: {out} is in use by another run (pid {procs[won].pid} on " in line, line
    result = workbench.RunResult.load(out)
    assert result.completed and result.config["seed"] == seeds[won]
    assert not (out / LOCK_FILE).exists() and temporaries(out) == []
    return line


# -- two runs on one out -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("apart", [0.0, 0.3], ids=["together", "0.3 s apart"])
def test_two_cli_runs_on_one_out_keep_one(tmp_path, apart):
    out = tmp_path / "x"
    procs = []
    for seed in (0, 7):
        procs.append(launch([*CLI, *TINY, "--steps", MEET_STEPS, "--seed", str(seed), "--out", str(out), "--json"]))
        if apart:
            time.sleep(apart)
    line = judge_meeting(procs, out, [0, 7])
    assert f"--out {out} --json): wait for it to end, or give another directory" in line


API_RUN = """
import sys, workbench
from workbench.base.errors import WorkbenchError
try:
    result = workbench.run(dataset="synthetic", world_size=2, hidden=[16], eval_interval=1000, steps={steps},
                           seed=int(sys.argv[2]), out=sys.argv[1])
except WorkbenchError as exc:
    print(f"workbench: error: {{exc}}", file=sys.stderr)
    sys.exit(2)
sys.exit(0 if result.completed else 1)
"""


def test_two_python_runs_on_one_out_keep_one(tmp_path):
    out = tmp_path / "x"
    script = API_RUN.format(steps=MEET_STEPS)
    procs = [launch([sys.executable, "-c", script, str(out), str(seed)]) for seed in (0, 7)]
    judge_meeting(procs, out, [0, 7])


def test_a_second_claim_in_one_process_is_refused_and_a_dead_holder_is_taken_over(tmp_path):
    out = tmp_path / "x"
    held = claim(out)
    try:
        with pytest.raises(ConfigError, match=rf"out: {out} is in use by another run \(pid {os.getpid()} on "):
            workbench.start(world_size=2, steps=5, out=out)
        assert run_files(out) == []  # the lock is no run's file: no "already holds a run"
    finally:
        held.release()
    assert sorted(os.listdir(out)) == []

    # a holder that died (SIGKILL: no clean-up) left its lock file, no lock: the next run takes the place over
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    (out / LOCK_FILE).write_text(json.dumps({"pid": int(dead.stdout), "host": "h", "started": "t", "command": "c"}))
    result = workbench.run(dataset="synthetic", world_size=2, steps=3, hidden=[16], out=out)
    assert result.completed and not (out / LOCK_FILE).exists()


def test_a_live_holder_in_another_process_is_named(tmp_path):
    out = tmp_path / "x"
    out.mkdir()
    hold = ("import fcntl, json, os, sys; f = open(sys.argv[1], 'w'); fcntl.flock(f, fcntl.LOCK_EX); "
            "f.write(json.dumps({'pid': os.getpid(), 'host': 'there', 'started': 'then', 'command': 'my\\nrun'})); "
            "f.flush(); print('held', flush=True); sys.stdin.read()")
    proc = subprocess.Popen([sys.executable, "-c", hold, str(out / LOCK_FILE)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline() == "held\n"
        assert holder(out) == f"pid {proc.pid} on there since then: my run"
        with pytest.raises(ConfigError) as caught:
            claim(out, overwrite=True)
        assert str(caught.value) == (f"out: {out} is in use by another run (pid {proc.pid} on there since then: "
                                     "my run): wait for it to end, or give another directory")
    finally:
        proc.communicate("", timeout=30)
    claim(out).release()  # the holder ended: the place is free


# -- Ctrl-C, twice --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("moment", ["writing", "training"])
def test_double_ctrl_c_ends_130_with_nothing_left(tmp_path, moment):
    """Two SIGINTs 0.1 s apart to the CLI's process group (a terminal's Ctrl-C), while rank 0 writes a checkpoint
    (its hidden .tmp is there: a model of 0.3 M parameters takes tens of ms to write) or between writes."""
    out = tmp_path / "x"
    proc = launch([*CLI, "--dataset", "synthetic", "--world-size", "2", "--hidden", "512,512", "--steps", "100000",
                   "--eval-interval", "100000", "--strategy", "checkpoint_restart", "--checkpoint-every", "1",
                   "--out", str(out)], start_new_session=True)
    deadline, hit = time.monotonic() + 90, False
    while time.monotonic() < deadline and proc.poll() is None:
        steps = glob.glob(f"{out}/checkpoints/step_*.h5")
        if len(steps) >= 2 and (moment == "training" or glob.glob(f"{out}/checkpoints/.*.tmp")):
            hit = bool(glob.glob(f"{out}/checkpoints/.*.tmp"))
            break
        time.sleep(0.001)
    interrupt_twice(proc)
    code, _, err = finish(proc, timeout=60)
    assert code == 130 and err.strip().endswith("workbench: interrupted; all ranks stopped"), (code, err[-2000:])
    assert "Traceback" not in err
    assert moment != "writing" or hit, "the signals came outside a checkpoint write"
    assert temporaries(out) == [] and not (out / LOCK_FILE).exists()
    assert workbench.RunResult.load(out).outcome == "stopped"  # the conftest checks that no process is left


def interrupt_twice(proc: subprocess.Popen) -> None:
    """Ctrl-C twice, 0.1 s apart, to ``proc``'s process group (the second may find it gone)."""
    os.killpg(proc.pid, signal.SIGINT)
    time.sleep(0.1)
    try:
        os.killpg(proc.pid, signal.SIGINT)
    except ProcessLookupError:
        pass


# -- the rest: one line each --------------------------------------------------------------------------------------
def cli(capsys, *argv):
    try:
        code = main(list(argv))
    except SystemExit as exc:  # argparse's own refusals
        code = exc.code
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_bad_places_and_values_answer_in_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "mine.log").write_text("mine")
    os.symlink(tmp_path / "nowhere", tmp_path / "dangling")
    ran = tmp_path / "ran" / "checkpoints"
    ran.mkdir(parents=True)
    (ran / "step_000010.h5").write_bytes(b"x")
    (tmp_path / "dup.yaml").write_text("world_size: 2\nsteps: 5\nworld_size: 4\n")
    (tmp_path / "fault.yaml").write_text("world_size: 2\nfaults:\n  - {kind: kill, rank: 1, stepp: 3}\n")
    cases = [
        (["--out", ""], "argument --out: an empty path is not allowed: give a directory ('.' for the current one)"),
        (["--out", "dangling"], f"out: dangling is a dangling symbolic link (to {tmp_path / 'nowhere'}): give a "
         "directory, or a link to one"),
        (["--resume", "ran"], "resume: 'ran' is a directory, not a checkpoint file: give one of the HDF5 checkpoints "
         "a run wrote, e.g. ran/checkpoints/step_000010.h5 (its newest)"),
        (["--hidden", "a,b"], "argument --hidden: 'a,b' is not allowed: the hidden layers' widths, comma-separated "
         "integers, e.g. 128,64"),
        (["--hidden", ""], "argument --hidden: '' is not allowed: the hidden layers' widths"),
        (["--config", "dup.yaml"], "config: 'dup.yaml' names 'world_size' twice (lines 1 and 3): give each setting "
         "once"),
        (["--config", "fault.yaml"], "fault: {'kind': 'kill', 'rank': 1, 'stepp': 3}: 'stepp' is not a key of a "
         "fault; allowed: kind, rank, step, time, target, tensor, index, bit, seed, stage, factor, until, grace, "
         "world"),
    ]
    for argv, needle in cases:
        code, stdout, err = cli(capsys, "run", *TINY, "--steps", "5", *argv)
        assert code == 2 and stdout == "", (argv, err)
        assert "Traceback" not in err and len(err.strip().splitlines()) == 1 and needle in err, (argv, err)
    assert sorted(os.listdir(tmp_path)) == ["dangling", "dup.yaml", "fault.yaml", "logs", "ran"]
    assert os.listdir(tmp_path / "logs") == ["mine.log"]


def test_the_same_places_from_python_raise_config_error(tmp_path):
    os.symlink(tmp_path / "nowhere", tmp_path / "dangling")
    for out, message in [("", "an empty path is not allowed"), (" ", "an empty path is not allowed"),
                         (tmp_path / "dangling", "is a dangling symbolic link")]:
        with pytest.raises(ConfigError, match=message):
            workbench.start(world_size=2, steps=5, out=out)
    with pytest.raises(ConfigError, match="names no rank"):
        workbench.RunConfig.from_dict({"world_size": 2, "faults": [{"kind": "kill", "step": 3}]})
    with pytest.raises(ConfigError, match="'mtbf' is not a key of a random failure process; allowed: mtbf_steps"):
        workbench.RunConfig.from_dict({"world_size": 2, "faults": [{"kind": "random", "mtbf": 3}]})


def test_a_full_stdout_is_one_line_and_the_result_is_kept(tmp_path):
    out = tmp_path / "x"
    with open("/dev/full", "w") as full:
        done = subprocess.run([*CLI, *TINY, "--steps", "5", "--out", str(out), "--json"], cwd=ROOT, stdout=full,
                              stderr=subprocess.PIPE, text=True, timeout=120)
    line = one_line(done.stderr, done.returncode, 1)
    assert line == (f"workbench: error: cannot write the summary to stdout: No space left on device; the run "
                    f"completed and the result is kept in {out}/result.h5")
    assert workbench.RunResult.load(out).completed


@pytest.mark.parametrize("lock", ["directory", "link to a file", "dangling link", "unopenable file"])
def test_a_lock_file_that_is_no_lock_file_is_named(tmp_path, capsys, monkeypatch, lock):
    """``out/.workbench.lock`` a directory, a symbolic link, or a file that cannot be opened for writing (an
    immutable one: EPERM even for root): one line naming the lock, not ``out``; exit 2; the user's files stay."""
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    (tmp_path / "mine.txt").write_text("mine")
    path = out / LOCK_FILE
    if lock == "directory":
        path.mkdir()
        what = "a directory, not a lock file"
    elif lock == "link to a file":
        path.symlink_to(tmp_path / "mine.txt")
        what = f"a symbolic link (to {tmp_path / 'mine.txt'}), not a lock file"
    elif lock == "dangling link":
        path.symlink_to(tmp_path / "gone")
        what = f"a symbolic link (to {tmp_path / 'gone'}), not a lock file"
    else:
        path.write_text("")
        real_open = os.open

        def immutable(file, flags, *args):
            if Path(file).absolute() == path:
                raise PermissionError(1, "Operation not permitted", str(file))
            return real_open(file, flags, *args)

        monkeypatch.setattr("workbench.results.outdir.os.open", immutable)
        what = "a lock file that cannot be opened for writing (Operation not permitted)"
    code, _, err = cli(capsys, "run", *TINY, "--steps", "3", "--out", "out")
    assert one_line(err, code, 2) == f"workbench: error: out: out/{LOCK_FILE} is {what}: remove it if no run uses out"
    with pytest.raises(ConfigError) as refused:
        claim(out)
    assert str(refused.value) == f"out: {path} is {what}: remove it if no run uses {out}"
    assert (tmp_path / "mine.txt").read_text() == "mine" and (path.is_symlink() or path.exists())
    assert sorted(p.name for p in out.iterdir()) == [LOCK_FILE]
