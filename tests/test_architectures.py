"""The seed papers' models (workbench/workloads/architectures.py) and pipeline stages cut by measured cost."""

import pytest
import torch
from torch import nn

from workbench.base.errors import ConfigError
from workbench.config.run import RunConfig
from workbench.launch.cli import _config_from_args, build_parser
from workbench.workloads.architectures import ARCHITECTURES, BasicBlock, conv_bn_pairs
from workbench.workloads.models import (
    block_costs,
    build_model,
    cuts_of,
    mlp,
    run_stages,
    split_stages,
    stage_module,
    stages_from_cuts,
)
from workbench.workloads.stages import check_model, model_tensors

SHAPES = [(3, 32, 32), (1, 28, 28), (1, 8, 8)]
SMALL = {"vgg11": 0.25, "alexnet": 0.25}  # width for the tests that only need the structure


def _build(name, shape, seed=0, width=None, classes=10):
    config = RunConfig(model=name, seed=seed, width=width or SMALL.get(name, 1.0))
    return build_model(config, shape, classes)


# -- the models ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name,width,expected,tolerance", [
    ("lenet5", 1.0, 62_028, 0.0),        # LeNet-5 + batch norm
    ("alexnet", 1.0, 2.47e6, 0.01),      # pytorch-classification's CIFAR AlexNet (2.47M) + batch norm
    ("vgg11", 1.0, 9.23e6, 0.01),        # VGG-11 for CIFAR, one Linear
    ("vgg11", 0.25, 579_098, 0.0),
    ("resnet20", 1.0, 0.27e6, 0.02),     # He et al. 2016, option A
    ("resnet18", 1.0, 11.2e6, 0.03),     # CIFAR ResNet-18, option B
])
def test_parameter_counts(name, width, expected, tolerance):
    model = _build(name, (3, 32, 32), width=width)
    count = sum(p.numel() for p in model.parameters())
    assert abs(count - expected) <= tolerance * expected, count


@pytest.mark.parametrize("name", list(ARCHITECTURES))
@pytest.mark.parametrize("shape", SHAPES)
def test_output_shape_for_every_dataset_shape(name, shape):
    model = _build(name, shape, classes=7)
    assert model(torch.randn(2, *shape)).shape == (2, 7)


@pytest.mark.parametrize("name", list(ARCHITECTURES))
def test_sequential_of_named_blocks_with_batch_norm(name):
    model = _build(name, (3, 32, 32))
    assert isinstance(model, nn.Sequential)
    children = dict(model.named_children())
    assert list(children)[:3] == ["conv1", "bn1", "relu1"] and list(children)[-1].startswith("fc")
    assert "pool" in children and "flatten" in children
    assert all(isinstance(m, nn.BatchNorm2d) for n, m in children.items() if n.startswith("bn"))
    assert all(isinstance(m, BasicBlock) for n, m in children.items() if n.startswith("layer"))
    assert "conv1.weight" in dict(model.named_parameters())


def test_residual_blocks_are_children_and_shortcuts_follow_the_papers():
    r20, r18 = _build("resnet20", (3, 32, 32)), _build("resnet18", (3, 32, 32))
    assert [n for n in dict(r20.named_children()) if n.startswith("layer")] == \
        [f"layer{s}_{b}" for s in (1, 2, 3) for b in range(3)]
    assert isinstance(r20.layer2_0, BasicBlock) and not list(r20.layer2_0.shortcut.parameters())  # option A
    assert "layer2_0.bn1.running_var" in dict(r20.named_buffers())
    assert "layer2_0.shortcut.conv.weight" in dict(r18.named_parameters())  # option B
    assert r18.conv1.kernel_size == (3, 3) and not any(isinstance(m, nn.MaxPool2d) for m in r18.children())


def test_conv_bn_pairs_of_a_plain_chain():
    pairs = conv_bn_pairs(_build("vgg11", (3, 32, 32)))
    assert pairs[0] == ("conv1", "bn1", "conv2") and pairs[-1] == ("conv8", "bn8", "fc") and len(pairs) == 8
    assert conv_bn_pairs(_build("lenet5", (1, 8, 8)))[-1] == ("conv2", "bn2", "fc1")


@pytest.mark.parametrize("name", list(ARCHITECTURES))
def test_construction_is_deterministic_for_a_seed(name):
    a, b, c = (_build(name, (1, 8, 8), seed=s).state_dict() for s in (3, 3, 4))
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert any(not torch.equal(a[k], c[k]) for k in a if k.endswith("weight"))
    for m in _build(name, (1, 8, 8)).modules():
        if isinstance(m, nn.BatchNorm2d):
            assert torch.equal(m.weight, torch.ones_like(m.weight)) and not m.bias.any()


@pytest.mark.parametrize("name", list(ARCHITECTURES))
def test_forward_and_backward(name):
    model = _build(name, (1, 8, 8))
    loss = nn.functional.cross_entropy(model(torch.randn(4, 1, 8, 8)), torch.tensor([0, 1, 2, 3]))
    loss.backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())


def test_knobs_and_refusals():
    assert _build("vgg11", (3, 32, 32), width=0.5).conv1.out_channels == 32
    assert _build("alexnet", (3, 32, 32), width=0.5).conv5.out_channels == 128
    with pytest.raises(ConfigError, match="needs image inputs"):
        _build("resnet20", (64,))
    for width in (0, 5, True):
        with pytest.raises(ConfigError, match="width"):
            RunConfig(width=width)
    args = build_parser().parse_args(["run", "--model", "vgg11", "--width", "0.5", "--parallelism", "pipeline",
                                      "--world-size", "2", "--stage-cuts", "3"])
    config = _config_from_args(args)
    assert (config.model, config.width, config.stage_cuts) == ("vgg11", 0.5, [3])


# -- stages cut by measured cost -----------------------------------------------------------------------------------


def _chain(n):
    return nn.Sequential(*(nn.Linear(4, 4) for _ in range(n)))


@pytest.mark.parametrize("costs,stages,expected", [
    ([5, 1, 1, 1, 1, 5], 2, [3]),      # 7 | 7
    ([5, 1, 1, 1, 1, 5], 3, [1, 5]),   # 5 | 4 | 5 (equal parameters would cut [2, 4])
    ([1, 1, 1, 1, 1, 10], 2, [5]),
])
def test_split_by_costs_minimises_the_largest_stage(costs, stages, expected):
    model = _chain(len(costs))
    assert cuts_of(split_stages(model, stages, costs=costs)) == expected
    assert cuts_of(split_stages(model, 3)) == [2, 4]  # no costs: parameter counts


def test_parameter_free_modules_stay_with_their_layer():
    model = mlp((8, 8), 10, (128, 64))  # flatten fc1 relu1 fc2 relu2 fc3
    assert split_stages(model, 2, costs=[0, 4, 0.01, 4, 0.01, 1]) == \
        [["flatten", "fc1", "relu1"], ["fc2", "relu2", "fc3"]]
    with pytest.raises(ConfigError, match="too few for 4 pipeline stages"):
        split_stages(model, 4, costs=[1] * 6)


def test_block_costs_measure_every_child_without_side_effects():
    model = _build("resnet20", (3, 32, 32))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    rng = torch.get_rng_state()
    costs = block_costs(model, (3, 32, 32), repeats=2)
    names = [n for n, _ in model.named_children()]
    assert len(costs) == len(names) and all(c >= 0 for c in costs)
    assert costs[names.index("flatten")] < costs[names.index("layer3_0")]
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert all(p.grad is None for p in model.parameters()) and torch.equal(rng, torch.get_rng_state())


def test_cuts_give_the_stage_children():
    model = _build("resnet20", (1, 8, 8))
    config = RunConfig(model="resnet20", world_size=4, parallelism="hybrid", pipeline_stages=2, stage_cuts=[6])
    stages = run_stages(model, config)
    assert stages[0] == ["conv1", "bn1", "relu1", "layer1_0", "layer1_1", "layer1_2"]
    assert stages[1][0] == "layer2_0" and stages[1][-1] == "fc" and cuts_of(stages) == [6]
    pipeline = [stage_module(model, names) for names in stages]
    assert [n for n, _ in pipeline[1].named_children()] == stages[1]
    assert "layer2_0.bn1.running_var" in dict(pipeline[1].named_buffers())
    x = torch.randn(2, 1, 8, 8)
    model.eval()
    assert torch.equal(pipeline[1](pipeline[0](x)), model(x))  # the stages compose to the model
    for cuts, message in (([0], "increasing indices in 1..14"), ([15], "1..14"), ([2, 3], "stage 1 .relu1. without")):
        with pytest.raises(ConfigError, match=message):
            stages_from_cuts(model, cuts)


@pytest.mark.parametrize("values,message", [
    ({"stage_cuts": [3]}, "applies to parallelism 'hybrid' or 'pipeline'"),
    ({"parallelism": "pipeline", "world_size": 3, "stage_cuts": [3]}, "must be 2 increasing module indices"),
    ({"parallelism": "pipeline", "world_size": 3, "stage_cuts": [4, 3]}, "increasing"),
    ({"parallelism": "pipeline", "world_size": 2, "stage_cuts": [0]}, "> 0"),
])
def test_bad_stage_cuts_are_refused(values, message):
    with pytest.raises(ConfigError, match=message):
        RunConfig(**values)


def test_the_cut_is_measured_at_the_start_and_reaches_the_ranks():
    config = RunConfig(world_size=2, parallelism="pipeline", hidden=[64, 64, 32])
    started = check_model(config)  # what workbench.start hands the supervisor, which sends config.to_dict()
    assert config.stage_cuts is None and len(started.stage_cuts) == 1
    assert check_model(config).stage_cuts == started.stage_cuts  # measured once per model in this process
    received = RunConfig.from_dict(started.to_dict())  # what a rank builds (workbench/rank/main.py)
    assert received.stage_cuts == started.stage_cuts and received == started
    model = build_model(received, (1, 8, 8), 10)
    assert cuts_of(run_stages(model, received)) == started.stage_cuts
    given = check_model(config.replace(stage_cuts=[3]))
    assert given.stage_cuts == [3]
    params, _ = model_tensors(given, rank=1)
    assert sorted(params) == ["fc2.bias", "fc2.weight", "fc3.bias", "fc3.weight", "fc4.bias", "fc4.weight"]
    with pytest.raises(ConfigError, match="stage_cuts"):
        check_model(config.replace(stage_cuts=[9]))
