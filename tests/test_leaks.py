"""The leak check itself (tests/leaks.py, the autouse fixtures of conftest.py)."""

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import leaks

# a stand-in for a rank: any command line with workbench.rank in it is one
FAKE_RANK = [sys.executable, "-c", "import time, sys; time.sleep(float(sys.argv[1]))", "60", "workbench.rank"]


def test_command_lines_of_the_project():
    for args in ["/v/bin/python -m workbench.rank --control 127.0.0.1:5 --id 0", "workbench.rank 2 gen 3",
                 "/v/bin/python -m workbench.supervisor.template",
                 "/v/bin/python -m workbench.rank.peers.torchft_rank --control x",
                 "/v/bin/torchft_lighthouse --bind 127.0.0.1:1", "/v/bin/python /v/bin/workbench run --json",
                 "/v/bin/python -m workbench sweep nb.ipynb --out o",
                 "/v/bin/python -m workbench.launch.sweeps.point --events 5",
                 "/v/bin/python -m torch.distributed.run --nnodes 1 -m workbench.rank.peers.torchrun_rank "
                 "--store x",
                 "/v/bin/python -m ipykernel_launcher -f /tmp/k.json", "/v/bin/python /v/bin/papermill a.ipynb b.ipynb",
                 "/v/bin/python -m jupyterlab --ip 127.0.0.1",
                 "/v/bin/python /v/bin/mlflow server --host 127.0.0.1 --port 5000",  # an MLflow server and workers
                 "/v/bin/python -m uvicorn --host 127.0.0.1 --port 5000 --workers 1 mlflow.server.fastapi_app:app",
                 "/v/bin/python -m mlflow.server.jobs._job_runner"]:
        assert leaks.is_project(args), args
    for args in ["/v/bin/python -m torch.distributed.run train.py", "/v/bin/python /v/bin/pytest -q tests",
                 "vim workbench", "bash -c cd /work/workbench && make", "/usr/bin/python3 -m http.server",
                 "/v/bin/python -m uvicorn app:main"]:
        assert not leaks.is_project(args), args


def _orphan(tmp_path: Path, *argv: str, env: dict | None = None) -> leaks.Proc:
    """Start ``argv`` as a grandchild whose parent exits at once: init is its parent, as for a leaked rank."""
    pid_file = tmp_path / "pid"
    subprocess.run([sys.executable, "-c", "import subprocess, sys; p = subprocess.Popen(sys.argv[2:], "
                    "start_new_session=True); open(sys.argv[1], 'w').write(str(p.pid))", str(pid_file), *argv],
                   check=True, env=env)
    pid = int(pid_file.read_text())
    return next(p for p in leaks.all_processes() if p.pid == pid)


def test_an_orphan_of_this_session_is_found_and_killed_but_not_another_sessions(tmp_path):
    before = {p.key for p in leaks.project_processes()}
    ours = _orphan(tmp_path, *FAKE_RANK)
    theirs = _orphan(tmp_path, *FAKE_RANK, env={**os.environ, leaks.TAG_VAR: "another-suite"})
    try:
        tag = os.environ[leaks.TAG_VAR]
        assert ours.ppid != os.getpid() and "workbench.rank" in ours.args
        assert {ours.pid, theirs.pid} <= {p.pid for p in leaks.new_processes(before)}
        assert [p.pid for p in leaks.new_processes(before, tag)] == [ours.pid]  # the other suite's is not ours
        t0 = time.monotonic()
        assert [p.pid for p in leaks.wait_gone(before, tag, timeout=0.3)] == [ours.pid]
        assert 0.3 <= time.monotonic() - t0 < 2
        leaks.kill([ours])
        assert leaks.new_processes(before, tag) == []
    finally:
        leaks.kill([ours, theirs])


def test_only_this_processs_idle_template_is_exempt():
    from workbench.supervisor import template as wb_template

    if wb_template._local is not None:  # this process's real template (earlier tests' runs): let it go first
        wb_template._local.close()
    tag = os.environ[leaks.TAG_VAR]
    before = {p.key for p in leaks.project_processes()}
    script = "import subprocess, sys, time; time.sleep(60)"
    template = subprocess.Popen([sys.executable, "-c", script, "workbench.supervisor.template"])
    try:
        deadline = time.monotonic() + 10
        while not any(p.pid == template.pid and p.args.endswith("workbench.supervisor.template")
                      for p in leaks.all_processes()):
            assert time.monotonic() < deadline
            time.sleep(0.02)
        assert leaks.new_processes(before, tag) == []  # ours, idle: the next run reuses it
        # a second one is not
        second = subprocess.Popen([sys.executable, "-c", script, "workbench.supervisor.template"])
        try:
            deadline = time.monotonic() + 10
            while [p.pid for p in leaks.new_processes(before, tag)] != [second.pid]:
                assert time.monotonic() < deadline
                time.sleep(0.02)
        finally:
            second.kill()
            second.wait()
    finally:
        template.kill()
        template.wait()


def test_a_test_that_leaves_a_process_fails_naming_it_and_the_process_is_killed(tmp_path):
    here = Path(__file__).parent
    for name in ("conftest.py", "leaks.py", "ci_guard.py"):  # the conftest imports both
        (tmp_path / name).write_text((here / name).read_text())
    (tmp_path / "test_leaky.py").write_text(textwrap.dedent(f"""
        import subprocess

        def test_leaky(tmp_path):
            subprocess.Popen({FAKE_RANK!r}, start_new_session=True)

        def test_clean():
            pass
    """))
    t0 = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           str(tmp_path)], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    out = done.stdout + done.stderr
    assert done.returncode == 1, out
    assert "2 passed, 1 error" in out and "ERROR at teardown of test_leaky" in out, out
    assert "the test left 1 process(es) running 3 s after it ended (now killed)" in out and "workbench.rank" in out
    assert time.monotonic() - t0 < 60
    pid = int(out.split("(now killed):")[1].split()[0])
    assert not any(p.pid == pid and p.args for p in leaks.all_processes())

