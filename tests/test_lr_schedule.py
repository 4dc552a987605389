"""The learning-rate schedule (``lr_schedule``; docs/settings.md, "The learning-rate schedule"): each step's rate
is a function of the step and the run's length, taken by every mode and peer, and by a rank that redoes or resumes
a step."""

import math
import subprocess
import sys

import pytest

import workbench
from workbench.base import checkpoint
from workbench.base.errors import ConfigError
from workbench.config import lr_schedule
from workbench.config.run import RunConfig

pytestmark = pytest.mark.usefixtures("no_leaks")


def run(tmp_path, name, **settings):
    result = workbench.run(**{"steps": 20, "eval_interval": 20, "world_size": 2, **settings}, out=tmp_path / name)
    assert result.completed, result.summary["reason"]
    return result


def lr_by_step(result):
    return {r["step"]: r.get("lr") for r in result.metrics}


def final_weights(result):
    return checkpoint.load(result.summary["final_checkpoint"]).model


def test_the_factors_of_each_schedule():
    assert [lr_schedule.factor("constant", s, 100) for s in (0, 50, 99)] == [1.0, 1.0, 1.0]
    cosine = [lr_schedule.factor("cosine", s, 100) for s in (0, 25, 50, 75, 100)]
    assert cosine == pytest.approx([1.0, (1 + math.cos(math.pi / 4)) / 2, 0.5, (1 - math.cos(math.pi / 4)) / 2, 0.0])
    assert [lr_schedule.factor("step", s, 100) for s in (0, 49, 50, 74, 75, 99)] == [1, 1, 0.1, 0.1, 0.01, 0.01]
    with pytest.raises(ValueError, match="unknown lr_schedule 'linear'"):
        lr_schedule.factor("linear", 0, 10)


def test_an_unknown_schedule_is_refused_in_one_line_before_anything_starts(tmp_path):
    with pytest.raises(ConfigError, match="lr_schedule: 'warm' is not known: allowed constant, cosine, step"):
        RunConfig(lr_schedule="warm")
    done = subprocess.run([sys.executable, "-m", "workbench", "run", "--lr-schedule", "warm", "--out",
                           str(tmp_path / "o")], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "Traceback" not in done.stderr and done.stderr.count("\n") == 1, done.stderr
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("parallelism", ["data", "gossip", "pipeline"])
def test_every_step_of_every_mode_takes_its_scheduled_rate(tmp_path, parallelism):
    result = run(tmp_path, parallelism, parallelism=parallelism, lr_schedule="cosine", lr=0.08)
    rates = lr_by_step(result)
    assert sorted(rates) == list(range(20))
    for step, lr in rates.items():
        assert lr == pytest.approx(0.08 * lr_schedule.factor("cosine", step, 20))
    constant = run(tmp_path, "c", parallelism=parallelism).metrics
    assert all(r.get("lr") is None or math.isnan(r["lr"]) for r in constant)  # constant: not reported


def test_the_schedule_changes_training_and_a_restarted_run_takes_up_its_rates_exactly(tmp_path):
    settings = {"lr_schedule": "step", "steps": 24, "checkpoint_every": 5}
    reference = run(tmp_path, "ref", **settings)
    constant = run(tmp_path, "const", steps=24)
    restarted = run(tmp_path, "kill", strategy="checkpoint_restart", faults=["kill:rank=1,step=17"], **settings)
    assert len(restarted.summary["failures"]) == 1
    ref, again = final_weights(reference), final_weights(restarted)
    assert all(ref[k].equal(again[k]) for k in ref)  # steps 15-16 redone at their own (lr/10) rate: bit for bit
    other = final_weights(constant)
    assert any(not ref[k].equal(other[k]) for k in ref)


def test_rollback_redoes_the_failed_step_at_its_rate(tmp_path):
    result = run(tmp_path, "roll", lr_schedule="cosine", strategy="rollback", world_size=4,
                 faults=["kill:rank=2,step=9"])
    assert len(result.summary["failures"]) == 1
    for step, lr in lr_by_step(result).items():
        assert lr == pytest.approx(0.05 * lr_schedule.factor("cosine", step, 20))
