import pytest

from workbench import ConfigError, FaultSpec, RunConfig


def test_defaults_are_valid():
    config = RunConfig()
    assert config.world_size == 4 and config.strategy == "none"


@pytest.mark.parametrize("field,value,needle", [
    ("world_size", 0, "world_size: 0 is out of range: allowed integers 1..64"),
    ("world_size", 65, "1..64"),
    ("steps", -1, "steps"),
    ("lr", 0, "lr: 0 must be a number > 0"),
    ("model", "resnet999", "allowed mlp, cnn, lenet5, alexnet, vgg11, resnet20, resnet18, mnist1d_logistic, "
     "mnist1d_mlp, mnist1d_cnn, mnist1d_cnn_bn, mnist1d_gru, mnist1d_reference or an import path"),
    ("dataset", "imagenet", "allowed digits, synthetic"),
    ("strategy", "pray", "strategy: 'pray' is not known"),
    ("optimizer", "lbfgs", "allowed sgd, adam"),
])
def test_bad_field_names_field_and_allowed(field, value, needle):
    with pytest.raises(ConfigError) as info:
        RunConfig(**{field: value})
    assert info.value.field == field
    assert needle in str(info.value)


def test_batch_must_cover_every_rank():
    with pytest.raises(ConfigError, match="smaller than world_size"):
        RunConfig(world_size=8, batch_size=4)


@pytest.mark.parametrize("text,expected", [
    ("kill:rank=2,step=50", FaultSpec("kill", 2, step=50)),
    ("hang:rank=1,step=30", FaultSpec("hang", 1, step=30)),
    ("kill:rank=1,time=3.5", FaultSpec("kill", 1, time=3.5)),
])
def test_fault_text_form(text, expected):
    assert FaultSpec.parse(text) == expected
    assert FaultSpec.parse(str(expected)) == expected


@pytest.mark.parametrize("text,needle", [
    ("boom", "is not of the form"),
    ("explode:rank=1,step=2", "kind 'explode' is not known"),
    ("kill:rank=1", "exactly one of step=N or time=SECONDS"),
    ("kill:rank=1,step=2,time=3", "exactly one of"),
    ("kill:step=2", "names no rank"),
    ("kill:rank=x,step=2", "is not a number"),
    ("kill:rank=1,color=red", "is not one of"),
])
def test_bad_fault_text(text, needle):
    with pytest.raises(ConfigError, match=needle):
        FaultSpec.parse(text)


def test_fault_outside_world_or_run():
    with pytest.raises(ConfigError, match="targets rank 9 but world_size=4 has ranks 0..3"):
        RunConfig(world_size=4, faults=["kill:rank=9,step=1"])
    with pytest.raises(ConfigError, match="run has steps 0..99"):
        RunConfig(steps=100, faults=["kill:rank=1,step=100"])


def test_from_dict_papermill_style():
    config = RunConfig.from_dict({"world_size": 2, "lr": 1, "fault": "kill:rank=1,step=5", "faults": []})
    assert config.lr == 1.0 and isinstance(config.lr, float)
    assert config.faults == [FaultSpec("kill", 1, step=5)]
    assert RunConfig.from_dict({"faults": ""}).faults == []
    with pytest.raises(ConfigError, match="is not a run setting"):
        RunConfig.from_dict({"wolrd_size": 2})


def test_round_trip_through_dict():
    config = RunConfig(world_size=3, faults=["kill:rank=1,time=2"])
    assert RunConfig.from_dict(config.to_dict()) == config


def test_from_yaml(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("world_size: 2\nsteps: 10\nfaults:\n  - kill:rank=1,step=3\n  - {kind: hang, rank: 0, time: 1.5}\n")
    config = RunConfig.from_yaml(path)
    assert config.world_size == 2 and config.faults[1] == FaultSpec("hang", 0, time=1.5)
    (tmp_path / "bad.yaml").write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="mapping"):
        RunConfig.from_yaml(tmp_path / "bad.yaml")
    with pytest.raises(ConfigError, match="does not exist"):
        RunConfig.from_yaml(tmp_path / "missing.yaml")


def test_import_paths_checked_up_front():
    RunConfig(model="user_code:tiny_model", dataset="user_code:blobs")
    with pytest.raises(ConfigError, match="cannot import module 'no_such_module'"):
        RunConfig(model="no_such_module:f")
    with pytest.raises(ConfigError, match="has no attribute 'nothing'"):
        RunConfig(dataset="user_code:nothing")


def test_random_failures_parse_and_draw_reproducibly():
    from workbench.config.run import RandomFailures

    spec = RandomFailures.parse("random:mtbf_steps=50,dist=weibull,shape=2,seed=4,max=3")
    assert spec == RandomFailures(50.0, "weibull", 2.0, 4, 3)
    drawn = spec.draw(1000, world_size=4)
    assert drawn == spec.draw(1000, world_size=4) and len(drawn) == 3
    assert [s for s, _ in drawn] == sorted(s for s, _ in drawn) and all(0 <= k < 4 for _, k in drawn)
    assert RandomFailures(50.0, seed=5).draw(1000, 4) != RandomFailures(50.0, seed=6).draw(1000, 4)
    assert RandomFailures(1e6).draw(100, 4) == []
    config = RunConfig(steps=1000, faults=["random:mtbf_steps=50,seed=4,max=3"])
    assert len(config.random_failures) == 3
    with pytest.raises(ConfigError, match="dist='gauss' is not known"):
        RandomFailures.parse("random:mtbf_steps=5,dist=gauss")
    with pytest.raises(ConfigError, match="needs mtbf_steps"):
        RandomFailures.parse("random:seed=1")


def test_strategy_combinations():
    assert RunConfig(strategy="shrink", regrow=True).warm_spares == 1
    assert RunConfig(strategy="shrink", regrow=True, warm_spares=0).warm_spares == 0
    assert RunConfig(strategy="checkpoint_restart").checkpoint_every == 25
    with pytest.raises(ConfigError, match="regrow: combines with shrink, rollback, forward"):
        RunConfig(strategy="reinit", regrow=True)
    with pytest.raises(ConfigError, match="warm_spares"):
        RunConfig(strategy="none", warm_spares=2)
    with pytest.raises(ConfigError, match="resume: checkpoint 'nope.h5' does not exist"):
        RunConfig(resume="nope.h5")
