"""The correctness claims of the recovery strategies (docs/permanent-faults.md), each on a small multi-process run."""

import pytest

import workbench
from workbench.base import checkpoint
from workbench.rank.gradient_exchange import bucket_layout
from workbench.workloads.models import mlp

pytestmark = pytest.mark.usefixtures("no_leaks")

WORLD, STEPS, KILL = 4, 160, 100
BATCH = 64
SHARE = BATCH // WORLD  # rank 2's share of the global batch at world 4
# the default layout of the digits MLP (backward order): fc3 and fc2 in bucket 0, fc1 in bucket 1. A planned kill
# fires just before the last bucket is launched: bucket 0 is applied (from every share) when rank 2 dies, and the
# survivors finish bucket 1 (fc1) with their own shares
_PARAMS = list(mlp((1, 8, 8), 10).named_parameters())[::-1]
BUCKETS = [[_PARAMS[i][0] for i in group] for group in bucket_layout([p.numel() for _, p in _PARAMS], None, 1.0)]
assert BUCKETS == [["fc3.bias", "fc3.weight", "fc2.bias", "fc2.weight"], ["fc1.bias", "fc1.weight"]]
APPLIED_AT_FAULT = [name for bucket in BUCKETS[:-1] for name in bucket]


def final_weights(result):
    return checkpoint.load(result.summary["final_checkpoint"]).model


def max_diff(a, b):
    return max((a[k] - b[k]).abs().max().item() for k in a)


@pytest.fixture(scope="module")
def golden(tmp_path_factory):
    result = workbench.run(world_size=WORLD, steps=STEPS, eval_interval=STEPS, out=tmp_path_factory.mktemp("golden"))
    assert result.completed
    return result


@pytest.fixture(scope="module")
def killed(tmp_path_factory):
    """One run per strategy with the same kill (rank 2 at step KILL), made once for the tests that compare them."""
    runs = {}

    def get(strategy):
        if strategy not in runs:
            runs[strategy] = faulty(strategy, tmp_path_factory.mktemp(strategy))
        return runs[strategy]

    return get


def faulty(strategy, tmp_path, *faults, **extra):
    result = workbench.run(world_size=WORLD, steps=STEPS, eval_interval=STEPS, strategy=strategy, out=tmp_path,
                           faults=list(faults) or [f"kill:rank=2,step={KILL}"], **extra)
    assert result.completed, result.summary["reason"]
    assert result.summary["replicas_identical"]
    return result


def test_rollback_loses_nothing_and_matches_the_no_fault_run(golden, killed):
    result = killed("rollback")
    (failure,) = result.failures
    assert failure["samples_lost"] == 0 and failure["steps_redone"] == 0 and failure["world_size_after"] == 3
    assert all(row["samples"] == BATCH for row in result.metrics)
    # the survivors redid the whole global batch: same parameters as the run without a fault, up to float order
    assert max_diff(final_weights(result), final_weights(golden)) < 1e-5


@pytest.mark.parametrize("strategy", ["forward", "shrink"])
def test_forward_and_shrink_lose_exactly_the_dead_ranks_share(strategy, golden, killed):
    result = killed(strategy)
    (failure,) = result.failures
    assert failure["samples_lost"] == SHARE and failure["steps_redone"] == 0
    samples = {row["step"]: row["samples"] for row in result.metrics}
    # the samples whose gradients entered the whole update, which the last bucket carries: forward applied bucket 0
    # from every share before the fault, but the survivors finished bucket 1 without the dead share; shrink redid
    # the whole exchange without it
    assert samples[KILL] == BATCH - SHARE
    assert all(n == BATCH for s, n in samples.items() if s != KILL)
    assert [row["step"] for row in result.metrics] == list(range(STEPS))  # no step redone or skipped
    assert result.summary["world_size_final"] == 3
    assert max_diff(final_weights(result), final_weights(golden)) > 1e-3  # the lost share shows


def test_forward_and_shrink_end_apart_after_the_same_kill(golden, killed):
    forward, shrink = final_weights(killed("forward")), final_weights(killed("shrink"))
    assert max_diff(forward, shrink) > 1e-3  # forward kept bucket 0's full-batch update of the failed step
    assert max_diff(forward, final_weights(golden)) > 1e-3 and max_diff(shrink, final_weights(golden)) > 1e-3


@pytest.mark.parametrize("strategy", ["forward", "shrink", "rollback"])
def test_at_the_last_step_forward_keeps_the_applied_buckets_and_loses_the_rest(strategy, golden, tmp_path):
    """Kill at the last step, so the failed step's update is what the final weights show: forward's bucket 0
    (applied before the fault, from all 4 shares) equals the no-fault run's and bucket 1 does not; shrink applies
    nothing before the whole exchange, so every parameter shows the lost share; rollback redoes the whole batch."""
    result = faulty(strategy, tmp_path, f"kill:rank=2,step={STEPS - 1}")
    assert result.failures[0]["samples_lost"] == (0 if strategy == "rollback" else SHARE)
    ours, reference = final_weights(result), final_weights(golden)
    diff = {name: (ours[name] - reference[name]).abs().max().item() for name, _ in _PARAMS}
    if strategy == "forward":
        assert all(diff[name] < 1e-6 for name in APPLIED_AT_FAULT), diff
        assert all(diff[name] > 1e-5 for name in BUCKETS[-1]), diff
    elif strategy == "shrink":
        assert all(d > 1e-5 for d in diff.values()), diff
    else:
        assert all(d < 1e-5 for d in diff.values()), diff


def test_checkpoint_restart_redoes_exactly_the_steps_since_the_checkpoint(tmp_path):
    result = faulty("checkpoint_restart", tmp_path, checkpoint_every=30)
    (failure,) = result.failures
    assert failure["steps_redone"] == KILL - 90 and failure["samples_lost"] == 0 and failure["world_size_after"] == 4
    steps = [row["step"] for row in result.metrics]
    assert steps == list(range(KILL)) + list(range(90, STEPS))
    assert result.summary["world_size_final"] == 4
    assert sorted(p.name for p in (tmp_path / "checkpoints").glob("step_*.h5")) == [
        "step_000030.h5", "step_000060.h5", "step_000090.h5", "step_000120.h5", "step_000150.h5"]
    assert checkpoint.verify(tmp_path / "checkpoints" / "step_000090.h5") == []


@pytest.mark.parametrize("spawn", ["template", "fresh"])
def test_a_planned_kill_of_the_writer_lets_the_checkpoint_of_its_step_finish(spawn, tmp_path):
    """Rank 0 writes the checkpoint of step 10 and is killed in step 10: the restart starts from it, whatever
    the disk's speed (it was 0 or 5 steps redone from one run to the next)."""
    result = workbench.run(world_size=2, steps=20, strategy="checkpoint_restart", checkpoint_every=5, spawn=spawn,
                           faults=["kill:rank=0,step=10"], out=tmp_path)
    assert result.completed, result.summary["reason"]
    assert [f["steps_redone"] for f in result.failures] == [0]


def test_reinit_returns_everyone_to_the_last_snapshot(golden, tmp_path):
    result = faulty("reinit", tmp_path, checkpoint_every=30)
    (failure,) = result.failures
    assert failure["steps_redone"] == KILL - 90
    assert [row["step"] for row in result.metrics] == list(range(KILL)) + list(range(90, STEPS))
    assert result.summary["world_size_final"] == 4 and failure["samples_lost"] == 0
    # same data, same world size after the restart: the run ends where the no-fault run ends
    assert max_diff(final_weights(result), final_weights(golden)) < 1e-5


def test_reinit_before_the_first_snapshot_returns_to_the_initial_state(golden, tmp_path):
    """A kill before the first snapshot step: the initial state is the snapshot (survivors must not keep the step
    they were in, half applied, and redo it on top)."""
    result = faulty("reinit", tmp_path, "kill:rank=1,step=5", checkpoint_every=50)
    (failure,) = result.failures
    assert failure["steps_redone"] == 5
    assert [row["step"] for row in result.metrics] == list(range(5)) + list(range(STEPS))
    assert max_diff(final_weights(result), final_weights(golden)) < 1e-5


@pytest.mark.parametrize("kill", [0, 5])
def test_gossip_reinit_before_the_first_snapshot_starts_again_from_step_0(kill, tmp_path):
    result = workbench.run(world_size=4, steps=20, parallelism="gossip", strategy="reinit", checkpoint_every=10,
                           faults=[f"kill:rank=1,step={kill}"], out=tmp_path)
    assert result.completed, result.summary["reason"]
    (failure,) = result.failures
    assert failure["steps_redone"] == kill
    assert [row["step"] for row in result.metrics] == list(range(kill)) + list(range(20))


def test_regrow_any_rank_twice_including_rank_0(tmp_path):
    result = faulty("shrink", tmp_path, "kill:rank=0,step=40", "kill:rank=0,step=120", regrow=True,
                    warm_spares=2)
    assert [f["rank"] for f in result.failures] == [0, 0]
    assert all(f["world_size_after"] == 4 for f in result.failures)
    assert result.summary["world_size_final"] == 4


def test_random_failures_are_reproducible_and_survived(tmp_path):
    spec = "random:mtbf_steps=60,dist=weibull,shape=1.5,seed=3,max=2"
    result = faulty("rollback", tmp_path, spec, regrow=True)
    drawn = workbench.RunConfig(steps=STEPS, faults=[spec]).random_failures
    assert [f["step"] for f in result.failures] == [step for step, _ in drawn] and len(drawn) == 2
    assert result.summary["samples_lost_total"] == 0
