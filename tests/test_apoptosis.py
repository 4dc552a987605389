"""Adaptive neuron apoptosis: the spec, the rule, the shrinking (in-process), and a few multi-process runs that
remove units and then survive a failure with the shrunk shapes."""

import copy
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import workbench
from workbench import ConfigError, RunConfig
from workbench.base import checkpoint
from workbench.results.run_result import model_size
from workbench.workloads.apoptosis import rule as apo
from workbench.workloads.models import cnn, mlp


# -- the spec -------------------------------------------------------------------------------------------------------
def test_spec_forms_and_canonical_text():
    assert apo.ApoptosisConfig.parse("off") is None and apo.ApoptosisConfig.parse(None) is None
    assert apo.ApoptosisConfig.parse("on") == apo.ApoptosisConfig() == apo.ApoptosisConfig.parse(True)
    rule = apo.ApoptosisConfig.parse("tol=0.01, window=3,delta=0.005")
    assert (rule.tol, rule.window, rule.delta, rule.lasso) == (0.01, 3, 0.005, apo.ApoptosisConfig().lasso)
    assert apo.ApoptosisConfig.parse(str(rule)) == rule == apo.ApoptosisConfig.parse({"tol": 0.01, "window": 3,
                                                                                     "delta": 0.005})
    config = RunConfig(apoptosis="window=3")
    assert config.apoptosis == str(apo.ApoptosisConfig(window=3)) and config.apoptosis_rule.window == 3
    assert RunConfig.from_dict(config.to_dict()).apoptosis == config.apoptosis
    assert RunConfig(apoptosis="off").apoptosis is None and RunConfig().apoptosis_rule is None


@pytest.mark.parametrize("spec,needle", [
    ("tol=abc", "tol='abc' is not a number"),
    ("speed=2", "'speed' is not a setting: allowed tol, window, delta"),
    ("window=0", "window=0 must be an integer >= 1"),
    ("window=1.5", "not an integer"),
    ("delta=1.5", "delta=1.5 must be a fraction"),
    ("tol", "is not key=value"),
])
def test_bad_spec_names_the_setting(spec, needle):
    with pytest.raises(ConfigError) as info:
        RunConfig(apoptosis=spec)
    assert info.value.field == "apoptosis" and needle in str(info.value)


@pytest.mark.parametrize("mode,extra", [("pipeline", {}), ("gossip", {}), ("hybrid", {"world_size": 4})])
def test_refused_outside_data_parallelism(mode, extra):
    with pytest.raises(ConfigError, match="parallelism 'data' only"):
        RunConfig(**{"world_size": 2, "parallelism": mode, "apoptosis": "on", **extra})


def test_models_it_cannot_shrink_are_refused_before_start():
    with pytest.raises(ConfigError, match="cannot shrink this model"):
        apo.require_pairs(nn.Sequential(nn.Flatten(), nn.Linear(64, 10)))
    with pytest.raises(ConfigError, match="cannot shrink"):
        workbench.start(model="user_code:Broken", apoptosis="on", world_size=1)


def test_cli_flag_reaches_the_config():
    from workbench.launch.cli import _config_from_args, build_parser

    args = build_parser().parse_args(["run", "--apoptosis", "tol=0.01,window=3"])
    rule = _config_from_args(args).apoptosis_rule
    assert (rule.tol, rule.window) == (0.01, 3)
    assert _config_from_args(build_parser().parse_args(["run", "--apoptosis", "off"])).apoptosis is None


# -- which units exist ---------------------------------------------------------------------------------------------
def test_pairs_of_the_mlp_and_the_cnn():
    assert [(p.layer, p.consumer) for p in apo.find_pairs(mlp((1, 8, 8), 10))] == [("fc1", "fc2"), ("fc2", "fc3")]
    model = cnn((1, 8, 8), 10)
    pairs = apo.find_pairs(model)
    assert [(p.layer, p.consumer) for p in pairs] == [("1", "3"), ("3", "7"), ("7", "9")]
    assert [p.block(model) for p in pairs] == [1, 16, 1]  # a conv channel feeds 4x4 positions of the Linear
    assert apo.hidden_units(model) == 16 + 32 + 64


# -- shrinking -------------------------------------------------------------------------------------------------------
def silence(model, pairs, removals):
    """Zero the removed units' incoming and outgoing weights: they then contribute nothing, now or after a step."""
    with torch.no_grad():
        for pair in pairs:
            gone = removals.get(pair.layer)
            if gone is None:
                continue
            producer, consumer = pair.producer_module(model), pair.consumer_module(model)
            producer.weight[gone] = 0
            producer.bias[gone] = 0
            block = pair.block(model)
            view = consumer.weight.view(consumer.weight.shape[0], producer.weight.shape[0], block, -1)
            view[:, gone] = 0


@pytest.mark.parametrize("build,removals", [
    (lambda: mlp((1, 8, 8), 10), {"fc1": torch.tensor([0, 5, 127]), "fc2": torch.tensor([3, 4])}),
    (lambda: cnn((1, 8, 8), 10), {"1": torch.tensor([2, 7]), "3": torch.tensor([0, 31]), "7": torch.tensor([1])}),
])
def test_shrink_keeps_the_function_of_the_remaining_units(build, removals):
    torch.manual_seed(0)
    model = build()
    pairs = apo.find_pairs(model)
    silence(model, pairs, removals)
    x = torch.rand(32, 1, 8, 8)
    before = model(x)
    widths = {p.layer: p.units(model) for p in pairs}
    params = apo.parameter_count(model)
    apo.shrink(model, pairs, removals)
    torch.testing.assert_close(model(x), before, rtol=1e-5, atol=1e-6)
    assert {p.layer: p.units(model) for p in pairs} == {k: w - len(removals.get(k, [])) for k, w in widths.items()}
    assert apo.parameter_count(model) < params
    # a full-size model (a fresh rank) takes the shrunk shapes from the state alone
    fresh = build()
    assert apo.resize_to(fresh, {k: v.shape for k, v in model.state_dict().items()})
    fresh.load_state_dict(model.state_dict())
    torch.testing.assert_close(fresh(x), before, rtol=1e-5, atol=1e-6)
    assert not apo.resize_to(fresh, {k: v.shape for k, v in model.state_dict().items()})


@pytest.mark.parametrize("kind", ["sgd", "adam"])
def test_optimizer_state_is_sliced_with_the_units(kind):
    """Removed units silenced from the start: one more step of the shrunk model (with its sliced momentum or Adam
    moments) equals that step of the full model on the kept weights."""
    torch.manual_seed(0)
    full = mlp((1, 8, 8), 10)
    pairs = apo.find_pairs(full)
    removals = {"fc1": torch.tensor([1, 2, 90]), "fc2": torch.tensor([0, 63])}
    silence(full, pairs, removals)
    make = (lambda ps: torch.optim.Adam(ps, lr=0.01)) if kind == "adam" else \
        (lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9))
    optimizer = make(full.parameters())
    x, y = torch.rand(16, 1, 8, 8), torch.randint(0, 10, (16,))

    def step(model, opt):
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()

    step(full, optimizer)
    small = copy.deepcopy(full)
    named = dict(full.named_parameters())
    state = {n: {k: v.clone() for k, v in optimizer.state[p].items()} for n, p in named.items()}
    sliced = apo.shrink(small, pairs, removals, state)
    assert sliced["fc2.weight"]["exp_avg" if kind == "adam" else "momentum_buffer"].shape == small.fc2.weight.shape
    if kind == "adam":
        assert sliced["fc1.weight"]["step"].item() == 1  # scalars are not sliced
    small_optimizer = make(small.parameters())
    for n, p in small.named_parameters():
        small_optimizer.state[p] = sliced[n]
    step(full, optimizer)
    step(small, small_optimizer)
    plan = apo.slice_plan(full, pairs, removals)
    expected = apo.apply_plan(full.state_dict(), plan)
    for name, value in small.state_dict().items():
        torch.testing.assert_close(value, expected[name], rtol=1e-5, atol=1e-7)


# -- the rule --------------------------------------------------------------------------------------------------------
def norms_of(values):
    return {layer: (torch.tensor(v, dtype=torch.float64), torch.tensor(v, dtype=torch.float64))
            for layer, v in values.items()}


def test_rule_counts_consecutive_strikes_adapts_tau_and_keeps_a_minimum():
    rule = apo.Apoptosis(apo.ApoptosisConfig(tol=0.1, window=2, delta=0.02, grow=2.0, shrink=0.5, min=2),
                         {"a": 4, "b": 3})
    low = norms_of({"a": [0.01, 0.01, 0.5, 0.01], "b": [0.01, 0.01, 0.01]})
    gone = rule.observe(low, accuracy=0.9)
    assert rule.tau == 0.2 and all(len(g) == 0 for g in gone.values())  # one strike is not enough
    gone = rule.observe(norms_of({"a": [0.01, 0.5, 0.5, 0.01], "b": [0.01, 0.02, 0.03]}), accuracy=0.95)
    assert rule.tau == 0.4 and gone["a"].tolist() == [0, 3]  # unit 1 lost its strike when it rose above tau
    assert gone["b"].tolist() == [0]  # 3 due, but min=2 allows one removal: the weakest
    assert rule.strikes["a"].tolist() == [2, 0, 0, 2]
    packed = rule.pack(gone)
    twin = apo.Apoptosis(rule.config, {"a": 4, "b": 3})
    assert {k: v.tolist() for k, v in twin.unpack(packed).items()} == {k: v.tolist() for k, v in gone.items()}
    assert twin.tau == rule.tau and twin.best == rule.best and twin.strikes["a"].tolist() == [2, 0, 0, 2]
    rule.forget(gone)
    assert rule.strikes["a"].tolist() == [0, 0] and rule.strikes["b"].tolist() == [2, 2]
    rule.observe(norms_of({"a": [1.0, 1.0], "b": [1.0, 1.0]}), accuracy=0.90)  # fell more than delta below 0.95
    assert rule.tau == 0.2 and rule.best == 0.95
    restored = apo.Apoptosis(rule.config, {"a": 2, "b": 2})
    restored.load_state_dict(rule.state_dict())
    assert restored.pack().tolist() == rule.pack().tolist()


def test_min_units_keeps_the_strongest_of_the_due():
    rule = apo.Apoptosis(apo.ApoptosisConfig(tol=1.0, window=1, grow=1.0, min=2), {"a": 4})
    gone = rule.observe(norms_of({"a": [0.3, 0.1, 0.2, 0.4]}), accuracy=0.5)
    assert gone["a"].tolist() == [1, 2]


def test_group_lasso_kills_weak_units_spares_strong_ones_deterministically():
    torch.manual_seed(0)
    model = mlp((1, 8, 8), 10)
    pairs = apo.find_pairs(model)
    with torch.no_grad():
        model.fc1.weight[3] *= 1e-3
        model.fc1.bias[3] = 0
    twin = copy.deepcopy(model)
    before = model.fc1.weight.detach().clone()
    apo.group_lasso_(model, pairs, strength=0.05, lr=0.05, gamma=2.0)
    apo.group_lasso_(twin, pairs, strength=0.05, lr=0.05, gamma=2.0)
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), twin.state_dict().values()))
    assert model.fc1.weight[3].abs().max().item() == 0 and model.fc1.bias[3].item() == 0
    change = (model.fc1.weight - before).norm(dim=1) / before.norm(dim=1)
    assert change[torch.arange(128) != 3].max().item() < 0.1
    every = apo.PRESSURE_EVERY
    rule = apo.ApoptosisConfig(lasso=0.01, start=0.1, until=0.5)
    steps = apo.LASSO_STEPS
    assert rule.pressure_due(0, steps) == 0.0 or every == 1
    assert rule.pressure_due(159 - 159 % every + every - 1, steps) == pytest.approx(every * 0.01)


@pytest.mark.parametrize("steps", [37, 100, 400, 800, 1600])
def test_the_pressures_total_does_not_depend_on_the_run_length(steps):
    # `lasso` is stated for a LASSO_STEPS-step run: a longer run is pressed less per step, by the same total
    rule = apo.ApoptosisConfig(lasso=0.006, start=0.15, until=0.5)
    total = 0.006 * apo.LASSO_STEPS * (0.5 - 0.15)  # what a LASSO_STEPS-step run gets
    one_step = 0.006 * apo.LASSO_STEPS / steps  # the rounding of [start, until) to whole steps
    assert abs(sum(rule.pressure(s, steps) for s in range(steps)) - total) <= one_step + 1e-12
    # the lazy proximal steps apply the same total (the pressed span ends well before the last step)
    assert sum(rule.pressure_due(s, steps) for s in range(steps)) == pytest.approx(
        sum(rule.pressure(s, steps) for s in range(steps)))


def test_three_phases_learn_then_press_and_decide_then_fine_tune_on_every_sample():
    rule = apo.ApoptosisConfig(lasso=0.01, start=0.1, until=0.5, window=2)
    # no pressure while the network first learns, a constant one from start to until, none in the fine-tune
    per_step = 0.01 * apo.LASSO_STEPS / 100
    assert [rule.pressure(s, 100) for s in (0, 9, 10, 49, 50, 99)] == [0.0, 0.0, per_step, per_step, 0.0, 0.0]
    # decisions go on for `window` evaluations (of 10 steps) after the pressure ends, never at the last one
    assert [rule.deciding(s, 100, 10) for s in (10, 50, 70, 71, 100)] == [True, True, True, False, False]
    assert [rule.folded(s, 100, 10) for s in (69, 70, 99)] == [False, True, True]
    assert not apo.ApoptosisConfig(fold=0).folded(99, 100, 10)
    with pytest.raises(ConfigError, match="until=0.1 must be a fraction in .start=0.2"):
        apo.ApoptosisConfig(start=0.2, until=0.1)
    with pytest.raises(ConfigError, match="fold=2 must be 0 or 1"):
        apo.ApoptosisConfig(fold=2)


def test_a_units_contribution_is_the_geometric_mean_of_its_incoming_and_outgoing_norms():
    rule = apo.Apoptosis(apo.ApoptosisConfig(tol=0.1, window=1, grow=1.0, min=1), {"a": 4})
    incoming = torch.tensor([0.0, 0.05, 0.02, 0.5], dtype=torch.float64)
    outgoing = torch.tensor([0.9, 0.05, 2.0, 0.5], dtype=torch.float64)
    gone = rule.observe({"a": (incoming, outgoing)}, accuracy=0.5)
    # unit 0 outputs nothing (no incoming weight), however strongly it is read: it goes; unit 2's incoming norm is
    # below unit 1's, but it is read 40x as strongly: sqrt(0.02 * 2.0) = 0.2 > tau, it stays; unit 1 goes
    assert gone["a"].tolist() == [0, 1]


# -- the validation split, then every sample ------------------------------------------------------------------------
def test_the_validation_split_folds_back_into_training_and_out_again():
    from workbench.workloads.data import load_dataset

    plain, carved = load_dataset(RunConfig()), load_dataset(RunConfig(apoptosis="on"))
    held_out = carved.x_val.clone()
    assert carved.fold_validation(True) and carved.x_val is None and not carved.fold_validation(True)
    assert len(carved.y_train) == len(plain.y_train)
    def rows(x):
        return sorted(map(tuple, x.flatten(1).tolist()))

    assert rows(carved.x_train) == rows(plain.x_train)  # every training sample again, the held-out ones included
    assert carved.fold_validation(False) and torch.equal(carved.x_val, held_out)
    assert len(carved.y_train) == len(plain.y_train) - len(held_out)
    assert not plain.fold_validation(True) and plain.x_val is None  # nothing carved, nothing to fold


# -- state that travels ---------------------------------------------------------------------------------------------
def test_checkpoint_keeps_shrunk_shapes_and_the_rule_state(tmp_path):
    torch.manual_seed(0)
    model = mlp((1, 8, 8), 10)
    pairs = apo.find_pairs(model)
    apo.shrink(model, pairs, {"fc1": torch.arange(100)})
    rule = apo.Apoptosis(apo.ApoptosisConfig(), {"fc1": 28, "fc2": 64})
    rule.observe(apo.unit_norms(model, pairs), 0.8)
    path = checkpoint.save(tmp_path / "c.h5", checkpoint.Checkpoint(5, model.state_dict(), {}, None,
                                                                     apoptosis=rule.state_dict()))
    assert not any(d.startswith("apoptosis") for d in checkpoint.datasets(path))  # an attribute, not a dataset
    loaded = checkpoint.load(path)
    assert loaded.model["fc1.weight"].shape == (28, 64)
    twin = apo.Apoptosis(apo.ApoptosisConfig(), {"fc1": 28, "fc2": 64})
    twin.load_state_dict(loaded.apoptosis)
    assert twin.pack().tolist() == rule.pack().tolist()


def test_summary_sizes_from_the_rows():
    rows = [{"hidden_units": 192, "parameters": 17226}, {"hidden_units": 192, "parameters": 17226},
            {"hidden_units": 60, "parameters": 5000}, {"hidden_units": math.nan, "parameters": math.nan}]
    assert model_size(rows) == {"hidden_units": {"start": 192, "end": 60}, "parameters": {"start": 17226,
                                                                                           "end": 5000}}
    assert model_size([{"step": 0}]) == {"hidden_units": None, "parameters": None}


# -- the validation split the rule decides on ------------------------------------------------------------------------
def test_apoptosis_holds_out_a_validation_split_of_the_training_data_never_the_test_set():
    from workbench.workloads.data import load_dataset

    plain = load_dataset(RunConfig())
    carved = load_dataset(RunConfig(apoptosis="val=0.2"))
    assert plain.x_val is None
    n = len(plain.y_train)
    assert len(carved.y_val) == round(0.2 * n) and len(carved.y_train) == n - len(carved.y_val)
    assert torch.equal(carved.x_test, plain.x_test)  # the test set is untouched
    rows = {tuple(r.tolist()) for r in plain.x_train.flatten(1)}
    val_rows = {tuple(r.tolist()) for r in carved.x_val.flatten(1)}
    train_rows = {tuple(r.tolist()) for r in carved.x_train.flatten(1)}
    assert val_rows <= rows and not val_rows & train_rows  # carved out of training, and training never sees it
    again = load_dataset(RunConfig(apoptosis="val=0.2", seed=7))
    assert torch.equal(again.x_val, carved.x_val)  # the same split for every seed: seeds compare like with like
    with pytest.raises(ConfigError, match="val=0.9"):
        RunConfig(apoptosis="val=0.9")


def test_an_image_dataset_validation_split_is_normalised_like_the_test_set():
    from workbench.workloads.datasets import synthetic_image

    data = synthetic_image(200)
    data.carve_validation(0.25)
    assert data.x_val.dtype == torch.float32 and data.x_train.dtype == torch.uint8 and len(data.y_val) == 50
    assert abs(data.x_val.mean().item()) < 0.5  # normalised per channel, as x_test is


def test_the_rule_reads_the_validation_accuracy_that_every_evaluation_reports():
    from workbench.rank.readings import evaluate

    data = load_dataset_with_val()
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 10))
    figures = evaluate(model, data)
    assert set(figures) == {"test_loss", "test_acc", "val_acc"} and 0 <= figures["val_acc"] <= 1


def load_dataset_with_val():
    from workbench.workloads.data import load_dataset

    return load_dataset(RunConfig(apoptosis="on"))


# -- multi-process runs ---------------------------------------------------------------------------------------------
FAST = "lasso=0.05,tol=0.005,window=1,start=0.05,until=0.5"  # units die and go within the first few evaluations


def removals_before(result, step):
    return [e for e in result.events if e["kind"] == "apoptosis" and e["step"] < step]


@pytest.mark.usefixtures("no_leaks")
def test_checkpoint_restart_after_a_removal_resumes_with_the_shrunk_shapes(tmp_path):
    result = workbench.run(world_size=2, steps=100, eval_interval=10, apoptosis=FAST, strategy="checkpoint_restart",
                           checkpoint_every=40, faults=["kill:rank=1,step=90"], out=tmp_path)
    assert result.completed, result.summary["reason"]
    summary = result.summary
    assert summary["replicas_identical"] and summary["failures"][0]["steps_redone"] == 10
    assert summary["hidden_units"]["end"] < summary["hidden_units"]["start"] == 192
    assert removals_before(result, 80), "no unit was removed before the checkpoint the restart resumes from"
    saved = checkpoint.load(tmp_path / "checkpoints" / "step_000080.h5")
    assert saved.model["fc1.weight"].shape[0] < 128 and saved.apoptosis
    final = checkpoint.load(summary["final_checkpoint"]).model
    assert sum(v.numel() for k, v in final.items()) == summary["parameters"]["end"]


@pytest.mark.usefixtures("no_leaks")
def test_a_warm_spare_regrows_into_the_shrunk_model(tmp_path):
    result = workbench.run(world_size=2, steps=100, eval_interval=10, apoptosis=FAST, strategy="rollback",
                           regrow=True, faults=["kill:rank=1,step=70"], out=tmp_path)
    assert result.completed, result.summary["reason"]
    summary = result.summary
    assert removals_before(result, 70) and summary["world_size_final"] == 2
    assert summary["failures"][0]["world_size_after"] == 2 and summary["failures"][0]["samples_lost"] == 0
    assert summary["replicas_identical"]  # the spare started full-size and now holds the same shrunk parameters
    assert summary["hidden_units"]["end"] < 192 and summary["parameters"]["end"] < summary["parameters"]["start"]
    evaluations = result.to_dataframe().dropna(subset=["test_acc"]).set_index("step")
    # the accuracy the rule decided on, reported beside the test accuracy while it decides (until step 50 + one
    # evaluation); then the split is training data again, and there is no validation accuracy to report
    assert evaluations.val_acc.loc[:59].notna().all() and evaluations.val_acc.loc[60:].isna().all()



# -- conv channels with batch norm ---------------------------------------------------------------------------------
def conv_bn_model():
    from collections import OrderedDict

    torch.manual_seed(0)
    return nn.Sequential(OrderedDict(
        conv1=nn.Conv2d(3, 8, 3, padding=1), bn1=nn.BatchNorm2d(8), relu1=nn.ReLU(), pool1=nn.MaxPool2d(2),
        conv2=nn.Conv2d(8, 16, 3, padding=1), bn2=nn.BatchNorm2d(16), relu2=nn.ReLU(),
        pool=nn.AdaptiveAvgPool2d(2), flatten=nn.Flatten(), fc=nn.Linear(64, 10)))


def test_a_conv_channel_goes_with_its_batch_norm_entries_and_the_consumer_inputs_that_read_it():
    model = conv_bn_model()
    model(torch.randn(16, 3, 8, 8))  # running statistics that differ per channel
    pairs = apo.find_pairs(model)
    assert [(p.layer, p.norm, p.consumer) for p in pairs] == [("conv1", "bn1", "conv2"), ("conv2", "bn2", "fc")]
    before = {k: v.clone() for k, v in model.state_dict().items()}
    momentum = {n: {"momentum_buffer": torch.full_like(p, i)} for i, (n, p) in enumerate(model.named_parameters())}
    state = apo.shrink(model, pairs, {"conv1": torch.tensor([2, 5]), "conv2": torch.tensor([0])}, momentum)
    after = model.state_dict()
    keep1, keep2 = [0, 1, 3, 4, 6, 7], list(range(1, 16))
    for name in ("bn1.weight", "bn1.bias", "bn1.running_mean", "bn1.running_var", "conv1.weight"):
        assert torch.equal(after[name], before[name][keep1]), name
    assert torch.equal(after["conv2.weight"], before["conv2.weight"][keep2][:, keep1])
    assert torch.equal(after["bn2.running_var"], before["bn2.running_var"][keep2])
    assert torch.equal(after["fc.weight"], before["fc.weight"].view(10, 16, 4)[:, keep2].reshape(10, 60))
    assert model.bn1.num_features == 6 and model.bn2.num_features == 15 and model.fc.in_features == 60
    assert torch.equal(state["bn1.weight"]["momentum_buffer"], momentum["bn1.weight"]["momentum_buffer"][keep1])
    assert int(after["bn1.num_batches_tracked"]) == 1


def test_removing_channels_whose_scale_and_shift_are_zero_leaves_the_function_unchanged():
    model = conv_bn_model()
    model(torch.randn(16, 3, 8, 8))
    with torch.no_grad():  # channels 1 and 6 of bn1 and 3 of bn2 are dead: γ = β = 0, output exactly 0
        for bn, dead in ((model.bn1, [1, 6]), (model.bn2, [3])):
            bn.weight[dead] = 0.0
            bn.bias[dead] = 0.0
    x = torch.randn(4, 3, 8, 8)
    model.eval()
    expected = model(x)
    norms = apo.unit_norms(model, apo.find_pairs(model))
    assert norms["conv1"][0][1] == 0 and norms["conv1"][0][0] > 0  # importance is the channel's γ and β
    apo.shrink(model, apo.find_pairs(model), {"conv1": torch.tensor([1, 6]), "conv2": torch.tensor([3])})
    assert torch.allclose(model(x), expected, atol=1e-6)


def test_a_shrunk_conv_bn_state_loads_into_a_full_size_model_and_lasso_zeroes_whole_groups():
    shrunk = conv_bn_model()
    apo.shrink(shrunk, apo.find_pairs(shrunk), {"conv1": torch.tensor([0, 1, 2])})
    full = conv_bn_model()
    assert apo.resize_to(full, {k: v.shape for k, v in shrunk.state_dict().items()})
    full.load_state_dict(shrunk.state_dict())
    assert full.bn1.num_features == 5 and full.conv2.in_channels == 5
    with torch.no_grad():
        full.bn1.weight[0], full.bn1.bias[0] = 1e-4, -1e-4  # a weak channel
    apo.group_lasso_(full, apo.find_pairs(full), strength=0.05, lr=0.05, gamma=2.0)
    assert full.bn1.weight[0] == 0 and full.bn1.bias[0] == 0 and (full.bn1.weight[1:] != 0).all()


def test_relative_pressure_takes_the_same_share_of_every_layer_whatever_its_scale():
    def shares(relative):
        torch.manual_seed(0)
        model = conv_bn_model()
        with torch.no_grad():
            for tensor in model.parameters():  # lift every group out of the lasso's zero
                tensor.copy_(1.0 + torch.rand_like(tensor))
            model.bn1.weight.mul_(20), model.bn1.bias.mul_(20)  # conv1's channels: 20 times the scale of the rest
        before = apo.unit_norms(model, apo.find_pairs(model))
        apo.group_lasso_(model, apo.find_pairs(model), strength=0.01, lr=1.0, relative=relative)
        after = apo.unit_norms(model, apo.find_pairs(model))
        return {layer: (1 - after[layer][0] / before[layer][0]).mean().item() for layer in before}

    absolute, relative = shares(False), shares(True)
    assert absolute["conv1"] < absolute["conv2"] / 10  # the same step is a small share of a large group
    assert relative["conv1"] == pytest.approx(relative["conv2"], rel=0.02)  # the same share of every layer
    assert relative["conv1"] == pytest.approx(0.01, rel=0.05)
    assert apo.ApoptosisConfig.parse("relative=1").relative == 1
    with pytest.raises(ConfigError, match="relative"):
        apo.ApoptosisConfig.parse("relative=2")


def test_residual_blocks_end_a_pair_and_resnets_are_refused_with_the_reason():
    from workbench.workloads.architectures import lenet5, resnet20

    assert apo.find_pairs(resnet20((3, 8, 8), 10)) == []
    with pytest.raises(ConfigError, match="cannot shrink"):
        apo.require_pairs(resnet20((3, 8, 8), 10))
    assert [p.norm for p in apo.find_pairs(lenet5((3, 32, 32), 10))][:2] == ["bn1", "bn2"]


def test_apoptosis_removes_conv_channels_of_lenet5_while_it_trains(tmp_path):
    result = workbench.run(world_size=2, steps=200, model="lenet5", apoptosis="on", out=tmp_path)
    assert result.completed and result.summary["replicas_identical"]
    assert result.summary["parameters"]["end"] < result.summary["parameters"]["start"] / 2
    state = checkpoint.load(result.summary["final_checkpoint"]).model
    assert state["bn1.running_var"].shape[0] == state["conv1.weight"].shape[0] == state["conv2.weight"].shape[1]
    assert result.summary["final_test_accuracy"] > 0.8
