"""The sweep worker's shared rank template: the points of one worker fork their ranks from that worker's one
template (not from one their kernel started), and nothing outlives a sweep, a killed kernel or a dead template."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest

from workbench.launch.sweeps.point import Worker, alive, descendants
from workbench.launch.sweeps.run import sweep
from workbench.results.run_result import RunResult
from workbench.supervisor.template import SHARED_VAR, SharedTemplate, share
from workbench.supervisor.template_server import code_fingerprint, identity

TINY = Path(__file__).parent / "notebooks" / "tiny_sweep.ipynb"


def _procs(pid):
    """pid -> (parent pid, command line, start time) of the live processes below ``pid`` (a zombie's command line
    is empty: left out)."""
    found = {}
    for child, started in descendants(pid):
        try:
            stat = Path(f"/proc/{child}/stat").read_text().rsplit(")", 1)[1].split()
            args = Path(f"/proc/{child}/cmdline").read_text().replace("\0", " ").strip()
        except (OSError, IndexError):
            continue
        if args:
            found[child] = (int(stat[1]), args, started)
    return found


def _template_events(point_dir):
    return [e["detail"] for e in RunResult.load(point_dir / "result.h5").events if e["kind"] == "template"]


def test_the_points_of_a_worker_fork_their_ranks_from_its_one_template(tmp_path):
    """4 training points on 2 workers: every rank's parent is a template whose parent is a sweep worker (never a
    kernel), there are 2 templates, one per worker, and each point's result names its worker's template."""
    out = tmp_path / "sweep"
    files = code_fingerprint()
    proc = subprocess.Popen([sys.executable, "-m", "workbench", "sweep", str(TINY), "-p", "a", "0", "1", "2", "3",
                             "-p", "train", "true", "-p", "steps", "150", "--out", str(out), "--no-progress",
                             "--jobs", "2"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    seen = {}
    deadline = time.monotonic() + 240
    try:
        while proc.poll() is None and time.monotonic() < deadline:
            seen.update(_procs(proc.pid))
            time.sleep(0.02)
        out_text, err = proc.communicate(timeout=max(1, deadline - time.monotonic()))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    assert "4 points: 4 executed (4 completed, 0 failed)" in out_text
    workers = {p for p, (_, args, _) in seen.items() if "workbench.launch.sweeps.point" in args}
    titled = {p for p, (_, args, _) in seen.items() if "workbench.supervisor.template" in args}
    # a rank keeps its template's title for the moment between its fork and its own title: its parent is a template
    templates = {p for p in titled if seen[p][0] not in titled}
    ranks = {p: parent for p, (parent, args, _) in seen.items() if "workbench.rank" in args or p in titled - templates}
    # one template per worker, its child: none of a kernel's (a worker replaces its template when workbench's files
    # change, as another user's edits in this checkout may do meanwhile)
    assert len(workers) == 2 and (len(templates) == 2 or code_fingerprint() != files), (workers, templates)
    assert {seen[t][0] for t in templates} == workers
    assert ranks and set(ranks.values()) <= templates, ranks  # no kernel forked a rank of its own
    used = {}
    for point in out.glob("*/point.json"):
        state = json.loads(point.read_text())
        pid = state["rank_template"]["pid"]
        assert pid in templates and state["kernel_cpu_s"] > 0, state
        assert _template_events(point.parent) == [
            f"ranks forked by the shared rank template pid {pid} ({state['rank_template']['address']}), "
            "not by one of this process's own"]
        used.setdefault(pid, []).append(point.parent.name)
    assert set(used) <= templates and sum(map(len, used.values())) == 4
    assert not [args for p, (_, args, started) in seen.items() if alive(p, started)]  # nothing outlived the sweep


def _kernel_script(tmp_path):
    """A stand-in for a notebook kernel: ``hang`` starts a long run, freezes rank 1 (SIGSTOP: it cannot act on its
    connection closing), prints the ranks' pids and waits to be killed; ``run`` runs 20 steps and prints the
    run's template events."""
    script = tmp_path / "kernel.py"
    script.write_text("""
import json, sys, threading, time
import workbench
if sys.argv[1] == "hang":
    run = workbench.start(world_size=2, steps=10**6, heartbeat_timeout=120)
    deadline = time.monotonic() + 120
    while run.status.get("step", 0) < 3 and time.monotonic() < deadline:
        time.sleep(0.02)
    run.hang(1)
    print(json.dumps([w.proc.pid for w in run._supervisor.launcher.workers.values()]), flush=True)
    threading.Event().wait(120)  # until the test kills this process
else:
    result = workbench.run(world_size=2, steps=20)
    print(json.dumps([e["detail"] for e in result.events if e["kind"] == "template"]), flush=True)
""")
    return script


def _gone(pids, timeout=10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        left = [p for p in pids if Path(f"/proc/{p}").exists()]
        if not left:
            return []
        time.sleep(0.02)
    return left


def test_a_killed_kernel_leaves_no_rank_and_the_template_serves_on(tmp_path, monkeypatch):
    """The template SIGKILLs the ranks of a connection that ended — a frozen rank too, which its closed control
    channel cannot end — and goes on serving the next process."""
    template = share()
    assert template is not None
    monkeypatch.setenv(SHARED_VAR, template.address)
    script = _kernel_script(tmp_path)
    try:
        kernel = subprocess.Popen([sys.executable, str(script), "hang"], stdout=subprocess.PIPE, text=True)
        try:
            ranks = json.loads(kernel.stdout.readline())
            assert len(ranks) == 2 and all(_procs(template.proc.pid).get(p, (0,))[0] == template.pid for p in ranks)
            os.kill(kernel.pid, signal.SIGKILL)
        finally:
            kernel.kill()
            kernel.wait()
        assert _gone(ranks) == [], "a rank outlived its killed kernel"
        assert template.alive
        done = subprocess.run([sys.executable, str(script), "run"], capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout.splitlines()[-1]) == [
            f"ranks forked by the shared rank template pid {template.pid} ({template.address}), "
            "not by one of this process's own"]
        assert template.children_cpu() > 0  # it reaped those ranks: their CPU time is known to its owner
    finally:
        template.close()


def test_a_dead_shared_template_gives_way_to_one_of_its_own(tmp_path, monkeypatch):
    """A kernel whose shared template is gone starts its own, and the run's event says so."""
    template = share()
    address = template.address
    template.close()  # nothing listens at the address any more
    monkeypatch.setenv(SHARED_VAR, address)
    done = subprocess.run([sys.executable, str(_kernel_script(tmp_path)), "run"], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    (event,) = json.loads(done.stdout.splitlines()[-1])
    assert event.startswith(f"the shared rank template at {address} cannot be used (nothing answers") and \
        event.endswith("this process started its own"), event


@pytest.mark.parametrize("differs, reason", [({"code": "0" * 16}, "workbench's files changed since it started"),
                                             ({"prefix": "/elsewhere"}, "it runs another Python or workbench")])
def test_a_template_of_other_code_is_refused(monkeypatch, differs, reason):
    """A template whose Python or workbench differs from this process's, or whose workbench files changed since it
    imported them, is not used (its ranks would run other code): the handle fails at once, saying why."""
    template = share()
    try:
        here = identity()
        monkeypatch.setattr("workbench.supervisor.template.identity", lambda: {**here, **differs})
        shared = SharedTemplate(template.address, ready_timeout=60)
        assert not shared.usable() and shared.reason.startswith(reason), shared.reason
        assert template.alive  # the template itself goes on
    finally:
        template.close()


def test_the_worker_replaces_a_template_whose_files_changed(monkeypatch):
    monkeypatch.delenv(SHARED_VAR, raising=False)  # the worker sets it: restored afterwards
    read, write = os.pipe()
    os.close(read)
    worker = Worker(write)
    try:
        worker.share_template()
        first = worker.template
        worker.share_template()
        assert worker.template is first and os.environ[SHARED_VAR] == first.address  # unchanged: kept
        monkeypatch.setattr("workbench.launch.sweeps.point.code_fingerprint", lambda: "changed")
        worker.share_template()
        assert worker.template is not first and os.environ[SHARED_VAR] == worker.template.address
        assert first.proc.poll() is not None  # the old one is gone
    finally:
        if worker.template is not None:
            worker.template.close()


def test_a_sweep_whose_kernel_dies_goes_on_with_the_same_template(tmp_path):
    """A point whose kernel is SIGKILLed mid-run (a rank frozen) fails; the next point of the same worker runs on
    the same template; nothing is left afterwards."""
    nb = nbformat.v4.new_notebook(metadata={"kernelspec": {"name": "python3", "display_name": "Python 3",
                                                           "language": "python"}})
    nb.cells = [nbformat.v4.new_code_cell("die = False\nout = 'runs/x'", metadata={"tags": ["parameters"]}),
                nbformat.v4.new_code_cell(
                    "import os, signal, time\nimport workbench\n"
                    "if die:\n"
                    "    run = workbench.start(world_size=2, steps=10**6, heartbeat_timeout=120)\n"
                    "    deadline = time.monotonic() + 120\n"
                    "    while run.status.get('step', 0) < 3 and time.monotonic() < deadline:\n"
                    "        time.sleep(0.02)\n"
                    "    run.hang(1)\n"
                    "    os.kill(os.getpid(), signal.SIGKILL)\n"
                    "result = workbench.run(world_size=2, steps=20, out=out, overwrite=True)")]
    notebook = tmp_path / "dies.ipynb"
    nbformat.write(nb, notebook)
    before, files = {p for p, _ in descendants(os.getpid())}, code_fingerprint()
    frame = sweep(notebook, {"die": [True, False]}, out=tmp_path / "s", jobs=1, progress=False).set_index("die")
    assert frame.loc[True, "status"] == "failed" and "DeadKernelError" in frame.loc[True, "error"], frame.error
    assert frame.loc[False, "status"] == "completed"
    states = {d: json.loads((tmp_path / "s" / frame.loc[d, "point"] / "point.json").read_text()) for d in (True, False)}
    assert states[False]["rank_template"] is not None
    assert states[True]["rank_template"] == states[False]["rank_template"] or code_fingerprint() != files
    assert _template_events(tmp_path / "s" / frame.loc[False, "point"])[0].startswith(
        f"ranks forked by the shared rank template pid {states[False]['rank_template']['pid']} ")
    assert {p for p, _ in descendants(os.getpid())} <= before  # workers, kernels, the template, ranks: all gone


def test_a_worker_that_cannot_share_a_template_says_so_in_each_run(monkeypatch):
    """No socket for a shared template: the worker's kernels start their own (a torch import per point), and
    each run's ``template`` event says so, as the point's point.json ``fallbacks`` do."""
    import workbench
    from workbench.launch.sweeps import point
    from workbench.supervisor import template as wb_template

    def no_socket():
        raise wb_template.TemplateError("its socket @x cannot be made (Address family not supported by protocol)")

    monkeypatch.setattr(point, "share", no_socket)
    monkeypatch.setenv(SHARED_VAR, "")  # restored afterwards
    worker = point.Worker(os.open(os.devnull, os.O_WRONLY))
    worker.share_template()
    assert worker.template is None and os.environ[SHARED_VAR].startswith(wb_template.UNSHARED)
    monkeypatch.setattr(wb_template, "_local", None)  # this process as the worker's kernel
    try:
        result = workbench.run(world_size=2, steps=3, hidden=[16])
    finally:
        own = wb_template._local
        if own is not None:
            own.close()
    assert result.completed and [e["detail"] for e in result.events if e["kind"] == "template"] == [
        "no shared rank template (the sweep worker could not share a rank template: its socket @x cannot be made "
        "(Address family not supported by protocol)): this process started its own (its torch import is on this "
        "run's start)"]
