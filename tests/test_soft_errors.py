"""Live bit flips in multi-process runs: classification against a golden run, detection and recovery."""

import pytest

import workbench
from workbench import ConfigError
from workbench.campaigns.studies.campaign import campaign

pytestmark = pytest.mark.usefixtures("no_leaks")

WEIGHT_BIT_30 = "flip:target=weight,rank=1,step=50,tensor=fc1.weight,index=0,bit=30"


def test_campaign_classifies_against_the_golden_run():
    frame = campaign({"world_size": 2, "steps": 150, "eval_interval": 50},
                     [WEIGHT_BIT_30, WEIGHT_BIT_30.replace("bit=30", "bit=0")], jobs=1)
    by_bit = frame.set_index("bit")
    assert by_bit.loc[30, "outcome"] in ("nonfinite", "degraded")
    assert by_bit.loc[0, "outcome"] == "masked"
    assert not frame.detected.any() and (frame.flips == 1).all()


def test_weight_flip_detected_and_recovered(tmp_path):
    golden = workbench.run(world_size=4, steps=300)
    result = workbench.run(world_size=4, steps=300, faults=[WEIGHT_BIT_30], detect=["guard", "fingerprint"],
                           out=tmp_path)
    kinds = [e["kind"] for e in result.events]
    assert "flip" in kinds and "detected" in kinds and "recovered" in kinds
    assert result.completed and result.summary["replicas_identical"]
    assert result.summary["flips"] == 1 and result.summary["detections"] == 1  # one flip, caught once, rolled back
    assert abs(result.summary["final_test_accuracy"] - golden.summary["final_test_accuracy"]) <= 0.02


def test_gradient_flips_spread_or_diverge_and_are_caught():
    """grad (before the allreduce) reaches every replica: the guard sees it in the summed gradient;
    grad_local (after it) makes one replica differ: the fingerprint majority re-broadcasts the others' state."""
    result = workbench.run(world_size=3, steps=120, detect=["guard", "fingerprint"], detect_every=10, faults=[
        "flip:target=grad,rank=0,step=30,tensor=fc2.weight,index=3,bit=30",
        "flip:target=grad_local,rank=2,step=71,tensor=fc3.weight,index=1,bit=22"])
    assert result.completed and result.summary["replicas_identical"]
    detected = [e["detail"] for e in result.events if e["kind"] == "detected"]
    recovered = [e["detail"] for e in result.events if e["kind"] == "recovered"]
    assert any(d.startswith("guard") and "gradient" in d for d in detected)
    assert any(d.startswith("fingerprint") and "[2]" in d for d in detected)
    assert any("re-broadcast" in r for r in recovered)


def test_bad_flip_target_refused_before_start():
    with pytest.raises(ConfigError, match="'fc9.weight' is not a parameter of the model"):
        workbench.start(world_size=2, faults=["flip:target=weight,rank=0,step=1,tensor=fc9.weight,index=0,bit=1"])
    with pytest.raises(ConfigError, match="index 99999 is out of range"):
        workbench.start(world_size=2, faults=["flip:target=weight,rank=0,step=1,tensor=fc1.bias,index=99999,bit=1"])


def test_activation_and_optimizer_flips_land_where_asked():
    result = workbench.run(world_size=2, steps=40, eval_interval=40, faults=[
        "flip:target=activation,rank=0,step=10,tensor=fc1,index=5,bit=30",
        "flip:target=optimizer,rank=1,step=20,tensor=fc2.weight,seed=3"])
    flips = [e["detail"] for e in result.events if e["kind"] == "flip"]
    assert len(flips) == 2 and result.summary["flips"] == 2
    assert any(d.startswith("activation fc1:output[5] bit 30") for d in flips)
    assert any(d.startswith("optimizer fc2.weight/momentum_buffer[") for d in flips)


def test_a_deterministic_alarm_cannot_roll_back_forever():
    """A guard limit below the healthy weights fires at every step: after one rollback the replayed step raises
    the same alarm, which marks it as not transient; the run must still end."""
    result = workbench.run(world_size=2, steps=30, eval_interval=30, detect=["guard"], detect_every=5,
                           guard_limit=0.05)
    assert result.completed
    actions = [e["detail"] for e in result.events if e["kind"] == "recovered"]
    assert any("not transient" in a for a in actions)


def _slots(guard: float = 0.0, spike: float = 0.0, digests: list[float] | None = None):
    import torch

    from workbench.rank.soft_errors import ALARM_SLOTS
    values = [guard, spike] + (digests or [])
    return torch.tensor(values + [0.0] * (ALARM_SLOTS - len(values)))


def test_guard_reads_a_steps_alarms_and_gradient_peaks_in_one_settle():
    import torch

    from workbench.config.run import RunConfig
    from workbench.rank.soft_errors import Detected, Detectors

    model = torch.nn.Linear(4, 2)
    detectors = Detectors(RunConfig(detect=["guard", "spike"], guard_limit=100.0), model)
    detectors.local_alarms(0.5)
    detectors.note_reduced(torch.tensor([1.0, -3.0]), ["fc.weight"])
    detectors.note_reduced(torch.tensor([float("nan")]), ["fc.bias"])
    with pytest.raises(Detected, match="gradient in fc.bias at step 7"):
        detectors.settle(7, _slots(), 2)
    assert detectors.pending == []  # settled: the next step starts clean
    detectors.note_reduced(torch.tensor([-50.0, 99.0]), ["fc.weight"])
    detectors.note_reduced(torch.full((1000,), 99.0), ["fc.bias"])  # a sum of squares far beyond 100^2 ...
    detectors.settle(8, _slots(), 2)  # ... but no value beyond the limit: no alarm
    with pytest.raises(Detected, match="loss spike on 2 rank"):
        detectors.settle(8, _slots(spike=2.0), 2)
    detectors.note_reduced(torch.tensor([-5.0, 1e5]), ["fc.weight"])
    with pytest.raises(Detected, match="> 100 gradient in fc.weight"):
        detectors.settle(8, _slots(), 2)
    detectors.note_reduced(torch.tensor([-5.0, float("inf")]), ["fc.weight"])
    with pytest.raises(Detected, match="> 100 gradient in fc.weight"):
        detectors.settle(8, _slots(), 2)
    detectors.suppressed.add(9)
    detectors.settle(9, _slots(guard=1.0), 2)  # a step whose alarm repeated on replay is let through
    assert detectors.weights_alarm() == 0.0
    with torch.no_grad():
        model.weight[0, 0] = 1e6
    assert detectors.weights_alarm() == 1.0
    assert detectors.local_alarms(0.5)[0] == 0.0  # weights are checked only every detect_every steps ...
    detectors.check_weights_next()
    assert detectors.local_alarms(0.5)[0] == 1.0  # ... in the guard slot of the step after a snapshot
    assert detectors.local_alarms(0.5)[0] == 0.0


def test_fingerprint_digests_in_the_alarm_slots_tell_whether_all_replicas_agree():
    """Summed over the members, n * sum(h^2) == sum(h)^2 exactly when every member sent the same digest h; a
    member that sent none (zeros) differs from every digest (they are 1..256)."""
    import torch

    from workbench.config.run import RunConfig
    from workbench.rank.soft_errors import Detectors

    torch.manual_seed(0)
    replicas = [torch.nn.Linear(8, 4) for _ in range(3)]
    for model in replicas[1:]:
        model.load_state_dict(replicas[0].state_dict())
    detectors = [Detectors(RunConfig(detect=["fingerprint"]), m) for m in replicas]

    def summed(due: list[bool]) -> torch.Tensor:
        for d, on in zip(detectors, due):
            if on:
                d.check_fingerprint_next()
        return sum(torch.tensor(d.local_alarms(0.5), dtype=torch.float32) for d in detectors)

    assert summed([False] * 3).sum() == 0  # no check due: nothing to compare
    detectors[0].settle(1, summed([True] * 3), 3)
    assert detectors[0].diverged is False
    detectors[0].settle(2, summed([True, True, False]), 3)  # one replica did not fingerprint
    assert detectors[0].diverged is True
    with torch.no_grad():
        replicas[2].weight.view(-1)[5] = torch.nextafter(replicas[2].weight.view(-1)[5], torch.tensor(1.0))
    detectors[0].settle(3, summed([True] * 3), 3)  # one ulp on one replica
    assert detectors[0].diverged is True
    detectors[0].forget_due_checks()
    assert detectors[0].diverged is False
