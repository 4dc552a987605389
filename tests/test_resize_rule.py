"""The learning-rate rule of a resize (``resize_rule``; docs/permanent-faults.md, "The learning-rate rule"):
``keep`` leaves the global batch and lr alone; ``linear`` keeps each rank's (lane's) batch and scales the global
batch and lr with the world, reads the sample stream by a cursor, and equals a restart at each size."""

import subprocess
import sys
import time

import h5py
import numpy as np
import pytest

import workbench
from workbench.base import checkpoint
from workbench.config import preflight, resize_rule
from workbench.config.resizing import check_world
from workbench.config.run import RunConfig
from workbench.workloads.data import BatchSequence

pytestmark = pytest.mark.usefixtures("no_leaks")


def completed(tmp_path, name, **settings):
    result = workbench.run(**{"steps": 30, "eval_interval": 30, "resize_rule": "linear", **settings},
                           out=tmp_path / name)
    assert result.completed, result.summary["reason"]
    return result


def final_weights(result):
    return checkpoint.load(result.summary["final_checkpoint"]).model


def max_diff(a, b):
    assert a.keys() == b.keys()
    return max((a[k] - b[k]).abs().max().item() for k in a)


def by_step(result, column):
    """{step: value} of a metrics column (the last row of a step that appears again)."""
    return {r["step"]: r[column] for r in result.metrics}


def rule_by_step(result):
    """{step: (global batch, lr)}."""
    return {r["step"]: (r["global_batch"], r["lr"]) for r in result.metrics}


# -- the rule and the stream, without processes --------------------------------------------------------------------

def test_the_scale_of_4_8_2_gives_each_step_its_global_batch_and_lr():
    scale = resize_rule.Scale(0.05, 64, [[0, 4]]).resized(10, 8).resized(20, 2)
    assert scale.history == [[0, 4], [10, 8], [20, 2]] and scale.base == 4
    assert [scale.global_batch(s) for s in (0, 9, 10, 19, 20, 29)] == [64, 64, 128, 128, 32, 32]
    assert [scale.lr_at(s) for s in (9, 10, 20)] == [0.05, 0.1, 0.025]
    assert scale.resized(15, 4).history == [[0, 4], [10, 8], [15, 4]]  # a later resize replaces what followed
    assert scale.resized(10, 4).history == [[0, 4]]  # back at the base from step 10: no change at all
    gossip = resize_rule.Scale(0.05, 64, [[0, 4], [10, 8]], scales_lr=False)
    assert (gossip.global_batch(10), gossip.lr_at(10)) == (128, 0.05)


def test_one_segment_reads_the_stream_of_keep_bit_for_bit():
    keep, linear = BatchSequence(1438, 64, 3), BatchSequence(1438, 64, 3, [(0, 64), (10**6, 64)])
    for step in range(100):  # four epochs and more
        assert np.array_equal(keep(step), linear(step))
        assert linear.cursor(step) == (step // 22, step % 22 * 64, 64)  # 22 batches of 64 in 1438 samples


def test_the_sample_cursor_walks_the_epochs_and_drops_what_a_batch_cannot_fill():
    segments = [(0, 64), (10, 128), (20, 32)]
    stream = BatchSequence(1438, 64, 0, segments)
    epoch, offset = 0, 0
    for step in range(300):  # the reference: one batch after the other
        batch = [b for first, b in segments if first <= step][-1]
        if offset + batch > 1438:
            epoch, offset = epoch + 1, 0
        assert stream.cursor(step) == (epoch, offset, batch)
        perm = np.random.default_rng((0, epoch)).permutation(1438)
        assert np.array_equal(stream(step), perm[offset: offset + batch])
        offset += batch
    assert stream.cursor(20) == (1, 512, 32)  # six batches of 128 left 30 samples of epoch 0 unread
    assert stream.samples(20) == 1438 + 512


def test_a_restart_at_another_size_is_a_resize_at_the_checkpoints_step(tmp_path):
    path = tmp_path / "c.h5"
    with h5py.File(path, "w") as f:
        f.attrs.update(step=10, resize_rule='{"rule": "linear", "base": 4, "history": [[0, 4]]}')
    config = RunConfig(world_size=8, resize_rule="linear", resume_verify=False, steps=30)
    config.resume = str(path)  # (a file of attributes only: RunConfig would check it is one)
    assert resize_rule.start(config).history == [[0, 4], [10, 8]]
    assert resize_rule.start(config.replace(world_size=4)).history == [[0, 4]]
    hybrid = RunConfig(world_size=6, parallelism="hybrid", pipeline_stages=2, resize_rule="linear", batch_size=96)
    assert resize_rule.start(hybrid).history == [[0, 3]]  # lanes, not ranks
    assert resize_rule.start(RunConfig()) is None  # keep


# -- what linear refuses, and what it allows ------------------------------------------------------------------------

@pytest.mark.parametrize("settings, message", [
    ({"world_size": 3}, "resize_rule: linear keeps each of the 3 starting ranks' batch, but batch_size 64 / 3 is "
                        "not a whole number of samples: give a multiple of 3"),
    ({"world_size": 6, "parallelism": "hybrid", "pipeline_stages": 2, "micro_batches": 2},
     "of the 3 starting lanes' batch, but batch_size 64 / 3"),
    ({"resize_rule": "sqrt"}, "resize_rule: 'sqrt' is not known: allowed keep, linear"),
])
def test_linear_refuses_a_batch_that_does_not_split(settings, message):
    with pytest.raises(workbench.ConfigError, match=message.replace("(", r"\(").replace(".", r"\.")):
        RunConfig(**{"resize_rule": "linear", **settings})


def test_linear_refuses_a_planned_global_batch_beyond_the_training_set_before_anything_starts():
    config = RunConfig(world_size=4, batch_size=128, resize_rule="linear", faults=["resize:world=64,step=5"])
    with pytest.raises(workbench.ConfigError, match="linear at world size 64 makes the global batch 2048 "
                       r"\(32 per rank x 64\), more than the 1438 training samples"):
        preflight.check(config)
    preflight.check(config.replace(resize_rule="keep"))  # keep: the global batch stays 128


def test_linear_lets_each_rank_keep_its_batch_where_keep_would_split_it_too_thin():
    config = RunConfig(world_size=2, batch_size=8, resize_rule="linear", faults=["resize:world=16,step=5"])
    assert check_world(config, 16, "resize") == 16  # 4 samples per rank, 64 in all
    with pytest.raises(workbench.ConfigError, match="16 ranks cannot split a global batch of 8"):
        RunConfig(world_size=2, batch_size=8, faults=["resize:world=16,step=5"])


@pytest.mark.parametrize("args, expected", [
    (["--world-size", "3", "--resize-rule", "linear"], "resize_rule: linear keeps each of the 3 starting ranks'"),
    (["--resize-rule", "sqrt"], "resize_rule: 'sqrt' is not known: allowed keep, linear"),
    (["--batch-size", "128", "--resize-rule", "linear", "--fault", "resize:world=64,step=5"],
     "more than the 1438 training samples"),
])
def test_the_command_line_says_it_in_one_line_and_exits_2(args, expected, tmp_path):
    done = subprocess.run([sys.executable, "-m", "workbench", "run", *args, "--out", str(tmp_path / "o")],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.count("\n") == 1 and expected in done.stderr
    assert not (tmp_path / "o").exists()


def test_the_lab_panel_offers_the_rule():
    from workbench.launch.lab import Lab

    lab = Lab(resize_rule="linear", spawn="fresh")
    try:
        assert tuple(lab.resize_rule.options) == ("keep", "linear") and lab.config().resize_rule == "linear"
        lab.resize_rule.value = "keep"
        assert lab.config().resize_rule == "keep"
    finally:
        lab.close()


# -- runs --------------------------------------------------------------------------------------------------------

def test_linear_4_8_2_scales_batch_and_lr_per_step_and_equals_restarts_at_each_size(tmp_path):
    resized = completed(tmp_path, "resized", world_size=4, faults=["resize:world=8,step=10", "resize:world=2,step=20"])
    expected = {s: (64, 0.05) if s < 10 else (128, 0.1) if s < 20 else (32, 0.025) for s in range(30)}
    assert rule_by_step(resized) == expected
    assert by_step(resized, "samples") == {s: gb for s, (gb, _) in expected.items()}  # every sample trained
    events = [e["detail"] for e in resized.events if e["kind"] == "resize" and "ranks at step" in e["detail"]]
    assert events == ["4 -> 8 ranks at step 10; resize_rule linear: lr 0.1, global batch 128",
                      "8 -> 2 ranks at step 20; resize_rule linear: lr 0.025, global batch 32"]
    assert resized.summary["replicas_identical"] and resized.failures == []
    record = checkpoint.load(resized.summary["final_checkpoint"]).rule
    assert record["history"] == [[0, 4], [10, 8], [20, 2]] and record["units"] == 2
    assert record["cursor"] == {"epoch": 1, "offset": 832, "samples": 1438 + 832}  # 10 x 32 after (1, 512)
    # a run stopped at each resize step and restarted from its checkpoint at the new size, under the same rule
    first = completed(tmp_path, "a", world_size=4, steps=10)
    second = completed(tmp_path, "b", world_size=8, steps=20, resume=first.summary["final_checkpoint"])
    third = completed(tmp_path, "c", world_size=2, steps=30, resume=second.summary["final_checkpoint"])
    assert by_step(second, "lr") == {s: 0.1 for s in range(10, 20)}
    assert max_diff(final_weights(resized), final_weights(third)) <= 1e-5


def test_the_scaled_lr_and_batch_are_what_trains_a_resize_at_step_0_equals_keep_at_twice_the_batch_and_lr(tmp_path):
    # from step 0 the cursor reads keep's stream of 128-sample batches: only a learning rate or a loss scale that
    # is not applied would tell the two apart
    linear = completed(tmp_path, "linear", world_size=2, steps=12, faults=["resize:world=4,step=0"])
    keep = completed(tmp_path, "keep", world_size=4, steps=12, batch_size=128, lr=0.1, resize_rule="keep")
    assert set(rule_by_step(linear).values()) == {(128, 0.1)}
    assert max_diff(final_weights(linear), final_weights(keep)) <= 1e-5


def test_linear_without_a_resize_is_keep_bit_for_bit(tmp_path):
    keep = completed(tmp_path, "keep", world_size=2, steps=12, resize_rule="keep")
    linear = completed(tmp_path, "linear", world_size=2, steps=12)
    assert max_diff(final_weights(keep), final_weights(linear)) == 0.0
    assert set(by_step(linear, "lr").values()) == {0.05} and np.isnan(keep.metrics[0]["lr"])


def test_a_failure_after_a_resize_is_no_resize_the_survivors_keep_the_global_batch_and_lr(tmp_path):
    result = completed(tmp_path, "shrunk", world_size=2, steps=20, strategy="shrink",
                       faults=["resize:world=4,step=5", "kill:rank=1,step=12"])
    assert [f["world_size_after"] for f in result.failures] == [3]
    # 4 ranks' batches, split over 3 after the failure
    assert {rule for s, rule in rule_by_step(result).items() if s >= 5} == {(128, 0.1)}
    assert by_step(result, "samples")[19] == 128


def test_hybrid_linear_grows_by_lanes_and_equals_a_restart(tmp_path):
    hybrid = {"parallelism": "hybrid", "pipeline_stages": 2, "micro_batches": 2}
    resized = completed(tmp_path, "hybrid", world_size=4, steps=20, faults=["resize:world=6,step=10"], **hybrid)
    assert {s: by_step(resized, "global_batch")[s] for s in (9, 10)} == {9: 64, 10: 96}  # 32 per lane, 2 -> 3 lanes
    assert by_step(resized, "lr")[10] == pytest.approx(0.075)
    first = completed(tmp_path, "h4", world_size=4, steps=10, **hybrid)
    second = completed(tmp_path, "h6", world_size=6, steps=20, resume=first.summary["final_checkpoint"], **hybrid)
    assert max_diff(final_weights(resized), final_weights(second)) <= 1e-5


def test_gossip_linear_keeps_each_ranks_batch_and_its_lr(tmp_path):
    result = completed(tmp_path, "gossip", world_size=4, steps=20, parallelism="gossip",
                       faults=["resize:world=8,step=10"])
    assert {s: by_step(result, "samples")[s] for s in (9, 10)} == {9: 64, 10: 128}  # 16 per rank throughout
    assert set(by_step(result, "lr").values()) == {0.05}
    assert by_step(result, "global_batch")[10] == 128


def test_a_live_resize_scales_at_its_boundary_and_one_beyond_the_training_set_is_refused_at_the_call(tmp_path):
    run = workbench.start(world_size=2, steps=400, eval_interval=400, resize_rule="linear", out=tmp_path / "live")
    try:
        deadline = time.monotonic() + 60
        while not run.metrics:
            assert time.monotonic() < deadline and not run.done, run.events[-3:]
            time.sleep(0.05)
        with pytest.raises(workbench.ConfigError, match="resize_rule: linear at world size 64 makes the global batch "
                           "2048"):
            run.resize(64)
        run.resize(4)
        while not any(r["world_size"] == 4 for r in run.metrics):
            assert time.monotonic() < deadline and not run.done, run.events[-3:]
            time.sleep(0.05)
    finally:
        run.stop()
        result = run.wait(60)
    [event] = [e["detail"] for e in result.events if e["kind"] == "resize" and "ranks at step" in e["detail"]]
    assert event.startswith("2 -> 4 ranks at step") and event.endswith("; resize_rule linear: lr 0.1, global batch 128")
    # the rule changes with the world, at the step the ranks stopped before (a live boundary may lie behind them)
    at = min(r["step"] for r in result.metrics if r["world_size"] == 4)
    rules = rule_by_step(result)
    assert rules[at - 1] == (64, 0.05) and {rules[s] for s in rules if s >= at} == {(128, 0.1)}
    assert by_step(result, "samples")[at] == 128
