"""Pipeline, hybrid and gossip modes in one process (ranks as threads): schedules, exactness, configuration; each
mode one object (workbench/base/modes.py), its name compared nowhere else."""

import copy
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from ranks_in_threads import run_ranks
from structure_tool import comparisons

from workbench.base import modes
from workbench.base.errors import ConfigError
from workbench.config.run import PARALLELISMS, FaultSpec, RunConfig
from workbench.faults.targets import check_flip_targets
from workbench.rank.base import BaseTrainer
from workbench.rank.gossip import GossipSchedule, PairExchange
from workbench.rank.gradient_exchange import ring_allreduce_traffic
from workbench.rank.main import trainer_class
from workbench.rank.pipeline import Layout, StagePipeline
from workbench.workloads.data import LocalPartition, checksum_of, sample_checksum
from workbench.workloads.models import boundary_shapes, cnn, mlp, split_stages, stage_module
from workbench.workloads.stages import check_model

# -- gossip -------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("size", [2, 3, 4, 5, 8])
def test_every_gossip_round_is_a_matching(size):
    schedule = GossipSchedule(size, seed=3)
    for step in range(schedule.cycle_steps + 3):
        for r in range(size):
            q = schedule.partner(step, r)
            if q is None:
                assert size & (size - 1), "with a power of two every member has a partner"
                continue
            assert q != r and schedule.partner(step, q) == r


def test_gossip_partners_are_the_cube_then_rotate():
    schedule = GossipSchedule(8, seed=0)
    assert [schedule.partner(h, 5) for h in range(3)] == [5 ^ 1, 5 ^ 2, 5 ^ 4]  # first cycle: rank XOR 2^h
    met = {schedule.partner(t, 5) for t in range(schedule.cycle_steps)}
    assert met == set(range(8)) - {5}, "over the rotation a rank meets every other"
    assert [schedule.partner(t, 0) for t in range(3, 6)] != [1, 2, 4], "the second cycle uses another order"


@pytest.mark.parametrize("size", [2, 4, 8])
@pytest.mark.parametrize("cycle", [0, 1])  # the identity order, then a rotated one
def test_one_cube_cycle_without_updates_gives_the_global_mean(size, cycle):
    generator = torch.Generator().manual_seed(7)
    values = [torch.randn(1000, generator=generator) for _ in range(size)]
    mean = torch.stack([v.double() for v in values]).mean(0)
    schedule = GossipSchedule(size, seed=1)
    start = cycle * schedule.k

    def body(comm):
        state = {"v": values[comm.rank].clone()}
        exchange = PairExchange(comm, lambda: state["v"].clone(), lambda flat: state.update(v=flat.clone()))
        for step in range(start, start + schedule.k):
            exchange.start(schedule.partner(step, comm.rank))
            exchange.finish()
        return state["v"]

    results = run_ranks(size, body)
    for r in results:
        assert torch.equal(r, results[0]), "every replica holds bitwise the same average"
        assert torch.allclose(r.double(), mean, atol=1e-6)


def test_overlapped_average_keeps_the_local_update():
    update = torch.full((4,), 0.25)

    def body(comm):
        state = {"v": torch.full((4,), float(comm.rank))}
        exchange = PairExchange(comm, lambda: state["v"].clone(), lambda flat: state.update(v=flat.clone()))
        exchange.start(1 - comm.rank)
        state["v"] = state["v"] - update * (comm.rank + 1)  # each side's own step while the exchange runs
        exchange.finish()
        return state["v"]

    zero, one = run_ranks(2, body)
    assert torch.allclose(zero, 0.5 - update) and torch.allclose(one, 0.5 - 2 * update)


def test_ring_shuffle_moves_batches_and_keeps_every_sample():
    size, n = 4, 200
    parts = [LocalPartition(n, r, size, batch=8, seed=0, generation=0) for r in range(size)]
    initial = [set(p.pool.tolist()) for p in parts]
    assert sorted(i for s in initial for i in s) == list(range(n))
    for _ in range(30):
        batches = [p.next_batch() for p in parts]
        for r, p in enumerate(parts):
            p.replace(batches[(r - 1) % size])  # the left neighbour's batch comes in
    assert sorted(np.concatenate([p.pool for p in parts]).tolist()) == list(range(n)), "no sample lost or doubled"
    assert all(set(p.pool.tolist()) != initial[r] for r, p in enumerate(parts)), "partitions mixed"


def test_traffic_counts():
    assert ring_allreduce_traffic([4000], 1) == (0, 0)
    assert ring_allreduce_traffic([4000], 4) == (6, 6000)
    assert ring_allreduce_traffic([4000, 400], 2) == (4, 4400)


# -- pipeline ------------------------------------------------------------------------------------------------------


def test_stage_split_is_balanced_and_keeps_names():
    model = mlp((8, 8), 10, (128, 64))
    assert split_stages(model, 2) == [["flatten", "fc1", "relu1"], ["fc2", "relu2", "fc3"]]
    stage = stage_module(model, ["fc2", "relu2", "fc3"])
    assert [n for n, _ in stage.named_parameters()] == ["fc2.weight", "fc2.bias", "fc3.weight", "fc3.bias"]
    assert len(split_stages(cnn((8, 8), 10), 4)) == 4
    with pytest.raises(ConfigError, match="too few for 4 pipeline stages"):
        split_stages(model, 4)


def _pipeline_grads(config, members, model, x, y, micro_batches):
    names = split_stages(model, config.pipeline_stages)
    shapes = boundary_shapes(model, names, x)
    batch = len(y)
    lanes = [np.array_split(lane, micro_batches) for lane in np.array_split(np.arange(batch), config.replicas)]

    def body(comm):
        layout = Layout(config, members, comm.rank)
        stage = stage_module(copy.deepcopy(model), names[layout.stage])
        same_stage = layout.stage_members[layout.stage]
        stage_comm = comm.subgroup(f"stage{layout.stage}", layout.stage_rank, len(same_stage))
        comm.prepare_links(layout.peers())
        in_shape = shapes[layout.stage - 1] if layout.stage else tuple(x.shape[1:])
        pipe = StagePipeline(stage, layout, comm, in_shape, shapes[layout.stage])
        stats = comm.allreduce_now(pipe.forward_backward(x, y, lanes, 1.0 / batch, np.arange(batch) * 7))
        for p in stage.parameters():
            stage_comm.allreduce_now(p.grad)
        return stats, {n: p.grad for n, p in stage.named_parameters()}

    return run_ranks(len(members), body)


@pytest.mark.parametrize("parallelism,world,stages,members", [
    ("pipeline", 2, None, [0, 1]),
    ("pipeline", 3, None, [0, 1, 2]),
    ("hybrid", 4, 2, [0, 1, 2, 3]),
    ("hybrid", 4, 2, [0, 1, 2]),  # rank 3 gone: its stage-1 lane moved to rank 2, nothing dropped
])
def test_pipeline_gradients_equal_the_single_process_model(parallelism, world, stages, members):
    torch.manual_seed(0)
    model = mlp((8, 8), 10, (32, 32, 16))
    x, y = torch.rand(24, 8, 8), torch.randint(0, 10, (24,))
    config = RunConfig(world_size=world, parallelism=parallelism, pipeline_stages=stages, batch_size=24,
                       micro_batches=3)
    reference = copy.deepcopy(model)
    (F.cross_entropy(reference(x), y, reduction="sum") / len(y)).backward()
    results = _pipeline_grads(config, members, model, x, y, 3)
    seen = set()
    for stats, grads in results:
        assert stats[2].item() == len(y)  # every sample reached the loss exactly once
        assert checksum_of(stats[2:].tolist()) == sample_checksum(np.arange(len(y)) * 7)  # with its own id
        for name, grad in grads.items():
            expected = dict(reference.named_parameters())[name].grad
            assert torch.allclose(grad, expected, atol=1e-6), name
            seen.add(name)
    assert seen == {n for n, _ in reference.named_parameters()}


@pytest.mark.parametrize("parallelism,world,stages", [("pipeline", 2, None), ("pipeline", 4, None),
                                                      ("hybrid", 4, 2)])
def test_with_batch_norm_pipeline_gradients_equal_the_model_run_micro_batch_by_micro_batch(parallelism, world,
                                                                                            stages):
    """GPipe with batch norm: each micro-batch is normalised with its own statistics, so the pipeline's gradient is
    the single-process model's accumulated over the same micro-batches (each loss / global batch), not the
    whole-batch gradient."""
    from workbench.workloads.architectures import resnet20

    torch.manual_seed(0)
    model = resnet20((3, 8, 8), 10)
    x, y = torch.randn(24, 3, 8, 8), torch.randint(0, 10, (24,))
    config = RunConfig(world_size=world, parallelism=parallelism, pipeline_stages=stages, batch_size=24,
                       micro_batches=3)
    micro = [m for lane in np.array_split(np.arange(24), config.replicas) for m in np.array_split(lane, 3)]
    by_micro, whole = copy.deepcopy(model), copy.deepcopy(model)
    for index in micro:
        (F.cross_entropy(by_micro(x[index]), y[index], reduction="sum") / len(y)).backward()
    (F.cross_entropy(whole(x), y, reduction="sum") / len(y)).backward()
    results = _pipeline_grads(config, list(range(world)), model, x, y, 3)
    seen, expected, batch_grads = set(), dict(by_micro.named_parameters()), dict(whole.named_parameters())
    for stats, grads in results:
        assert stats[2].item() == len(y)
        for name, grad in grads.items():
            assert torch.allclose(grad, expected[name].grad, atol=1e-5), name
            seen.add(name)
    assert seen == set(expected)
    assert not torch.allclose(expected["conv1.weight"].grad, batch_grads["conv1.weight"].grad, atol=1e-5)


# -- configuration -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("values,message", [
    ({"parallelism": "gossip", "world_size": 3}, "3 is not a power of two"),
    ({"parallelism": "pipeline", "world_size": 2, "strategy": "shrink"}, "a dead stage cannot be shrunk away"),
    ({"parallelism": "pipeline", "world_size": 2, "strategy": "rollback"}, "allowed none, checkpoint_restart"),
    ({"parallelism": "gossip", "world_size": 4, "strategy": "rollback"}, "no collective step to roll back"),
    ({"parallelism": "hybrid", "world_size": 4, "pipeline_stages": 3}, "do not replicate over world_size=4"),
    ({"parallelism": "hybrid", "world_size": 2, "pipeline_stages": 2}, "at least 2 replicas"),
    ({"parallelism": "pipeline", "world_size": 2, "micro_batches": 100}, "do not fit the 64 samples"),
    ({"parallelism": "pipeline", "world_size": 2, "detect": ["guard"]}, "detectors watch data-parallel"),
    ({"parallelism": "data", "pipeline_stages": 2}, "applies to parallelism 'hybrid'"),
    ({"parallelism": "data", "faults": ["flip:target=weight,stage=0,tensor=fc1.weight,step=1"]}, "has no stages"),
    ({"parallelism": "ring"}, "allowed data, pipeline, gossip, hybrid"),
])
def test_bad_parallel_settings_are_refused(values, message):
    with pytest.raises(ConfigError, match=message):
        RunConfig(**values)


def test_stage_flips_resolve_to_the_stage_rank():
    config = RunConfig(world_size=4, parallelism="hybrid", pipeline_stages=2, faults=[
        "flip:target=activation,stage=0,step=3,index=1,bit=30", "flip:target=weight,stage=1,tensor=fc3.weight,step=2"])
    assert [f.rank for f in config.faults] == [0, 2]
    assert FaultSpec.parse(str(config.faults[0])) == config.faults[0]
    check_flip_targets(config, config.faults)
    with pytest.raises(ConfigError, match="not a parameter of the model on stage 0"):
        check_flip_targets(config, [FaultSpec.parse("flip:target=weight,rank=1,tensor=fc3.weight,step=2")])
    with pytest.raises(ConfigError, match="rank 0 holds stage 0, not stage 1"):
        RunConfig(world_size=4, parallelism="hybrid", faults=["flip:target=weight,rank=0,stage=1,tensor=x,step=1"])


def test_a_model_too_small_for_the_stages_is_refused_before_start():
    with pytest.raises(ConfigError, match="too few for 4 pipeline stages"):
        check_model(RunConfig(world_size=4, parallelism="pipeline"))


# -- each mode one object -----------------------------------------------------------------------------------------
ROOT = Path(__file__).resolve().parents[1]
ROOM = ROOT / "workbench" / "config" / "modes.py"


def test_every_mode_is_one_frozen_object_that_the_configuration_and_the_ranks_ask():
    assert PARALLELISMS == tuple(modes.REGISTRY) == ("data", "pipeline", "gossip", "hybrid")
    for name, mode in modes.REGISTRY.items():
        assert modes.get(name) is mode and mode.name == name and mode.summary
        with pytest.raises(AttributeError):
            mode.name = "other"  # frozen
        config = RunConfig(parallelism=name, world_size=4)
        assert config.mode is mode
        assert issubclass(trainer_class(config), BaseTrainer)
        assert mode.lanes <= mode.staged and mode.resizes == (mode.no_resize is None)
    assert [m.name for m in modes.REGISTRY.values() if m.staged] == ["pipeline", "hybrid"]
    assert modes.said(lambda m: m.staged) == "'hybrid' or 'pipeline'"
    resizing = modes.said(lambda m: m.resizes, "and", lanes=" (whole lanes)")
    assert resizing == "'data', 'gossip' and 'hybrid' (whole lanes)"
    with pytest.raises(ConfigError, match=r"^parallelism: 'ring' is not known: allowed data, pipeline, gossip, hybrid"):
        modes.get("ring")


def _mode_comparisons(path: Path, root: Path = ROOT) -> list[str]:
    return comparisons("a parallel mode", path, root)  # tools/check_structure.py's rule, run on one file


def test_no_parallel_mode_is_compared_by_name_outside_its_room():
    files = [p for p in sorted((ROOT / "workbench").rglob("*.py")) if p != ROOM]
    assert len(files) > 50
    offenders = [hit for path in files for hit in _mode_comparisons(path)]
    assert offenders == [], "ask the mode's object: RunConfig.mode (workbench/base/modes.py)"


def test_the_scan_finds_a_planted_comparison(tmp_path):
    planted = tmp_path / "planted.py"
    planted.write_text('def f(config, mode, e, name):\n    a = config.parallelism == "pipeline", mode in ("gossip", '
                       '"hybrid")\n    b = config.parallelism not in ("data",), e["kind"] == "gossip"\n'
                       '    return name == "data", e["parallelism"] != "hybrid"\n')
    hits = _mode_comparisons(planted, tmp_path)
    assert len(hits) == 4 and not any('"kind"' in hit or "name ==" in hit for hit in hits)
