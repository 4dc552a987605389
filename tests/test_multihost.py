"""Runs beyond one machine: hosts files, ranks that join through the store, remote faults, two namespaces."""

import subprocess
import sys
import time

import netns
import pytest

import workbench
from workbench.base.errors import ConfigError
from workbench.base.hosts_file import read_hosts_file
from workbench.config.run import RunConfig

RANK = [sys.executable, "-m", "workbench", "rank"]


def test_hosts_file_is_parsed_and_checked(tmp_path):
    hosts = tmp_path / "hosts"
    hosts.write_text("# address slots [launcher]\n10.0.0.1 2\n\n10.0.0.2 1 ssh -o BatchMode=yes 10.0.0.2\n"
                     "10.0.0.3 1   # joins by itself\n")
    parsed = read_hosts_file(hosts)
    assert parsed == [{"address": "10.0.0.1", "slots": 2, "launch": None},
                      {"address": "10.0.0.2", "slots": 1, "launch": ["ssh", "-o", "BatchMode=yes", "10.0.0.2"]},
                      {"address": "10.0.0.3", "slots": 1, "launch": None}]
    config = RunConfig(world_size=4, hosts=parsed)
    assert config.bind == "10.0.0.1"  # the first host is this machine
    with pytest.raises(ConfigError, match="hold 4 ranks but world_size=3"):
        RunConfig(world_size=3, hosts=parsed)
    hosts.write_text("10.0.0.1 2\nnode7 two\n")
    with pytest.raises(ConfigError, match=r"hosts:2: 'node7 two' is not 'ADDRESS SLOTS"):
        read_hosts_file(hosts)
    with pytest.raises(ConfigError, match="first host .* takes no launcher"):
        RunConfig(world_size=2, hosts=["10.0.0.1 2 ssh x"])
    with pytest.raises(ConfigError, match="bind: 'example.org' is not an IP address"):
        RunConfig(bind="example.org")


def test_cli_hosts_file_sets_world_size_and_reports_a_missing_file(tmp_path):
    from workbench.launch.cli import _config_from_args, build_parser

    hosts = tmp_path / "hosts"
    hosts.write_text("127.0.0.1 1\n127.0.0.2 2\n")
    config = _config_from_args(build_parser().parse_args(["run", "--hosts-file", str(hosts)]))
    assert (config.world_size, config.bind) == (3, "127.0.0.1")
    done = subprocess.run([sys.executable, "-m", "workbench", "run", "--hosts-file", str(tmp_path / "none")],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "hosts_file: cannot read" in done.stderr and "Traceback" not in done.stderr


def test_ranks_join_through_the_store_and_a_launched_rank_is_killed_remotely(tmp_path):
    """127.0.0.2 stands for another host: rank 1 is started through a launcher (``env``, as ``ssh HOST`` would
    be) and killed live by a control message; rank 2 joins by itself; a join with a taken hint is refused. The run
    trains until the test stops it, so the refusal and the kill cannot come after a run that already ended."""
    run = workbench.start(world_size=3, steps=1_000_000, eval_interval=50, strategy="shrink", store_port=0,
                          hosts=["127.0.0.1 1", "127.0.0.2 1 env", "127.0.0.3 1"], startup_timeout=60,
                          out=tmp_path / "run")
    store = _store_address(run)
    joining = subprocess.Popen([*RANK, "--store", store, "--rank-hint", "2"])
    try:
        _wait_for(lambda: run.status.get("step", 0) >= 20, 120, "the run did not reach step 20")
        refused = subprocess.run([*RANK, "--store", store, "--rank-hint", "2"], capture_output=True, text=True,
                                 timeout=60)
        assert refused.returncode == 2 and "rank 2 cannot be taken" in refused.stderr
        run.kill(1)
        _wait_for(lambda: run.status["generation"] >= 1 and run.status["world_size"] == 2, 120,
                  "the run did not shrink to 2 ranks")
        resumed = run.status["step"]
        _wait_for(lambda: run.status["step"] >= resumed + 10, 120, "the run did not go on after the shrink")
        run.stop()
        result = run.wait(timeout=180)
        joined_exit = joining.wait(timeout=30)  # before the finally's kill: the joined rank ends with the run
    finally:
        run.stop()
        if joining.poll() is None:
            joining.kill()
            joining.wait(timeout=10)
    assert result.summary["outcome"] == "stopped", result.summary["reason"]
    (failure,) = result.summary["failures"]
    assert failure["rank"] == 1 and failure["world_size_after"] == 2
    assert "on 127.0.0.2 lost its connection" in failure["cause"]
    assert joined_exit == 0  # the joined rank ended with the run, by itself
    assert any(e["kind"] == "host" and "rank 2 joined from 127.0.0.1" in e["detail"] for e in result.events)


def test_a_rank_without_a_run_gets_one_line():
    done = subprocess.run([*RANK, "--store", "127.0.0.1:9", "--connect-timeout", "1"], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 2 and "no workbench run answered at 127.0.0.1:9" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.skipif(netns.unavailable() is not None, reason=str(netns.unavailable()))
def test_four_ranks_over_two_namespaces_survive_a_kill_on_the_other_host(tmp_path):
    """Acceptance (#8): 2 ranks in each namespace; rank 3, in the second, is killed; shrink goes on over TCP."""
    with netns.two_hosts() as (a, b):
        port = 29400
        remotes = [b.command(*RANK, "--store", f"{a.address}:{port}", "--rank-hint", str(k)) for k in (2, 3)]
        summary, codes, _ = netns.run_over_two_hosts(
            a, tmp_path, f"{a.address} 2\n{b.address} 2   # ranks 2 and 3 join from the other namespace\n", port,
            ["--steps", "200", "--eval-interval", "50", "--strategy", "shrink", "--fault", "kill:rank=3,step=100"],
            remotes)
    assert summary["outcome"] == "completed" and summary["world_size_final"] == 3
    (failure,) = summary["failures"]
    assert failure["rank"] == 3 and failure["step"] == 100 and failure["cause"] == f"on {b.address} lost its connection"
    assert failure["steps_redone"] == 0
    assert codes == [0, -9]  # rank 2 ended with the run; rank 3 was SIGKILLed in the other namespace
    events = workbench.RunResult.load(summary["result_path"]).events
    assert any(e["kind"] == "host" and e["detail"] == f"rank 2 joined from {b.address}" for e in events)


def _store_address(run, timeout=60):
    _wait_for(lambda: any(e["kind"] == "store" for e in run.events), timeout, "no store event")
    detail = next(e["detail"] for e in run.events if e["kind"] == "store")
    return detail.split()[2].rstrip(";")


def _wait_for(predicate, timeout, what):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)
