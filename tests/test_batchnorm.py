"""Batch norm's running statistics are training state: replicas keep them identical, recovery moves and restores
them, checkpoints keep them, bit flips reach them, detectors see them — in every parallel mode."""

import os
import struct

import pytest
import torch

import workbench
from workbench.base import checkpoint
from workbench.base.errors import ConfigError
from workbench.campaigns.studies import sensitivity
from workbench.campaigns.studies.sensitivity import LocalResume, bit_sensitivity
from workbench.faults.hdf5 import alter_checkpoint
from workbench.rank.state import RunningStats

pytestmark = pytest.mark.usefixtures("no_leaks")

MODEL = os.environ.get("WB_TEST_BN_MODEL", "resnet20")
WORLD, STEPS, KILL = 4, 60, 30


def final_state(result):
    return checkpoint.load(result.summary["final_checkpoint"]).model


def max_diff(a, b):
    return max((a[k].double() - b[k].double()).abs().max().item() for k in a)


def ieee_flip(value, bit):
    """The float32 ``value`` with bit ``bit`` (LSB-0) flipped, computed independently of the workbench."""
    (word,) = struct.unpack("<I", struct.pack("<f", value))
    return struct.unpack("<f", struct.pack("<I", word ^ (1 << bit)))[0]


@pytest.fixture(scope="module")
def golden(tmp_path_factory):
    result = workbench.run(world_size=WORLD, steps=STEPS, eval_interval=STEPS, model=MODEL,
                           out=tmp_path_factory.mktemp("bn-golden"))
    assert result.completed and result.summary["replicas_identical"]
    return result


def test_running_stats_average_over_contributors_only():
    model = torch.nn.Sequential(torch.nn.BatchNorm1d(3), torch.nn.BatchNorm1d(2))
    stats = RunningStats(model)
    assert stats.slots == 3 + 3 + 2 + 2 + 1
    region = torch.zeros(stats.slots)
    stats.pack(region)
    assert region[-1] == 1.0 and torch.equal(region[3:6], torch.ones(3))  # running_var of the first BN
    summed = region * 2  # two contributors holding the same values ...
    summed[0] += 4.0  # ... but the second's running_mean[0] is 4
    stats.unpack(summed)
    assert model[0].running_mean[0].item() == 2.0 and model[0].running_var.tolist() == [1.0, 1.0, 1.0]
    before = stats.copy()
    stats.unpack(torch.zeros(stats.slots))  # nobody contributed: nothing changes
    assert all(torch.equal(a, b) for a, b in zip(before, stats.copy()))


def test_data_parallel_replicas_keep_identical_running_statistics(golden):
    state = final_state(golden)
    assert golden.summary["replicas_identical"]  # the digest covers buffers
    variances = [v for k, v in state.items() if k.endswith("running_var")]
    assert len(variances) >= 2 and not any(torch.equal(v, torch.ones_like(v)) for v in variances)  # they moved
    assert int(state["bn1.num_batches_tracked"]) == STEPS


def test_rollback_with_a_replacement_is_bitwise_the_no_fault_run_buffers_included(golden, tmp_path):
    result = workbench.run(world_size=WORLD, steps=STEPS, eval_interval=STEPS, model=MODEL, strategy="rollback",
                           regrow=True, faults=[f"kill:rank=2,step={KILL}"], out=tmp_path)
    assert result.completed and result.summary["replicas_identical"]
    assert result.summary["world_size_final"] == WORLD and result.failures[0]["samples_lost"] == 0
    # the step in flight's forward moved the running statistics and counted a batch: both were undone
    assert max_diff(final_state(result), final_state(golden)) == 0.0


@pytest.mark.parametrize("strategy", ["shrink", "forward"])
def test_shrink_and_forward_keep_replicas_and_buffers_identical(strategy, golden, tmp_path):
    result = workbench.run(world_size=WORLD, steps=STEPS, eval_interval=STEPS, model=MODEL, strategy=strategy,
                           faults=[f"kill:rank=1,step={KILL}"], out=tmp_path)
    assert result.completed and result.summary["replicas_identical"]
    assert result.summary["world_size_final"] == WORLD - 1
    # up to the kill, the failure-free run, bitwise; then every step once, each on the whole batch but the
    # failed one: the samples that entered its whole update (forward applied bucket 0 from every share before the
    # fault and finished the rest without the dead share, shrink redid it without the dead share)
    rows = [(r["step"], r["loss"], r["samples"]) for r in result.metrics]
    assert rows[:KILL] == [(r["step"], r["loss"], r["samples"]) for r in golden.metrics[:KILL]]
    batch, share = golden.metrics[0]["samples"], golden.metrics[0]["samples"] // WORLD
    assert [step for step, _, _ in rows] == list(range(STEPS))
    assert [n for _, _, n in rows] == [batch if s != KILL else batch - share for s in range(STEPS)]
    assert result.failures[0]["samples_lost"] == share and result.failures[0]["steps_redone"] == 0
    state = final_state(result)
    assert int(state["bn1.num_batches_tracked"]) == STEPS  # every step's forward counted once, none twice
    assert max_diff(state, final_state(golden)) > 1e-3  # the lost share shows, in the buffers too


def test_a_flipped_running_variance_spreads_to_every_replica_at_the_update(tmp_path):
    flip = "flip:rank=1,step=20,target=buffer,tensor=bn1.running_var,index=0,bit=30"
    result = workbench.run(world_size=2, steps=30, eval_interval=30, model=MODEL, faults=[flip], out=tmp_path)
    assert result.completed and result.summary["flips"] == 1
    (event,) = [e for e in result.events if e["kind"] == "flip"]
    old, new = (float(v) for v in event["detail"].split(": ")[1].split(" -> "))
    assert new == ieee_flip(old, 30), event["detail"]  # an exact IEEE flip of the exponent's top bit
    assert result.summary["replicas_identical"]  # averaged: the corruption reached both replicas alike
    assert final_state(result)["bn1.running_var"][0].item() > 1e30


def test_the_guard_sees_a_flipped_buffer_and_rolls_back(tmp_path):
    flip = "flip:rank=1,step=20,target=buffer,tensor=bn1.running_var,index=0,bit=30"
    result = workbench.run(world_size=2, steps=30, eval_interval=30, model=MODEL, faults=[flip], detect=["guard"],
                           detect_every=5, out=tmp_path)
    assert result.completed and result.summary["detections"] == 1  # the next check after the flip, then restored
    assert final_state(result)["bn1.running_var"][0].item() < 100.0


def test_buffer_flip_names_are_checked_before_any_process_starts():
    with pytest.raises(ConfigError, match="bn1.running_var"):
        workbench.start(world_size=2, steps=5, model=MODEL, faults=["flip:rank=0,step=1,target=buffer,tensor=bn9.x"])


def test_checkpoint_alteration_reaches_batch_norm_buffers(golden, tmp_path):
    path = tmp_path / "altered.h5"
    (flip,) = alter_checkpoint(golden.summary["final_checkpoint"], datasets=["model/bn1.running_var"], index=0,
                               bit=30, out=path)
    assert flip.target == "model/bn1.running_var" and flip.new == ieee_flip(flip.old, 30)
    assert checkpoint.load(path, check=False).model["bn1.running_var"][0].item() == flip.new
    assert checkpoint.verify(path) == ["model/bn1.running_var"]  # the per-dataset checksum sees it


@pytest.mark.parametrize("parallelism, extra", [
    ("gossip", {}), ("pipeline", {"world_size": 2}), ("pipeline", {}), ("hybrid", {"pipeline_stages": 2})])
def test_every_parallel_mode_trains_a_batch_norm_model(parallelism, extra, tmp_path):
    result = workbench.run(**{"world_size": 4, **extra}, steps=20, eval_interval=20, model=MODEL,
                           parallelism=parallelism, out=tmp_path)
    assert result.completed, result.summary["reason"]
    state = final_state(result)
    assert int(state["bn1.num_batches_tracked"]) >= 20
    if parallelism == "hybrid":
        assert result.summary["replicas_identical"]  # a stage's replicas average their running statistics


class Evaluated:
    """``bit_sensitivity`` run with the models it builds watched (``build_model`` wrapped in its module): each
    resume's model (the unflipped one first, then each trial's, in the frame's order) and what its ``layer``
    output in evaluation, the pass that gives the trial its accuracy."""

    def __init__(self, monkeypatch, layer="bn1"):
        self.layer, self.models, self.outputs = layer, [], []
        build = sensitivity.build_model

        def watched(*args, **kwargs):
            model = build(*args, **kwargs)
            self.models.append(model)
            self.outputs.append(None)
            n = len(self.models) - 1

            def seen(_module, _inputs, out):
                if not model.training:
                    self.outputs[n] = out.detach().clone()

            getattr(model, layer).register_forward_hook(seen)
            return model

        monkeypatch.setattr(sensitivity, "build_model", watched)

    def silenced(self, trial, channel):
        """Whether trial ``trial``'s model, in the evaluation the tool made, output exactly its bias on
        ``channel`` for every test image (and not because the bias and everything else were silent too)."""
        layer = getattr(self.models[1 + trial], self.layer)
        out = self.outputs[1 + trial]
        return bool((out[:, channel] == layer.bias[channel]).all()) and out.std().item() > 0

    def accuracy_silencing(self, data, channel):
        """The unflipped resume's model (its weights, its buffers) evaluated with ``channel`` of the layer
        replaced by its bias: what a trial whose flip silences that channel must score, computed without it."""
        model, layer = self.models[0], getattr(self.models[0], self.layer)

        def silence(_module, _inputs, out):
            out = out.clone()
            out[:, channel] = layer.bias[channel]
            return out

        handle = layer.register_forward_hook(silence)
        try:
            with torch.no_grad():
                return (model(data.x_test).argmax(1) == data.y_test).float().mean().item()
        finally:
            handle.remove()


def bn_sensitivity(golden, monkeypatch, bits):
    evaluated = Evaluated(monkeypatch)
    frame = bit_sensitivity(golden.summary["final_checkpoint"], bits=bits, trials=2, steps=2,
                            datasets=["bn1.running_var"], seed=1)
    assert len(evaluated.models) == 1 + len(frame) and all(out is not None for out in evaluated.outputs)
    return frame, evaluated


def test_the_sensitivity_tools_flip_buffers_and_evaluate_with_them(golden, monkeypatch):
    frame, evaluated = bn_sensitivity(golden, monkeypatch, bits=[30, 0])
    assert set(frame.dataset) == {"bn1.running_var"} and len(frame) == 4
    assert all(row.new == ieee_flip(row.old, row.bit) for row in frame.itertuples())
    # a mantissa LSB changes nothing that shows: the very accuracy of the unflipped resume, not one within tolerance
    assert (frame[frame.bit == 0].accuracy == frame.attrs["golden_accuracy"]).all(), frame
    assert (frame[frame.bit == 0].outcome == "masked").all()
    # bit 30 of a variance below 1 multiplies it by 2**128 and stays finite (> 1e37). Training normalises with
    # the batch's statistics, so the trial trains exactly as the unflipped resume; its running variance stays
    # ~0.8 x 1e38 (finite: no NaN can follow, never `nonfinite`, never a crash). Evaluation divides by its root
    # (~1e19): the channel is silenced, its output exactly its bias for every input, in the tool's own
    # evaluation. The accuracy is then exactly the unflipped model's with that channel replaced by its bias:
    # masked or degraded depending on the channel (of bn1's 16, silencing 2, 9 or 13 costs no test digit, 0 and 14
    # gain one or two), so the pin is that number, and for this seed's two channels (7 and 8: 4 and 5 of the 359
    # test digits lost, over the 1 % tolerance) `degraded`.
    resume = LocalResume(golden.summary["final_checkpoint"])
    golden_accuracy = frame.attrs["golden_accuracy"]
    for trial, row in enumerate(frame.itertuples()):
        if row.bit != 30:
            continue
        assert resume.base.model["bn1.running_var"][row.index].item() == row.old, row  # the element it names
        assert 1e37 < row.new < float("inf"), row
        assert evaluated.silenced(trial, row.index), row
        expected = evaluated.accuracy_silencing(resume.data, row.index)
        assert row.accuracy == expected < golden_accuracy - 0.01, (row, expected, golden_accuracy)
        assert row.outcome == "degraded", row


def test_a_sensitivity_tool_that_never_applies_the_flip_fails_the_channel_check(golden, monkeypatch):
    """The planted break for the check above: ``apply_masks`` flips a copy, so each trial logs the flip (its
    ``old`` and ``new`` are right) but resumes the unflipped state. Its channel is not silenced in the tool's
    evaluation, and it scores the unflipped accuracy: ``masked``, where the flip must degrade."""
    real = sensitivity.apply_masks
    monkeypatch.setattr(sensitivity, "apply_masks", lambda x, indices, masks, target="": real(
        x.clone(), indices, masks, target))
    frame, evaluated = bn_sensitivity(golden, monkeypatch, bits=[30])
    assert list(frame.index) == [0, 1] and all(row.new == ieee_flip(row.old, 30) for row in frame.itertuples())
    for trial, row in enumerate(frame.itertuples()):
        assert not evaluated.silenced(trial, row.index), row
        assert row.accuracy == frame.attrs["golden_accuracy"] and row.outcome == "masked", row


@pytest.mark.parametrize("strategy", ["checkpoint_restart", "reinit"])
def test_restarts_bring_back_the_running_statistics_of_their_snapshot(strategy, golden, tmp_path):
    result = workbench.run(world_size=WORLD, steps=STEPS, eval_interval=STEPS, model=MODEL, strategy=strategy,
                           checkpoint_every=10, faults=[f"kill:rank=1,step={KILL + 5}"], out=tmp_path)
    assert result.completed and result.summary["replicas_identical"]
    assert result.failures[0]["steps_redone"] == 5
    # the steps since the snapshot were redone from its parameters and buffers at the same world size
    assert max_diff(final_state(result), final_state(golden)) < 1e-4


def test_the_fingerprint_detector_finds_a_diverged_conv_weight(tmp_path):
    flip = "flip:rank=1,step=12,target=weight,tensor=layer1_0.conv1.weight,index=3,bit=22"
    result = workbench.run(world_size=2, steps=30, eval_interval=30, model=MODEL, faults=[flip],
                           detect=["fingerprint"], detect_every=5, out=tmp_path)
    assert result.completed and result.summary["detections"] == 1 and result.summary["replicas_identical"]
