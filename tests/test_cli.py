import json
import os
import subprocess
import sys
from pathlib import Path

import h5py
import pytest
from conftest import rank_processes

import workbench


def cli(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "workbench", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=300)


SUBREAPER = str(Path(__file__).with_name("subreaper.py"))


def under_subreaper(*argv: str) -> dict:
    """Run ``argv`` below a subreaper (tests/subreaper.py): a process it orphans comes back to the subreaper, so
    ``left`` lists what it left behind after it exited (then killed), whatever its parent had been."""
    proc = subprocess.run([sys.executable, SUBREAPER, *argv], capture_output=True, text=True, timeout=330)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


@pytest.mark.parametrize("args,needle", [
    (["--world-size", "0"], "world_size: 0 is out of range: allowed integers 1..64"),
    (["--model", "resnet999"], "model: 'resnet999' is not known"),
    (["--world-size", "4", "--fault", "kill:rank=9,step=1"], "targets rank 9 but world_size=4"),
    (["--strategy", "hope"], "strategy: 'hope' is not known"),
    (["--no-such-flag"], "unrecognized arguments"),
])
def test_usage_and_config_errors_exit_2_with_one_line(args, needle, tmp_path):
    proc = cli("run", *args, "--out", str(tmp_path))
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and needle in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "result.h5").exists()


def test_run_json_summary_and_result_file(tmp_path):
    proc = cli("run", "--world-size", "4", "--steps", "300", "--out", str(tmp_path), "--json")
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    for key in ("outcome", "reason", "final_test_accuracy", "steps_completed", "world_size_final", "wall_s",
                "failures", "result_path"):
        assert key in summary
    assert summary["outcome"] == "completed" and summary["steps_completed"] == 300
    assert summary["final_test_accuracy"] >= 0.90
    with h5py.File(summary["result_path"]) as f:
        assert len(f["metrics/step"]) == 300
    assert workbench.load_results(tmp_path).final_test_accuracy.item() == summary["final_test_accuracy"]


def test_failed_run_exits_1_and_leaves_nothing(tmp_path):
    proc = under_subreaper(sys.executable, "-m", "workbench", "run", "--world-size", "3", "--steps", "300",
                           "--fault", "kill:rank=2,step=30", "--json", "--out", str(tmp_path))
    assert proc["rc"] == 1
    summary = json.loads(proc["stdout"].strip().splitlines()[-1])
    assert summary["outcome"] == "failed" and "rank 2" in summary["reason"]
    assert summary["failures"][0]["rank"] == 2
    # whatever the CLI orphaned (ranks, its template) was re-parented to the subreaper: nothing was
    assert proc["left"] == []


def test_the_orphan_check_finds_what_an_exited_command_left_behind():
    """The planted break for the check above: a command that starts a rank-like process and exits without it.
    Once the command is gone its orphan is no longer below this process (the old check looked there and found
    nothing); below the subreaper it is found, then killed."""
    orphaning = ("import subprocess, sys; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)', "
                 "'workbench.rank'])")
    proc = under_subreaper(sys.executable, "-c", orphaning)
    assert proc["rc"] == 0 and len(proc["left"]) == 1 and "workbench.rank" in proc["left"][0], proc
    assert rank_processes(parent=os.getpid()) == []  # what the old check saw: nothing


def test_config_file_with_flag_override(tmp_path):
    config = tmp_path / "run.yaml"
    config.write_text('world_size: 2\nsteps: 5\nfaults: ["kill:rank=1,step=3"]\n')
    proc = cli("run", "--config", str(config), "--fault", "kill:rank=5,step=1", "--out", str(tmp_path))
    assert proc.returncode == 2 and "targets rank 5 but world_size=2" in proc.stderr


def test_a_second_signal_during_the_clean_up_still_exits_130_with_the_result_intact(tmp_path):
    """``timeout`` or a process manager sends SIGTERM to the CLI and its group, an impatient user presses Ctrl-C
    twice: the second signal must not cut the clean-up short (it left the result file open and h5py's exit
    handler crashed the interpreter: exit 139, SIGSEGV). The CLI runs under a wrapper whose ``Run.stop`` (the
    clean-up's first act) says "cleaning up" and waits for a line on stdin, so the second and third signals land
    inside the clean-up by construction, not by timing."""
    import select
    import signal
    import time

    wrapper = (
        "import sys, workbench.launch.session as session\n"
        "real_stop = session.Run.stop\n"
        "def stop(self, reason='stopped by the user'):\n"
        "    if reason == 'interrupted':  # the clean-up of an interrupted wait()\n"
        "        print('cleaning up', file=sys.stderr, flush=True)\n"
        "        sys.stdin.readline()  # until the test has sent its signals\n"
        "    real_stop(self, reason)\n"
        "session.Run.stop = stop\n"
        "from workbench.launch.cli import main\n"
        "raise SystemExit(main(sys.argv[1:]))\n")
    proc = subprocess.Popen([sys.executable, "-c", wrapper, "run", "--world-size", "4", "--steps", "1000000",
                             "--strategy", "shrink", "--regrow", "--out", str(tmp_path)],
                            stdin=subprocess.PIPE, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)

    def wait_for_line(prefix: str) -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # bounded: a stuck start fails the test, it does not hang it
            if select.select([proc.stderr], [], [], 1.0)[0] and proc.stderr.readline().startswith(prefix):
                return
        raise AssertionError(f"the CLI never printed {prefix!r}")

    try:
        wait_for_line("step")
        proc.send_signal(signal.SIGTERM)
        wait_for_line("cleaning up")  # now inside the clean-up, held there
        proc.send_signal(signal.SIGTERM)
        proc.send_signal(signal.SIGINT)
        rest = proc.communicate("go\n", timeout=60)[1]
    finally:
        proc.kill()
    assert proc.returncode == 130 and "interrupted; all ranks stopped" in rest, (proc.returncode, rest[-2000:])
    assert "Traceback" not in rest
    assert workbench.load_results(tmp_path).outcome.item() == "stopped"
