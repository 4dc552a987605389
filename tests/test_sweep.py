"""Sweeps: grid and ids, bad input, resume and failure isolation, SIGINT, aggregation, report.

The mechanics use ``tests/notebooks/tiny_sweep.ipynb`` (fails when ``a < 0``; with ``train`` a real 2-rank run)."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from sweep_fixtures import fake_result, fake_sweep, fake_trials

import workbench
from workbench.base.errors import SweepError
from workbench.campaigns.studies.sensitivity import load_trials, save_trials
from workbench.launch import cli
from workbench.launch.sweeps.point import alive, descendants, write_json
from workbench.launch.sweeps.report import report
from workbench.launch.sweeps.run import (
    grid_points,
    is_complete,
    load_sweep,
    notebook_parameters,
    parse_value,
    point_id,
    sweep,
)
from workbench.results.run_result import load_table

ROOT = Path(__file__).resolve().parents[1]
TINY = Path(__file__).parent / "notebooks" / "tiny_sweep.ipynb"


def test_values_grid_and_ids(tmp_path):
    assert [parse_value(v) for v in ("0", "1e-3", "true", "null", "[64, 32]", "shrink", "kill:rank=2,step=60")] == \
        [0, 0.001, True, None, [64, 32], "shrink", "kill:rank=2,step=60"]
    points = grid_points({"strategy": ["shrink", "rollback"], "seed": [0, 1]})
    assert points == [{"strategy": "shrink", "seed": 0}, {"strategy": "shrink", "seed": 1},
                      {"strategy": "rollback", "seed": 0}, {"strategy": "rollback", "seed": 1}]
    assert point_id({"strategy": "shrink", "seed": 0}) == point_id({"seed": 0, "strategy": "shrink"})
    assert point_id({"seed": 0, "strategy": "shrink"}).startswith("seed=0,strategy=shrink-")
    assert point_id({"seed": 0}) != point_id({"seed": "0"}) != point_id({"seed": 0.0})
    assert "/" not in point_id({"fault": "kill:rank=2,step=60", "path": "a/b"})
    grid = tmp_path / "grid.yaml"
    grid.write_text("- {strategy: shrink, regrow: true}\n- {strategy: none}\n")
    assert grid_points({"seed": [0, 1]}, grid) == [{"strategy": "shrink", "regrow": True, "seed": 0},
                                                   {"strategy": "shrink", "regrow": True, "seed": 1},
                                                   {"strategy": "none", "seed": 0}, {"strategy": "none", "seed": 1}]
    grid.write_text("strategy: [shrink, rollback]\nworld_size: 2\n")
    assert grid_points(None, grid) == [{"strategy": "shrink", "world_size": 2},
                                       {"strategy": "rollback", "world_size": 2}]
    for text in ("strategy: [\n", "- 1\n- 2\n", "[]\n", "strategy: []\n"):
        grid.write_text(text)
        with pytest.raises(SweepError):
            grid_points(None, grid)
    with pytest.raises(SweepError, match="no values"):
        grid_points({"seed": []})
    with pytest.raises(SweepError, match="twice"):
        grid_points({"seed": [0, 0]})
    # papermill.inspect_notebook drops `fault = "kill:rank=2,step=60"` (two '='); our reading keeps it
    declared = notebook_parameters(ROOT / "notebooks" / "permanent_faults.ipynb")
    assert declared["fault"] == "kill:rank=2,step=60" and declared["world_size"] == 4 and "out" in declared


@pytest.mark.parametrize("argv, message", [
    (["-p", "nope", "1"], "has no parameter 'nope'"),
    (["-p", "a"], "-p"),                                           # no values: argparse's own one-line error
    (["--grid", "{grid}"], "not valid YAML"),
    (["-p", "out", "x"], "'out' is set by the sweep"),
    (["-p", "a", "1", "-p", "a", "2"], "given twice"),
    (["--jobs", "0"], "jobs must be at least 1"),
])
def test_bad_input_exits_2_before_running(tmp_path, capsys, argv, message):
    grid = tmp_path / "bad.yaml"
    grid.write_text("a: [1, 2\n")
    out = tmp_path / "sweep"
    argv = [a.replace("{grid}", str(grid)) for a in argv]
    try:
        code = cli.main(["sweep", str(TINY), *argv, "--out", str(out)])
    except SystemExit as exc:
        code = exc.code
    err = capsys.readouterr().err
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err
    assert not out.exists()  # nothing ran, nothing was written


def test_missing_notebook_exits_2(tmp_path, capsys):
    assert cli.main(["sweep", str(tmp_path / "nope.ipynb"), "-p", "a", "1", "--out", str(tmp_path / "s")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_resume_failure_isolation_and_aggregation(tmp_path):
    out = tmp_path / "sweep"
    frame = sweep(TINY, {"a": [1, -1], "b": ["x", "y"]}, out=out, jobs=2, progress=False)
    assert len(frame) == 4 and len(frame.attrs["executed"]) == 4
    good, bad = frame[frame.a == 1], frame[frame.a == -1]
    assert set(good.status) == {"completed"} and set(good.outcome) == {"completed"}
    assert list(good.final_test_accuracy) == [0.1, 0.1] and set(good.b) == {"x", "y"}
    assert set(bad.status) == {"failed"} and set(bad.outcome) == {"error"}
    assert all("a must not be negative: -1" in e for e in bad.error)
    for _, row in frame.iterrows():  # each point: its executed notebook; no temporary file left
        point = out / row.point
        assert (point / "tiny_sweep.ipynb").is_file() and not list(point.glob(".*"))
        assert (point / "result.h5").is_file() == (row.a == 1)
    table, attrs = load_table(out / "results.h5")
    assert list(table.point) == list(frame.point) and attrs["parameters"] == ["a", "b"]
    assert workbench.load_sweep(out).equals(table)

    again = sweep(TINY, {"a": [1, -1], "b": ["x", "y"]}, out=out, jobs=2, progress=False, retry_failed=False)
    assert again.attrs["executed"] == [] and len(again.attrs["skipped"]) == 4

    gone = good.point.iloc[0]
    (out / gone / "result.h5").unlink()
    assert load_sweep(out).set_index("point").loc[gone, "status"] == "failed"  # stale table rebuilt
    third = sweep(TINY, {"a": [1, -1], "b": ["x", "y"]}, out=out, jobs=2, progress=False)
    assert sorted(third.attrs["executed"]) == sorted([gone, *bad.point])  # the deleted one and the failed ones
    assert third.attrs["completed"] == [gone] and (out / gone / "result.h5").is_file()


def _tree(pid):
    found = {}
    for proc in descendants(pid):
        try:
            found[proc] = Path(f"/proc/{proc[0]}/cmdline").read_text().replace("\0", " ")
        except OSError:
            pass
    return found


def test_sigint_stops_every_process_and_resumes(tmp_path):
    """A real 2-rank training run per point; SIGINT while ranks run; nothing left; the next run does the rest."""
    out = tmp_path / "sweep"
    argv = [sys.executable, "-m", "workbench", "sweep", str(TINY), "-p", "a", "0", "1", "2", "-p", "train", "true",
            "-p", "steps", "300", "--out", str(out), "--no-progress"]
    # as in a terminal: a shell without job control (CI, a background job) starts children with SIGINT ignored
    proc = subprocess.Popen([*argv, "--jobs", "1"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    seen: dict = {}
    deadline = time.monotonic() + 90
    try:
        while not any("workbench.rank" in c for c in seen.values()):
            assert proc.poll() is None and time.monotonic() < deadline, "no rank process appeared"
            seen.update(_tree(proc.pid))
            time.sleep(0.02)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130 and "interrupted" in err
    assert any("ipykernel" in c for c in seen.values())
    assert any("workbench.launch.sweeps.point" in c for c in seen.values())
    assert any("workbench.supervisor.template" in c for c in seen.values())  # the worker's shared template: gone too
    left = [c for p, c in seen.items() if alive(*p)]
    assert not left, f"left behind: {left}"
    assert not list(out.rglob(".*tmp*")) and not list(out.rglob(".running-*"))  # nothing half-written
    # one job: the signal came while the first point's ranks ran, so no point had finished and none may look so
    finished = {p.parent.name for p in out.glob("*/result.h5")}
    assert finished == set()

    resumed = subprocess.run([*argv, "--jobs", "2"], capture_output=True, text=True, timeout=240)
    assert resumed.returncode == 0, resumed.stderr
    assert "3 points: 3 executed (3 completed, 0 failed)" in resumed.stdout  # each point run once, none lost
    frame = load_sweep(out)
    assert len(frame) == 3 and set(frame.status) == {"completed"} and set(frame.outcome) == {"completed"}
    assert frame.final_test_accuracy.between(0.3, 1).all() and set(frame["config.world_size"]) == {2}


def test_report_picks_the_figures_that_fit(tmp_path):
    ids = fake_sweep(tmp_path / "s")
    trials = load_trials(tmp_path / "s" / ids[0] / "sensitivity.h5")
    assert trials.equals(fake_trials())
    page = report(tmp_path / "s", out=tmp_path / "r.html").read_text()
    for title in ("Strategy trade-off", "Recovery timeline: checkpoint_restart", "Recovery timeline: shrink",
                  "Bit sensitivity (8 trials from 1 points)", "Gossip vs allreduce (mean over 12 runs)"):
        assert f"<h3>{title}" in page, title
    assert page.count("<tr class=\"completed\">") == len(ids)
    assert page.count("Plotly.newPlot") == 6 and "<script src=" not in page  # plotly.js inlined, once
    assert page.count("/**\n* plotly.js") == 1

    one = tmp_path / "one"  # a single strategy, no trials, no gossip: no trade-off, no heatmap, no gossip figure
    ids = fake_sweep(one)
    for pid in ids[1:]:
        (one / pid / "result.h5").unlink()
    (one / ids[0] / "sensitivity.h5").unlink()
    page = report(one).read_text()
    assert "Strategy trade-off" not in page and "Bit sensitivity" not in page and "Gossip" not in page
    assert "Recovery timeline: shrink" in page and page.count("<tr class=\"failed\">") == len(ids) - 1
    both = report(tmp_path / "s", one, out=tmp_path / "both.html").read_text()  # one section per sweep
    assert both.count("<h2>") == 2 and both.count("<h3>Points</h3>") == 2 and both.count("/**\n* plotly.js") == 1


def test_the_trade_off_lists_points_whose_notebook_failed(tmp_path):
    """A strategy whose every point failed (its notebook's last cell said so, no result saved) does not vanish
    from the trade-off figure: it is listed apart as failed, by its sweep parameter."""
    ids = fake_sweep(tmp_path / "s")
    for pid in ids:
        if "strategy=shrink" in pid:
            (tmp_path / "s" / pid / "result.h5").unlink()
            state = json.loads((tmp_path / "s" / pid / "point.json").read_text())
            state.update(status="failed", error="AssertionError: no rank survived (cell [9])")
            (tmp_path / "s" / pid / "point.json").write_text(json.dumps(state))
    page = report(tmp_path / "s", out=tmp_path / "r.html").read_text()
    assert "not trade-off points: runs that failed: shrink: 4" in page
    assert '"name":"rollback (4 runs)"' in page and '"name":"shrink (' not in page


def test_complete_with_several_runs_below_out(tmp_path):
    point = tmp_path / "p"
    (point / "nb.ipynb").parent.mkdir(parents=True)
    (point / "nb.ipynb").write_text("{}")
    write_json(point / "point.json", {"status": "completed", "notebook": str(point / "nb.ipynb"),
                                      "parameters": {"seed": 0, "out": str(point)}})
    assert not is_complete(point)
    fake_result("shrink", 0, "gossip").save(point / "gossip-p4")  # a notebook saving one run per mode
    assert is_complete(point)


def test_report_cli_errors(tmp_path, capsys):
    assert cli.main(["report", str(tmp_path)]) == 2
    assert "not a sweep directory" in capsys.readouterr().err
    save_trials(fake_trials(), tmp_path / "t.h5")  # a table is not a sweep either
    assert cli.main(["report", str(tmp_path / "t.h5")]) == 2


def test_slurm_job_array_runs_each_point_as_a_task(tmp_path):
    """--emit slurm writes a job array; its tasks, run here as sbatch would (SLURM_ARRAY_TASK_ID set), each run one
    point; the table is built from the points afterwards."""
    out = tmp_path / "array"
    assert cli.main(["sweep", str(TINY), "-p", "a", "1", "-1", "--out", str(out), "--emit", "slurm",
                     "--sbatch=--partition=cpu"]) == 0
    script = (out / "sweep.slurm").read_text()
    for line in ("#SBATCH --array=0-1", "#SBATCH --cpus-per-task=1", "#SBATCH --partition=cpu",
                 f"#SBATCH --output={out.resolve()}/slurm-%A_%a.log"):
        assert line in script
    assert not list(out.glob("*/point.json"))  # emitting runs nothing
    codes = []
    for task in (0, 1, 0):
        env = {**os.environ, "SLURM_ARRAY_TASK_ID": str(task)}
        done = subprocess.run(["bash", str(out / "sweep.slurm")], env=env, capture_output=True, text=True,
                              timeout=240)
        codes.append((done.returncode, done.stdout.strip().split(": ")[-1]))
    assert codes[0] == (0, "completed") and codes[1][0] == 1 and codes[2] == (0, "already complete")
    frame = load_sweep(out).set_index("a")
    assert frame.loc[1, "status"] == "completed" and frame.loc[-1, "status"] == "failed"
    assert "a must not be negative" in frame.loc[-1, "error"]
    with pytest.raises(SweepError, match=r"point 2 is out of range: the array has points 0\.\.1"):
        cli.cmd_sweep(cli.build_parser().parse_args(["sweep", str(TINY), "--out", str(out), "--point", "2"]))


def test_a_sweep_over_models_and_datasets_through_the_notebooks_parameters(tmp_path):
    out = tmp_path / "models"
    frame = sweep(ROOT / "notebooks" / "quickstart.ipynb",
                  {"model": ["resnet20", "lenet5"], "dataset": ["digits"], "world_size": [2], "steps": [12],
                   "fault": ["kill:rank=1,step=6"], "strategy": ["shrink"]}, out=out, jobs=1, progress=False)
    assert list(frame.status) == ["completed", "completed"], frame.get("error")
    table = load_sweep(out).set_index("model")
    assert set(table.index) == {"resnet20", "lenet5"} and (table.world_size_final == 1).all()
