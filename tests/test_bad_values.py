"""Bad values answered in one line (issue 28, item 4): ``workbench rank``'s address, timeout and bounded wait; the
live faults of the Python API; wrong types of run settings; defaults the lab panel cannot show."""

import http.server
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import workbench
from workbench.base.errors import ConfigError
from workbench.config.run import RunConfig

RANK = [sys.executable, "-m", "workbench", "rank"]
CPP = ("frame #", "Exception raised from", "c10::", "c10d", "TCPStore")
MARGIN_S = 5.0  # start-up of the interpreter on a busy 2-core machine; the waits themselves are bounded exactly


def one_line(done, code):
    """The only line ``done`` wrote on stderr, after checking its exit code and that no traceback came with it."""
    assert done.returncode == code, done.stderr
    assert "Traceback" not in done.stderr and not any(mark in done.stderr for mark in CPP), done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    return lines[0]


def free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture
def listener():
    """A socket of the test that listens on 127.0.0.1 and says nothing unless told."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    server.settimeout(30)
    yield server, f"127.0.0.1:{server.getsockname()[1]}"
    server.close()


# -- workbench rank ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("store, timeout, expected", [
    ("nohost", "3", "--store: 'nohost' is not HOST:PORT with a port in 1..65535"),
    ("a:b", "3", "--store: 'a:b' is not HOST:PORT"),
    (":80", "3", "--store: ':80' is not HOST:PORT"),
    ("host:", "3", "--store: 'host:' is not HOST:PORT"),
    ("127.0.0.1:99999", "3", "--store: port 99999 in '127.0.0.1:99999' is out of range: allowed 1..65535"),
    ("127.0.0.1:0", "3", "--store: port 0 in '127.0.0.1:0' is out of range: allowed 1..65535"),
    ("127.0.0.1:1", "-1", "--connect-timeout: '-1' is not allowed: a finite number of seconds > 0"),
    ("127.0.0.1:1", "0", "--connect-timeout: '0' is not allowed"),
    ("127.0.0.1:1", "nan", "--connect-timeout: 'nan' is not allowed"),
    ("127.0.0.1:1", "inf", "--connect-timeout: 'inf' is not allowed"),
    ("127.0.0.1:1", "soon", "--connect-timeout: 'soon' is not allowed"),
])
def test_rank_refuses_a_malformed_address_or_timeout_at_once(store, timeout, expected):
    done = subprocess.run([*RANK, "--store", store, f"--connect-timeout={timeout}"], capture_output=True,
                          text=True, timeout=60)
    assert one_line(done, 2).startswith(f"workbench: error: {expected}")


def test_rank_refuses_a_malformed_rank_hint():
    done = subprocess.run([*RANK, "--store", "127.0.0.1:1"], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "RANK": "two"})
    assert one_line(done, 2) == ("workbench: error: --rank-hint: 'two' is not allowed: a rank number >= 0 "
                                 "(default: $RANK if set)")


def test_rank_without_a_run_waits_the_timeout_then_says_so():
    port = free_port()  # nothing listens there: connection refused, retried until the deadline
    start = time.monotonic()
    done = subprocess.run([*RANK, "--store", f"127.0.0.1:{port}", "--connect-timeout", "1.5"], capture_output=True,
                          text=True, timeout=60)
    elapsed = time.monotonic() - start
    assert one_line(done, 2) == (f"workbench: error: no workbench run answered at 127.0.0.1:{port} within 1.5 s "
                                 "(connection refused: nothing listens there)")
    assert 1.5 <= elapsed < 1.5 + MARGIN_S


def test_an_attempt_under_way_at_the_deadline_does_not_hide_why_the_others_ended(monkeypatch):
    """Under load the deadline can fall while a retry's connect is under way: the reason is the one the ended
    attempts found (refused), not the provisional one of the attempt cut short."""
    from workbench.rank import join

    release = threading.Event()
    calls = []

    def connect(address, timeout=None):
        calls.append(address)
        if len(calls) > 1:
            release.wait(5)  # a connect the scheduler has not finished when the waiting thread gives up
        raise ConnectionRefusedError

    monkeypatch.setattr(join.socket, "create_connection", connect)
    monkeypatch.setattr(join, "_RETRY_S", 0.01)
    try:
        with pytest.raises(join.JoinError, match=r"within 0.3 s \(connection refused: nothing listens there\)"):
            join.wait_for_run("127.0.0.1", 1, 0.3)
    finally:
        release.set()
    assert len(calls) == 2


def test_rank_against_a_silent_program_ends_at_its_timeout(listener):
    server, address = listener
    start = time.monotonic()
    rank = subprocess.Popen([*RANK, "--store", address, "--connect-timeout", "2"], stderr=subprocess.PIPE, text=True)
    conn, _ = server.accept()  # accepts, then says nothing
    with conn:
        _, err = rank.communicate(timeout=60)
    elapsed = time.monotonic() - start
    line = one_line(subprocess.CompletedProcess(rank.args, rank.returncode, "", err), 2)
    assert line == (f"workbench: error: no workbench run answered at {address} within 2 s (a program there accepted "
                    "the connection but did not answer the store's handshake)")
    assert 2 <= elapsed < 2 + MARGIN_S


def test_rank_against_a_program_that_answers_something_else_ends_at_once(listener):
    server, address = listener
    rank = subprocess.Popen([*RANK, "--store", address, "--connect-timeout", "60"], stderr=subprocess.PIPE, text=True)
    conn, _ = server.accept()
    with conn:
        conn.recv(64)
        conn.sendall(b"SSH-2.0-OpenSSH_9.2\r\n")
        _, err = rank.communicate(timeout=30)  # long before its 60 s
    line = one_line(subprocess.CompletedProcess(rank.args, rank.returncode, "", err), 2)
    assert line == (f"workbench: error: no workbench run answered at {address} (another program listens there: it "
                    "answered b'SSH-2.0-OpenSSH_9.2\\r\\n')")


def test_rank_against_an_http_server_ends_at_its_timeout():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    address = f"127.0.0.1:{server.server_address[1]}"
    try:
        start = time.monotonic()
        done = subprocess.run([*RANK, "--store", address, "--connect-timeout", "1"], capture_output=True, text=True,
                              timeout=60)
        elapsed = time.monotonic() - start
    finally:
        server.shutdown()
        server.server_close()
    assert one_line(done, 2).startswith(f"workbench: error: no workbench run answered at {address} within 1 s (")
    assert elapsed < 1 + MARGIN_S


# what `python -m workbench.rank --store` (and the peers' ranks) do first, without its ~1-15 s of torch import
JOIN_ONLY = [sys.executable, "-c", "import sys; from workbench.rank.join import join_or_exit; "
             "join_or_exit(sys.argv[2], sys.argv[4])"]


@pytest.mark.parametrize("command, sig", [(RANK, signal.SIGTERM), (RANK, signal.SIGINT), (JOIN_ONLY, signal.SIGTERM)],
                         ids=["workbench-rank-SIGTERM", "workbench-rank-SIGINT", "join_or_exit-SIGTERM"])
def test_a_signal_ends_the_wait_at_once(listener, command, sig):
    server, address = listener
    rank = subprocess.Popen([*command, "--store", address, "--connect-timeout", "120"], stderr=subprocess.PIPE,
                            text=True)
    try:
        conn, _ = server.accept()
        with conn:
            conn.settimeout(30)
            assert conn.recv(64)  # the handshake came: the rank waits for an answer now
            sent = time.monotonic()
            rank.send_signal(sig)
            _, err = rank.communicate(timeout=30)
            took = time.monotonic() - sent
    finally:
        rank.kill()
        rank.wait()
    line = one_line(subprocess.CompletedProcess(rank.args, rank.returncode, "", err), 130)
    assert line == f"workbench: interrupted while waiting for the run at {address}"
    assert took < MARGIN_S


# -- the Python API: live faults on ranks that do not exist, wrong types --------------------------------------------
def test_live_faults_refuse_ranks_that_are_not_there():
    run = workbench.start(world_size=2, steps=100_000, hidden=[16], strategy="shrink", eval_interval=1000,
                          heartbeat_timeout=60)  # a busy machine must not freeze a rank out before the test kills it
    try:
        deadline = time.monotonic() + 120
        while run.status.get("members") != [0, 1] or run.status.get("step", 0) < 2:
            assert time.monotonic() < deadline and not run.done, run.status
            time.sleep(0.05)
        cases = [(run.kill, 99, "rank: no rank 99 in this run: its ranks are 0..1"),
                 (run.hang, -1, "rank: no rank -1 in this run: its ranks are 0..1"),
                 (run.hang, 1.7, "rank: must be an integer, got float 1.7"),
                 (run.kill, "1", "rank: must be an integer, got str '1'"),
                 (run.hang, True, "rank: must be an integer, got bool True")]
        for method, rank, message in cases:
            with pytest.raises(ConfigError) as caught:
                method(rank)
            assert str(caught.value) == message
        with pytest.raises(ConfigError, match="rank: no rank 2 in this run"):
            run.flip(2, target="weight", tensor="fc1.weight")
        step = run.status["step"]
        while run.status["step"] < step + 3:  # rank 1 is not frozen: the run still steps
            assert time.monotonic() < deadline, run.status
            time.sleep(0.05)
        assert not [e for e in run.events if e["kind"] in ("hang", "kill", "fault_skipped")]
        run.kill(np.int64(1))  # a real one
        while run.status.get("members") != [0]:
            assert time.monotonic() < deadline and not run.done, run.status
            time.sleep(0.05)
        with pytest.raises(ConfigError, match=r"rank: cannot hang rank 1: it is not alive \(failure at step \d+: rank "
                                              r"1 died \(SIGKILL\)\); live ranks: \[0\]"):
            run.hang(1)
    finally:
        run.stop()
    run.wait(timeout=60)
    with pytest.raises(ConfigError, match=r"rank: cannot kill rank 0: the run has ended \(stopped\)"):
        run.kill(0)


@pytest.mark.parametrize("values, message", [
    ({"world_size": "4"}, "world_size: must be an integer, got str '4'"),
    ({"world_size": True}, "world_size: must be an integer, got bool True"),
    ({"world_size": 4.0}, "world_size: must be an integer, got float 4.0"),
    ({"steps": [10]}, "steps: must be an integer, got list [10]"),
    ({"lr": "0.1"}, "lr: must be a number, got str '0.1'"),
    ({"momentum": False}, "momentum: must be a number, got bool False"),
    ({"regrow": "yes"}, "regrow: must be true or false, got str 'yes'"),
    ({"resume_verify": 0}, "resume_verify: must be true or false, got int 0"),
    ({"hidden": 16}, "hidden: must be a list of integers, got int 16"),
    ({"hidden": [16, 1.5]}, "hidden: must be a list of integers, got float 1.5 at index 1 of [16, 1.5]"),
    ({"detect": ["guard", 3]}, "detect: must be a list of names, got int 3 at index 1 of ['guard', 3]"),
    ({"checkpoint_every": "25"}, "checkpoint_every: must be an integer or None, got str '25'"),
    ({"stage_cuts": 3}, "stage_cuts: must be a list of integers or None, got int 3"),
    ({"faults": 5}, "faults: must be a list, got int 5"),
])
def test_wrong_types_are_named_as_types(values, message):
    with pytest.raises(ConfigError) as caught:
        RunConfig.from_dict(values)
    assert str(caught.value) == message


def test_right_types_pass_and_numbers_are_normalised():
    config = RunConfig.from_dict({"world_size": np.int64(2), "lr": 1, "hidden": (np.int64(8),), "momentum": 0})
    assert (config.world_size, config.lr, config.hidden, config.momentum) == (2, 1.0, [8], 0.0)
    assert type(config.world_size) is int and type(config.lr) is float and type(config.hidden[0]) is int
    with pytest.raises(ConfigError, match=r"^world_size: must be an integer, got str '4'$"):
        workbench.run(world_size="4")  # before any process starts


# -- the lab panel ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("values, message", [
    ({"world_size": 32}, "world_size: 32 is beyond what the lab panel shows: allowed 1..16 (a larger run: "
                         "workbench.start or workbench run)"),
    ({"strategy": "checkpoint_restart", "checkpoint_every": 200_000},
     "checkpoint_every: 200000 is beyond what the lab panel shows: allowed 1..100000"),
    ({"world_size": "4"}, "world_size: must be an integer, got str '4'"),
    ({"colour": "red"}, "colour: is not a run setting"),
])
def test_lab_refuses_what_it_cannot_show(values, message):
    from workbench.launch.lab import Lab

    with pytest.raises(ConfigError) as caught:
        Lab(**values)
    assert str(caught.value).startswith(message)


def test_lab_keeps_the_defaults_it_has_no_box_for():
    from workbench.launch.lab import Lab

    lab = Lab(world_size=16, eval_interval=5, checkpoint_every=7, strategy="shrink", spawn="fresh")
    try:
        config = lab.config()
        assert (config.world_size, config.eval_interval, config.checkpoint_every) == (16, 5, 7)
    finally:
        lab.close()


# -- values of run and sweep that the probe of the CLI found answered late or not at all ------------------------------
@pytest.mark.parametrize("argv, expected", [
    (["run", "--config", "."], "config: cannot read '.': Is a directory"),
    (["run", "--track", "bad://where"], "--track: 'bad://where' is no tracking URI MLflow reads"),
    (["sweep", "notebooks/quickstart.ipynb", "-p", "seed", "0", "--out", "OUT", "--timeout", "-1"],
     "argument --timeout: '-1' is not allowed: a finite number of seconds > 0"),
    (["sweep", "notebooks/quickstart.ipynb", "-p", "seed", "0", "--out", "OUT", "--timeout", "inf"],
     "argument --timeout: 'inf' is not allowed"),
])
def test_bad_run_and_sweep_values_exit_2_before_anything_starts(argv, expected, tmp_path):
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    argv = [str(tmp_path / "s") if a == "OUT" else a for a in argv]
    done = subprocess.run([sys.executable, "-m", "workbench", *argv], capture_output=True, text=True, timeout=120,
                          cwd=root)
    assert expected in one_line(done, 2)
    assert not (tmp_path / "s").exists()  # nothing written


def test_sweep_refuses_a_timeout_that_is_not_a_positive_number(tmp_path):
    from workbench.base.errors import SweepError
    from workbench.launch.sweeps.run import sweep

    with pytest.raises(SweepError, match="timeout must be a finite number of seconds > 0"):
        sweep("notebooks/quickstart.ipynb", {"seed": [0]}, out=tmp_path / "s", timeout=-1)
    assert not (tmp_path / "s").exists()
