"""Every fault strategy that applies to the pipeline, hybrid and gossip modes, on small multi-process runs."""

import json
import math

import pytest
from planting import run_planted, sitecustomize

import workbench
from workbench.base import checkpoint
from workbench.config.run import RunConfig
from workbench.results.run_result import RunResult
from workbench.workloads.models import build_model

pytestmark = pytest.mark.usefixtures("no_leaks")

STEPS = 60


def final_weights(result):
    return checkpoint.load(result.summary["final_checkpoint"]).model


def max_diff(a, b):
    assert a.keys() == b.keys()
    return max((a[k] - b[k]).abs().max().item() for k in a)


def completed(tmp_path, **settings):
    result = workbench.run(**{"steps": STEPS, "eval_interval": 30, **settings}, out=tmp_path)
    assert result.completed, result.summary["reason"]
    return result


# -- pipeline: a stage has no copy, only restarts recover it -------------------------------------------------------

@pytest.fixture(scope="module")
def pipeline_golden(tmp_path_factory):
    return completed(tmp_path_factory.mktemp("pipeline"), world_size=2, parallelism="pipeline")


@pytest.mark.parametrize("strategy,redone", [("checkpoint_restart", 40 - 25), ("reinit", 40 - 25)])
def test_pipeline_restarts_redo_the_steps_since_the_snapshot_exactly(pipeline_golden, tmp_path, strategy, redone):
    result = completed(tmp_path, world_size=2, parallelism="pipeline", strategy=strategy, checkpoint_every=25,
                       faults=["kill:rank=1,step=40"])
    assert [f["steps_redone"] for f in result.failures] == [redone]
    assert result.summary["world_size_final"] == 2
    # the checkpoints gather every stage: the final one holds the whole model, equal to the no-fault run's
    weights = final_weights(result)
    assert set(weights) == {f"fc{i}.{k}" for i in (1, 2, 3) for k in ("weight", "bias")}
    assert max_diff(weights, final_weights(pipeline_golden)) == 0.0


def test_pipeline_takes_flips_into_boundary_activations_and_stage_weights(tmp_path):
    # the cut pinned (flatten fc1 relu1 | fc2 relu2 fc3): a measured one follows the machine's load
    result = completed(tmp_path, world_size=2, parallelism="pipeline", steps=10, stage_cuts=[3], faults=[
        "flip:target=activation,stage=0,step=3,index=5,bit=30",
        "flip:target=weight,stage=1,tensor=fc3.weight,step=4,index=0,bit=22"])
    flips = sorted((e["step"], e["rank"], e["detail"].split(" bit")[0]) for e in result.events if e["kind"] == "flip")
    assert flips == [(3, 0, "activation relu1:output[5]"), (4, 1, "weight fc3.weight[0]")]


def test_pipeline_refuses_shrink_before_starting():
    with pytest.raises(workbench.ConfigError, match="a dead stage cannot be shrunk away"):
        workbench.run(world_size=2, parallelism="pipeline", strategy="shrink")


# -- hybrid: replicated stages shrink inside their stage ----------------------------------------------------------

@pytest.fixture(scope="module")
def hybrid_golden(tmp_path_factory):
    return completed(tmp_path_factory.mktemp("hybrid"), world_size=4, parallelism="hybrid", pipeline_stages=2)


def test_hybrid_shrinks_a_stage_replica_and_regrows_it_without_losing_a_sample(hybrid_golden, tmp_path):
    result = completed(tmp_path, world_size=4, parallelism="hybrid", pipeline_stages=2, strategy="shrink",
                       regrow=True, faults=["kill:rank=3,step=30"])
    (failure,) = result.failures
    assert failure["samples_lost"] == 0 and result.summary["world_size_final"] == 4
    assert result.summary["replicas_identical"]  # each stage's replicas agree bitwise
    assert any(e["kind"] == "spare" for e in result.events)
    # the replacement received its stage only (parameters and momentum as raw buffers), not the whole model
    whole = 2 * 4 * sum(t.numel() for t in final_weights(result).values())
    assert 0 < failure["bytes_moved"] < whole
    # the failed step was redone by the survivors: the same training as without the fault, up to summation order
    assert max_diff(final_weights(result), final_weights(hybrid_golden)) < 1e-5


def test_hybrid_without_regrow_keeps_the_pipeline_running_on_fewer_replicas(tmp_path):
    result = completed(tmp_path, world_size=4, parallelism="hybrid", pipeline_stages=2, strategy="shrink",
                       faults=["kill:rank=2,step=30"])
    assert result.summary["world_size_final"] == 3
    assert all(r["samples"] == 64 for r in result.metrics), "every step still trains on the whole global batch"


def test_hybrid_losing_a_stage_s_last_replica_ends_with_the_reason(tmp_path):
    result = workbench.run(world_size=4, steps=STEPS, parallelism="hybrid", pipeline_stages=2, strategy="shrink",
                           faults=["kill:rank=3,step=20", "kill:rank=2,step=40"], out=tmp_path)
    assert result.outcome == "failed"
    assert "the last replica of pipeline stage 1" in result.summary["reason"]


def test_hybrid_reinit_restores_the_world(hybrid_golden, tmp_path):
    result = completed(tmp_path, world_size=4, parallelism="hybrid", pipeline_stages=2, strategy="reinit",
                       checkpoint_every=20, faults=["kill:rank=1,step=30"])
    assert result.summary["world_size_final"] == 4 and result.failures[0]["steps_redone"] == 10
    assert [r["step"] for r in result.metrics] == [*range(30), *range(20, STEPS)]
    # the snapshot's parameters, the same data and world: the redone steps end where the no-fault run ends
    assert max_diff(final_weights(result), final_weights(hybrid_golden)) == 0.0


# -- gossip ------------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def gossip_golden(tmp_path_factory):
    return {world: completed(tmp_path_factory.mktemp(f"gossip{world}"), world_size=world, parallelism="gossip")
            for world in (2, 4)}


def before(result, step, keys=("loss", "consensus_distance", "samples")):
    """The figures of the first ``step`` rows (the steps before a fault at ``step``, none redone yet)."""
    return [(r["step"], *(r[k] for k in keys)) for r in result.metrics[:step]]


def test_gossip_shrink_goes_on_with_three_and_says_how(gossip_golden, tmp_path):
    result = completed(tmp_path, world_size=4, parallelism="gossip", strategy="shrink", faults=["kill:rank=3,step=30"])
    assert result.summary["world_size_final"] == 3
    assert any(e["kind"] == "gossip" and "3 members gossip on a 4-slot hypercube" in e["detail"]
               for e in result.events)
    # up to the kill the four replicas are the failure-free run's: the same distances, bitwise
    assert before(result, 30) == before(gossip_golden[4], 30) and len(before(result, 30)) == 30
    # after it, three replicas that differ by design (each trains on its own partition): finite, above zero
    after = [r["consensus_distance"] for r in result.metrics if r["step"] >= 30]
    assert len(after) >= STEPS - 31 and all(math.isfinite(d) and d > 0 for d in after), after
    # O(1): the exchange (2 half-messages) and the shuffle whatever the world size; an idle member only shuffles
    assert {r["messages"] for r in result.metrics} <= {1, 3}


JOINS = sitecustomize('''\
"""Put by tests/test_parallel_runs.py into every gossip rank: after each join, a line per member to
$WORKBENCH_TEST_JOINS/<pid>.jsonl with its label, generation, step and state before and after the join (SHA-256
of every tensor the join compares and moves: parameters, buffers, optimizer history), whether it had trained."""
import hashlib, json, os

TARGET = "workbench.rank.gossip"


def digest(trainer):
    sha = hashlib.sha256()
    for name, tensor in trainer._named_state():
        sha.update(name.encode())
        sha.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return sha.hexdigest()


def plant(module):
    join = module.GossipTrainer.join

    def observed_join(self, a):
        before, step, trained = digest(self), self.step, self.trained
        join(self, a)
        record = {"label": a["members"][self.comm.rank], "rank": self.comm.rank, "gen": self.comm.gen,
                  "trained": trained, "step_before": step, "step": self.step, "before": before, "after": digest(self)}
        with open(os.path.join(os.environ["WORKBENCH_TEST_JOINS"], f"{os.getpid()}.jsonl"), "a") as f:
            f.write(json.dumps(record) + "\\n")

    module.GossipTrainer.join = observed_join
''')

GOSSIP_REGROW = f"""\
import json, sys
import workbench
result = workbench.run(world_size=4, steps={STEPS}, eval_interval=30, parallelism="gossip", strategy="shrink",
                       regrow=True, faults=["kill:rank=1,step=30"], out=sys.argv[1])
print(json.dumps({{"reason": result.summary["reason"]}}))
"""


def test_gossip_regrow_gives_the_replacement_a_peer_s_state(gossip_golden, tmp_path, monkeypatch):
    """The replacement of a gossip member takes the state of one survivor, the one the agreement names (the most
    advanced, the lowest rank on ties), bitwise: parameters, buffers and optimizer history; the survivors keep
    their own replicas, which differ from each other (so a copy of another, an average or a fresh state fails).
    Each member's state before and after the join is read in the ranks themselves (the run records no
    replica but rank 0's)."""
    joins = tmp_path / "joins"
    joins.mkdir()
    monkeypatch.setenv("WORKBENCH_TEST_JOINS", str(joins))
    run_planted(GOSSIP_REGROW, tmp_path, JOINS, timeout=240)
    result = RunResult.load(tmp_path / "runs")
    assert result.completed, result.summary["reason"]
    assert result.summary["world_size_final"] == 4
    assert before(result, 30) == before(gossip_golden[4], 30) and len(before(result, 30)) == 30
    assert result.failures[0]["steps_redone"] == 0 and result.failures[0]["samples_lost"] == 64 // 4
    assert result.summary["final_test_accuracy"] > 0.8
    # raw buffers to the newcomer only: one replica's parameters and momentum (fp32), no pickle, no survivor
    params = sum(p.numel() for p in build_model(RunConfig(), (64,), 10).parameters())  # the digits MLP
    assert result.failures[0]["bytes_moved"] == 2 * 4 * params

    records = [json.loads(line) for path in joins.glob("*.jsonl") for line in path.read_text().splitlines()]
    (gen,) = {r["gen"] for r in records if r["gen"] > 0 and not r["trained"]}  # the one join with a newcomer
    members = sorted((r for r in records if r["gen"] == gen), key=lambda r: r["rank"])
    assert [r["label"] for r in members] == [0, 1, 2, 3], members
    (newcomer,) = [r for r in members if not r["trained"]]
    survivors = [r for r in members if r["trained"]]
    assert newcomer["label"] == 1 and len(survivors) == 3
    # the agreement's source: the highest score (a survivor's step + 1; a newcomer's 0), the lowest rank on ties
    source = max(survivors, key=lambda r: (r["step_before"], -r["rank"]))
    assert newcomer["after"] == source["after"] and newcomer["before"] != source["after"]
    assert all(r["after"] == r["before"] for r in survivors)  # the survivors keep their replicas ...
    assert len({r["after"] for r in survivors}) == 3  # ... which differ: only one of them is the newcomer's
    assert {r["step"] for r in members} == {source["step_before"]}  # every member at the source's step
    # the run's own record: the newcomer said it joined that generation at that step, having received the state
    (joined,) = [e for e in result.events if e["kind"] == "joined" and e["rank"] == 1
                 and e["detail"].startswith(f"generation {gen}:")]
    assert joined["step"] == source["step_before"] and "received" in joined["detail"], joined


@pytest.mark.parametrize("strategy", ["checkpoint_restart", "reinit"])
def test_gossip_restarts(gossip_golden, tmp_path, strategy):
    result = completed(tmp_path, world_size=2, parallelism="gossip", strategy=strategy, checkpoint_every=20,
                       faults=["kill:rank=1,step=30"])
    assert result.summary["world_size_final"] == 2 and result.failures[0]["steps_redone"] == 10
    assert [r["step"] for r in result.metrics] == [*range(30), *range(20, STEPS)]
    # up to the kill, the failure-free run bitwise; a restart then gives every member the source's replica (and
    # a new generation's partitions), so the replicas start the redone steps equal: by design not the no-fault run
    assert before(result, 30) == before(gossip_golden[2], 30)
    redone = [r["consensus_distance"] for r in result.metrics][30:]
    assert redone[0] < before(gossip_golden[2], 21)[20][2], redone[:3]  # a step after the replicas were made equal
