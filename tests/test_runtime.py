"""Multi-process runs: few, small, seeded, each asserting what the runtime promises."""

import os
import select
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest
from conftest import rank_processes

import workbench
from workbench.results import outdir

pytestmark = pytest.mark.usefixtures("no_leaks")


def test_kill_with_strategy_none_fails_fast_naming_rank_and_step():
    started = time.monotonic()
    result = workbench.run(world_size=4, steps=200, faults=["kill:rank=2,step=40"])
    assert result.outcome == "failed"
    assert "rank 2" in result.summary["reason"] and "step 40" in result.summary["reason"]
    (failure,) = result.failures
    assert failure["rank"] == 2 and failure["step"] == 40 and "SIGKILL" in failure["cause"]
    assert failure["detection_s"] < 1.0
    assert result.summary["steps_completed"] == 40
    assert time.monotonic() - started < 60


def test_hang_is_found_by_heartbeats_and_ends_the_run():
    result = workbench.run(world_size=3, steps=200, faults=["hang:rank=1,step=20"], heartbeat_timeout=1.5)
    assert result.outcome == "failed" and "rank 1 froze" in result.summary["reason"]
    (failure,) = result.failures
    assert 1.5 <= failure["detection_s"] < 5.0


def test_a_start_up_that_holds_the_interpreter_past_the_heartbeat_timeout_is_not_a_freeze():
    """Start-up is judged by its deadline, not by heartbeats: a rank's loader may hold the lock for seconds."""
    result = workbench.run(world_size=2, steps=20, heartbeat_timeout=0.5,
                           dataset="user_code:blobs_holding_the_interpreter")
    assert result.completed, result.summary["reason"]


def test_shrink_continues_with_survivors_and_identical_replicas():
    result = workbench.run(world_size=4, steps=150, strategy="shrink", faults=["kill:rank=3,step=60"])
    assert result.outcome == "completed", result.summary["reason"]
    assert result.summary["world_size_final"] == 3 and result.summary["replicas_identical"]
    (failure,) = result.failures
    assert failure["world_size_after"] == 3 and failure["resume_s"] is not None and failure["resume_s"] < 5
    # the recovery protocol alone is part of the time from the fault to the settled state
    assert 0 < failure["join_s"] < failure["settle_s"] <= failure["resume_s"]
    frame = result.to_dataframe()
    assert list(frame.step) == list(range(150))  # every step committed once, none lost
    assert set(frame[frame.step > 60].world_size) == {3}


def wait_for(predicate, timeout=60.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.05)


def test_live_kill_time_fault_and_stop_from_the_handle(tmp_path):
    seen = []
    run = workbench.start(world_size=3, steps=100_000, strategy="shrink", faults=["kill:rank=2,time=0.5"],
                          out=tmp_path, on_event=lambda kind, payload: seen.append(kind))
    try:
        wait_for(lambda: run.status.get("members") == [0, 1])  # the time fault hit rank 2
        run.kill(1)
        wait_for(lambda: run.status.get("members") == [0])
        step = run.status["step"]
        wait_for(lambda: run.status["step"] > step + 5)  # one rank alone still trains
    finally:
        run.stop()
    result = run.wait(timeout=60)
    assert result.outcome == "stopped"
    assert [f["rank"] for f in result.failures] == [2, 1]
    assert "step" in seen and "event" in seen
    assert workbench.load_results(tmp_path).outcome.item() == "stopped"


def test_user_model_and_dataset_by_import_path():
    result = workbench.run(world_size=2, steps=60, model="user_code:tiny_model", dataset="user_code:blobs",
                           batch_size=32, lr=0.1, eval_interval=30)
    assert result.completed and result.summary["final_test_accuracy"] > 0.8


@pytest.mark.parametrize("spawn", ["template", "fresh"])
def test_a_module_of_the_working_directory_and_relative_paths_after_a_chdir(spawn, tmp_path, monkeypatch):
    """As in a notebook next to its own model file (``''`` on sys.path), after a ``%cd`` (this process changed
    its working directory after the template started): ranks import the module and write where ``out`` says."""
    workbench.run(world_size=1, steps=1)  # the template starts (if it had not) in the old working directory
    (tmp_path / "model_next_door.py").write_text("from user_code import tiny_model as make\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend("")
    monkeypatch.syspath_prepend(str(Path(__file__).parent))  # user_code, as any package the notebook imports
    result = workbench.run(world_size=2, steps=5, model="model_next_door:make", spawn=spawn, out="relative")
    assert result.completed, result.summary["reason"]
    assert (tmp_path / "relative" / "result.h5").is_file() and list((tmp_path / "relative" / "logs").iterdir())


def test_a_killed_template_takes_its_ranks_and_the_reason_says_so():
    """The rank template SIGKILLed mid-run: every rank it forked dies with it (parent-death signal), the run ends
    naming the template and the step the run was at, and the next run starts a new template, saying why."""
    from workbench.supervisor.template import local_template

    run = workbench.start(world_size=2, steps=1_000_000, strategy="shrink")
    deadline = time.monotonic() + 60
    while run.status.get("step", 0) < 20 and time.monotonic() < deadline:
        time.sleep(0.05)
    template = local_template()
    os.kill(template.proc.pid, signal.SIGKILL)
    result = run.wait(timeout=60)
    assert result.outcome == "failed" and "with the rank template: the rank template was killed (SIGKILL)" in \
        result.summary["reason"], result.summary["reason"]
    assert int(result.summary["reason"].split(" at step ")[1].split(";")[0]) >= 20
    again = workbench.run(world_size=2, steps=5)
    assert again.completed and [e["detail"] for e in again.events if e["kind"] == "template"] == [
        f"the rank template pid {template.pid} of this process died earlier (the rank template was killed "
        "(SIGKILL)): a new one was started (its torch import is on this run's start)"]


def test_error_inside_a_rank_ends_the_run_with_its_message():
    result = workbench.run(world_size=2, steps=10, model="user_code:Broken")
    assert result.outcome == "failed"
    assert "ValueError: this model is broken on purpose" in result.summary["reason"]


def test_same_seed_same_run_forked_or_fresh():
    a = workbench.run(world_size=2, steps=30, eval_interval=30)
    b = workbench.run(world_size=2, steps=30, eval_interval=30, spawn="fresh")
    assert a.completed and b.completed
    assert [r["loss"] for r in a.metrics] == [r["loss"] for r in b.metrics]


def _huge_pages_kib(pid: int) -> int:
    with open(f"/proc/{pid}/smaps_rollup") as rollup:
        return next(int(line.split()[1]) for line in rollup if line.startswith("AnonHugePages:"))


def _huge_pages_off() -> bool:
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as mode:
            return "[never]" in mode.read()
    except OSError:  # a kernel without transparent huge pages
        return True


@pytest.mark.skipif(_huge_pages_off(), reason="transparent huge pages are off on this machine")
@pytest.mark.parametrize("spawn", ["template", "fresh"])
def test_ranks_keep_big_tensors_in_huge_pages(spawn, tmp_path):
    # a dead rank is seen only once the kernel has freed its memory, 16x sooner in 2 MiB pages at 500 MiB
    run = workbench.start(world_size=2, steps=100_000, hidden=[1024, 1024], spawn=spawn, out=tmp_path)
    try:
        wait_for(lambda: run.status.get("step", 0) > 3)
        pids = [int(line.split()[0]) for line in rank_processes(os.getpid())]
        assert len(pids) == 2 and all(_huge_pages_kib(pid) >= 2048 for pid in pids)  # fc2: 4 MiB of weights
    finally:
        run.stop()
    assert run.wait(timeout=60).outcome == "stopped"


@pytest.mark.parametrize("how", ["sigkill-parent", "keyboard-interrupt"])
def test_no_orphans_when_the_parent_goes(how, tmp_path):
    script = tmp_path / "parent.py"
    script.write_text(textwrap.dedent(f"""
        import os, signal, threading, time, workbench
        signal.signal(signal.SIGINT, signal.default_int_handler)  # a shell without job control ignores SIGINT
        run = workbench.start(world_size=2, steps=1_000_000)
        while run.status.get("step", 0) < 5:
            time.sleep(0.05)
        print("training", flush=True)
        if {how!r} == "keyboard-interrupt":
            threading.Timer(0.2, lambda: os.kill(os.getpid(), signal.SIGINT)).start()
            try:
                run.wait()
            except KeyboardInterrupt:
                print("interrupted", run.result.outcome, flush=True)
        else:
            time.sleep(60)
    """))
    parent = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True,
                              cwd=os.path.dirname(__file__))

    def line(timeout=60.0):  # a bounded readline: a stuck parent fails the test instead of hanging it
        ready, _, _ = select.select([parent.stdout], [], [], timeout)
        return parent.stdout.readline().strip() if ready else "<no output>"

    try:
        assert line() == "training"
    except AssertionError:
        parent.kill()
        raise
    pids = {line.split()[0] for line in rank_processes(parent=parent.pid)}
    assert len(pids) >= 2
    if how == "sigkill-parent":
        parent.send_signal(signal.SIGKILL)
    else:
        assert line() == "interrupted stopped"
    parent.wait(timeout=30)
    deadline = time.monotonic() + 5
    def alive():  # the parent's ranks, whoever their parent is now
        return pids & {line.split()[0] for line in rank_processes()}

    while alive() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive()
    # a killed parent could not remove its checkpoint scratch; the next run's sweeps it (an interrupted one did)
    def scratch():
        return list(Path(tempfile.gettempdir()).glob(f"{outdir.SCRATCH_PREFIX}{parent.pid}-*"))

    assert bool(scratch()) == (how == "sigkill-parent")
    outdir.scratch().cleanup()
    assert not scratch()


def test_a_service_of_the_run_goes_with_its_killed_supervisor(tmp_path):
    """torchft's lighthouse (a Rust binary) and torchrun's agent run no code of ours: the launcher arms their
    parent-death signal before exec, so a supervisor SIGKILLed (no clean-up) still takes them along."""
    script = tmp_path / "owner.py"
    script.write_text(textwrap.dedent("""
        import sys, time
        from workbench.supervisor.launcher import Launcher
        launcher = Launcher("fresh", "workbench.rank", None, {}, None, 10.0)
        proc = launcher.launch([sys.executable, "-c", "import time; time.sleep(120)",
                               "workbench.rank.peers-service"], "service.log", what="a service")
        print(proc.pid, flush=True)
        time.sleep(120)
    """))
    owner = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        ready, _, _ = select.select([owner.stdout], [], [], 60)
        assert ready, "the owner never started its service"
        service = int(owner.stdout.readline())
        owner.kill()
        owner.wait(timeout=30)
        deadline = time.monotonic() + 5
        while os.path.exists(f"/proc/{service}") and time.monotonic() < deadline:
            try:
                os.waitpid(service, os.WNOHANG)  # not our child: only a zombie of init's would linger
            except ChildProcessError:
                pass
            time.sleep(0.05)
        with open(f"/proc/{service}/stat") if os.path.exists(f"/proc/{service}") else open(os.devnull) as stat:
            assert stat.read().split(") ")[-1][:1] in ("", "Z"), "the service outlived its supervisor"
    finally:
        owner.kill()
