"""MLflow tracking: a real ``mlflow server`` on 127.0.0.1 (one for the module, stopped at its end) receives a 2-rank
run and a 2-point sweep, read back through the MLflow client; ``--track sqlite:///mlflow.db`` and ``./mlruns`` with
no server; a server gone or wrong leaves the run complete with a warning; without MLflow, ``--track`` exits 2 with
the install command."""

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

import workbench
from workbench.launch.sweeps.run import load_sweep
from workbench.results import tracking

ROOT = Path(__file__).resolve().parents[1]
TINY = Path(__file__).parent / "notebooks" / "tiny_sweep.ipynb"
START_TIMEOUT_S = 90.0  # measured: ~7 s on 2 idle cores; a loaded machine takes longer


def MlflowClient(tracking_uri: str):  # noqa: N802 - MLflow's class, imported when a test needs it
    return pytest.importorskip("mlflow").MlflowClient(tracking_uri=tracking_uri)


@pytest.fixture
def mlflow_installed():
    """Skip where MLflow is not installed (``.[dev]`` installs it; the extra is optional)."""
    pytest.importorskip("mlflow", reason="MLflow tracking is optional: pip install -e .[tracking]")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _head() -> str:
    return subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True,
                          check=True).stdout.strip()


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """``mlflow server`` (sqlite backend, artifacts served) on a free port of 127.0.0.1; its URL. Started in a
    session of its own, without MLflow's job runner; stopped with its whole process group at the module's end
    (module scope: every test that needs a server is here, so it starts once; the module's leak check runs after
    it stopped)."""
    pytest.importorskip("mlflow", reason="MLflow tracking is optional: pip install -e .[tracking]")
    base = tmp_path_factory.mktemp("mlflow-server")
    port = _free_port()
    log = open(base / "server.log", "wb")
    proc = subprocess.Popen([str(Path(sys.executable).parent / "mlflow"), "server", "--host", "127.0.0.1",
                             "--port", str(port), "--workers", "1", "--backend-store-uri",
                             f"sqlite:///{base / 'mlflow.db'}", "--artifacts-destination", str(base / "artifacts")],
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                            env={**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"})
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            assert proc.poll() is None, f"mlflow server exited: {(base / 'server.log').read_text()[-2000:]}"
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=2) as answer:
                    if answer.status == 200:
                        break
            except OSError:
                pass
            assert time.monotonic() < deadline, f"mlflow server not answering after {START_TIMEOUT_S:g} s"
            time.sleep(0.2)
        yield url
    finally:
        _stop(proc)
        log.close()


def _stop(proc: subprocess.Popen) -> None:
    """SIGTERM the server's process group, SIGKILL it after a bounded wait."""
    for sig, wait in ((signal.SIGTERM, 15), (signal.SIGKILL, 10)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            try:
                os.killpg(proc.pid, 0)
            except ProcessLookupError:
                proc.wait()
                return
            proc.poll()  # reap the leader, so that only its workers keep the group alive
            time.sleep(0.1)


def test_two_rank_run_lands_in_the_server(server, tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "run-test")
    result = workbench.run(world_size=2, steps=40, strategy="shrink", faults=["kill:rank=1,step=20"],
                           eval_interval=10, out=tmp_path, track=server)
    assert result.completed and result.summary["tracking"]["error"] is None
    run_id = result.summary["tracking"]["run_id"]
    assert workbench.RunResult.load(tmp_path).summary["tracking"]["run_id"] == run_id  # recorded in result.h5
    client = MlflowClient(tracking_uri=server)
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED" and run.data.params["world_size"] == "2"
    assert run.data.params["strategy"] == "shrink" and json.loads(run.data.params["faults"]) == [
        "kill:rank=1,step=20"]
    loss = client.get_metric_history(run_id, "loss")
    assert [m.step for m in loss] == [r["step"] for r in result.metrics] and len(loss) >= 40
    assert [m.value for m in loss] == pytest.approx([r["loss"] for r in result.metrics])
    assert [m.value for m in client.get_metric_history(run_id, "world_size")][-1] == 1
    assert len(client.get_metric_history(run_id, "test_acc")) == 4  # evaluations only, NaN rows skipped
    assert run.data.metrics["final_test_accuracy"] == pytest.approx(result.summary["final_test_accuracy"])
    assert run.data.tags["outcome"] == "completed" and "rank 1 at step 20" in run.data.tags["failure.0"]
    assert run.data.tags["prov.commit"] == _head() == run.data.tags["mlflow.source.git.commit"]
    artifacts = {a.path for a in client.list_artifacts(run_id)}
    assert {"result.h5", "final.h5", "events.json", "failures.json"} <= artifacts
    events = json.loads(Path(client.download_artifacts(run_id, "events.json", str(tmp_path / "dl"))).read_text())
    assert events["events"] == json.loads(json.dumps(result.events))


def test_sweep_is_a_parent_run_with_a_child_per_point(server, tmp_path):
    """Acceptance: `workbench sweep ... --track http://127.0.0.1:PORT`: one parent run, one child per point."""
    out = tmp_path / "sweep"
    env = {**os.environ, "MLFLOW_EXPERIMENT_NAME": "sweep-test"}
    proc = subprocess.run([sys.executable, "-m", "workbench", "sweep", str(TINY), "-p", "a", "1", "2", "-p", "train",
                           "true", "-p", "steps", "20", "--out", str(out), "--no-progress", "--track", server],
                          capture_output=True, text=True, timeout=400, env=env)
    assert proc.returncode == 0, proc.stderr
    record = json.loads((out / "tracking.json").read_text())
    assert record["error"] is None and f"tracked: MLflow run {record['run_id']} with 2 child runs" in proc.stdout
    assert "View run" not in proc.stdout  # MLflow's own URL lines are silenced: stdout is the command's
    client = MlflowClient(tracking_uri=server)
    runs = client.search_runs([record["experiment_id"]])
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == record["run_id"]]
    assert [p.info.run_id for p in parents] == [record["run_id"]] and len(children) == 2 == len(runs) - 1
    assert {c.data.params["a"] for c in children} == {"1", "2"}
    assert {c.info.run_id for c in children} == set(record["points"].values())
    for child in children:
        assert len(client.get_metric_history(child.info.run_id, "loss")) == 20
        assert {"result.h5", "tiny_sweep.ipynb", "point.log"} <= {a.path for a in
                                                                   client.list_artifacts(child.info.run_id)}
    assert {"results.h5", "sweep.json", "report.html"} <= {a.path for a in client.list_artifacts(record["run_id"])}
    assert json.loads(parents[0].data.params["sweep.a"]) == [1, 2]
    frame = load_sweep(out)  # the points' provenance: the sweep's notebook and command line, the checkout's commit
    assert set(frame["prov.notebook"]) == {str(TINY.resolve())} and set(frame["prov.commit"]) == {_head()}
    assert all("sweep" in c and "--track" in c for c in frame["prov.command"])


def _search(tmp_path, **env_vars):
    """``mlflow.search_runs()`` in a fresh process in ``tmp_path``, as a user would, with ``env_vars`` and no other
    MLFLOW_ variable; its runs (JSON of the frame)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")} | env_vars
    read = subprocess.run([sys.executable, "-c", "import mlflow; print(mlflow.search_runs().to_json())"], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=120)
    assert read.returncode == 0, read.stderr
    return json.loads(read.stdout.splitlines()[-1])


def test_track_the_readme_example_and_a_directory_with_no_server(tmp_path, mlflow_installed):
    """Acceptance: the README's `workbench run ... --track sqlite:///mlflow.db`, then a plain MLflow search finds the
    run with its metrics (no MLFLOW_ALLOW_FILE_STORE: MLflow 3 readers take the database as it is). The same result
    tracked to a directory (MLflow's file store; not ./mlruns, where MLflow keeps the database's artifacts) reads
    back once the reader allows that store."""
    proc = subprocess.run([sys.executable, "-m", "workbench", "run", "--world-size", "2", "--steps", "30", "--out",
                           str(tmp_path / "run"), "--json", "--track", "sqlite:///mlflow.db"], capture_output=True,
                          text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout.splitlines()[-1])
    assert summary["tracking"]["uri"] == "sqlite:///mlflow.db" and summary["tracking"]["error"] is None
    assert f"workbench: tracked: MLflow run {summary['tracking']['run_id']} at sqlite:///mlflow.db" in proc.stderr
    assert len(proc.stdout.splitlines()) == 1  # stdout: the --json summary alone
    runs = _search(tmp_path, MLFLOW_TRACKING_URI="sqlite:///mlflow.db")
    assert list(runs["run_id"].values()) == [summary["tracking"]["run_id"]]
    assert runs["metrics.final_test_accuracy"]["0"] == pytest.approx(summary["final_test_accuracy"])
    assert runs["metrics.loss"]["0"] > 0 and runs["params.steps"]["0"] == "30"
    again = subprocess.run([sys.executable, "-c", "from workbench.results import tracking; from "
                            "workbench.results.run_result import RunResult; "
                            "print(tracking.track_result(tracking.require('./store'), "
                            "RunResult.load('run'))['run_id'])"],
                           cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert again.returncode == 0, again.stderr
    runs = _search(tmp_path, MLFLOW_ALLOW_FILE_STORE="true", MLFLOW_TRACKING_URI=(tmp_path / "store").as_uri())
    assert list(runs["run_id"].values()) == [again.stdout.split()[-1]]
    assert runs["metrics.final_test_accuracy"]["0"] == pytest.approx(summary["final_test_accuracy"])


@pytest.mark.parametrize("where", ["gone", "wrong"])
def test_server_gone_or_wrong_the_run_completes_with_a_warning(server, tmp_path, where):
    uri = f"http://127.0.0.1:{_free_port()}" if where == "gone" else f"{server}/not-mlflow"
    began = time.monotonic()
    with pytest.warns(tracking.TrackingWarning, match="MLflow tracking to .* failed"):
        result = workbench.run(world_size=2, steps=10, out=tmp_path, track=uri)
    assert result.completed and time.monotonic() - began < 60
    saved = workbench.RunResult.load(tmp_path).summary["tracking"]
    assert saved["uri"] == uri and saved["error"] and saved["run_id"] is None


def test_without_mlflow_track_exits_2_before_anything_starts(tmp_path, monkeypatch):
    block = ("import sys; sys.modules['mlflow'] = None; from workbench.launch.cli import main; "
             "sys.exit(main(sys.argv[1:]))")
    for argv in (["run", "--world-size", "2", "--steps", "5", "--out", str(tmp_path / "run")],
                 ["sweep", str(TINY), "-p", "a", "1", "--out", str(tmp_path / "sweep")]):
        proc = subprocess.run([sys.executable, "-c", block, *argv, "--track", "./mlruns"], capture_output=True,
                              text=True, timeout=120, cwd=tmp_path)
        assert proc.returncode == 2, proc.stderr
        assert proc.stderr.count("\n") == 1 and "pip install -e .[tracking]" in proc.stderr
        assert not (tmp_path / "run").exists() and not (tmp_path / "sweep").exists()
    monkeypatch.setitem(sys.modules, "mlflow", None)
    with pytest.raises(tracking.TrackingUnavailable, match=r"pip install -e \.\[tracking\]"):
        workbench.start(world_size=2, steps=5, track="./mlruns")


def test_cli_server_gone_one_warning_line_and_exit_0(tmp_path, mlflow_installed):
    uri = f"http://127.0.0.1:{_free_port()}"
    proc = subprocess.run([sys.executable, "-m", "workbench", "run", "--world-size", "2", "--steps", "10", "--out",
                           str(tmp_path), "--json", "--track", uri], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    warning = [line for line in proc.stderr.splitlines() if "MLflow tracking" in line]
    assert len(warning) == 1 and warning[0].startswith(f"workbench: warning: MLflow tracking to {uri} failed: ")
    summary = json.loads(proc.stdout.splitlines()[-1])
    assert summary["outcome"] == "completed" and summary["tracking"]["error"] in warning[0]
