import math

import h5py
import pytest

from workbench import RunResult, load_results
from workbench.base.errors import ResultsError


def make_result(outcome="completed", seed=0):
    metrics = [{"step": s, "time": 0.1 * s, "loss": 2.0 / (s + 1), "train_acc": 0.5, "samples": 64,
                "test_acc": 0.9 if s == 2 else math.nan, "test_loss": 0.3 if s == 2 else math.nan, "world_size": 4,
                "generation": 0, "step_time": 0.01} for s in range(3)]
    events = [{"time": 0.2, "step": 1, "rank": 2, "kind": "kill", "detail": "planned fault fired", "source": "planned"}]
    failures = [{"rank": 2, "step": 1, "cause": "died (SIGKILL)", "strategy": "shrink", "detection_s": 0.02,
                 "resume_s": 0.05, "world_size_after": 3}]
    summary = {"outcome": outcome, "reason": "r", "final_test_accuracy": 0.9, "steps_completed": 3,
               "world_size_initial": 4, "world_size_final": 3, "wall_s": 1.0, "failures": failures,
               "result_path": None}
    config = {"world_size": 4, "strategy": "shrink", "seed": seed, "faults": ["kill:rank=2,step=1"]}
    return RunResult(config, metrics, events, failures, summary)


def test_save_load_round_trip(tmp_path):
    result = make_result()
    path = result.save(tmp_path / "run")
    assert path.name == "result.h5" and not list(path.parent.glob("*.tmp"))
    with h5py.File(path) as f:
        assert list(f["metrics/loss"][()]) == [2.0, 1.0, 2.0 / 3]
    loaded = RunResult.load(path.parent)
    assert loaded.summary["result_path"] == str(path.resolve())
    assert loaded.events == result.events and loaded.failures == result.failures
    frame = loaded.to_dataframe()
    assert list(frame.step) == [0, 1, 2] and frame.test_acc.notna().sum() == 1


def test_load_results_directory_and_glob(tmp_path):
    make_result(seed=0).save(tmp_path / "a")
    make_result("failed", seed=1).save(tmp_path / "b")
    runs = load_results(tmp_path)
    assert sorted(runs.outcome) == ["completed", "failed"]
    assert sorted(runs["config.seed"]) == [0, 1] and set(runs.n_failures) == {1}
    steps = load_results(str(tmp_path / "*"), metrics=True)
    assert len(steps) == 6 and set(steps.outcome) == {"completed", "failed"}
    with pytest.raises(ResultsError, match="no result.h5"):
        load_results(tmp_path / "empty")


def test_training_curve_marks_faults():
    from workbench.results import plots

    fig = plots.training_curve(make_result())
    names = [trace.name for trace in fig.data]
    assert names[:3] == ["training loss", "test accuracy", "world size (fraction)"] and "kill" in names
    kill = next(t for t in fig.data if t.name == "kill")
    assert list(kill.x) == [1] and "rank 2" in kill.hovertext[0]


def test_the_summary_has_one_writer():
    """Issue 45, item 4: only workbench/results/summary.py sets a key of a run's summary; every other module hands
    it its figures (a planted write elsewhere is found)."""
    import ast
    from pathlib import Path

    def writes(tree):
        found = []
        for node in ast.walk(tree):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
                node, (ast.AugAssign, ast.AnnAssign)) else []
            for target in targets:
                for part in ast.walk(target):
                    if isinstance(part, ast.Subscript) and "summary" in ast.unparse(part.value):
                        found.append(node.lineno)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                    node.func.attr in ("update", "setdefault", "pop") and "summary" in ast.unparse(node.func.value):
                found.append(node.lineno)
        return found

    root = Path(__file__).resolve().parent.parent / "workbench"
    writers = {str(p.relative_to(root)): lines for p in sorted(root.rglob("*.py"))
               if (lines := writes(ast.parse(p.read_text())))}
    assert writers == {"results/summary.py": writers.get("results/summary.py")}, writers
    assert writes(ast.parse('result.summary["clock"] = "wall"\nsummary.update(a=1)')) == [1, 2]  # planted
