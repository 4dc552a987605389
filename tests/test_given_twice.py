"""A key given twice is refused, in one line naming it, in every form that takes settings: a ``--config`` YAML in
block or flow style (a fault's mapping among them), a fault string (a planned fault, a random failure process),
an apoptosis string, ``registry.yaml``, a sweep's grid file and a ``-p`` value; never the last value taken."""

import re
from pathlib import Path

import pytest
from test_bad_meetings import cli

from workbench.base.errors import ConfigError, SweepError
from workbench.campaigns.reproduce import registry
from workbench.campaigns.reproduce.registry import RegistryError
from workbench.config.files import DuplicateKeyError, load_yaml
from workbench.faults.spec import parse_fault
from workbench.launch.sweeps.run import grid_points, parse_value
from workbench.workloads.apoptosis.rule import ApoptosisConfig

ROOT = Path(__file__).resolve().parent.parent
TINY = ["--dataset", "synthetic", "--world-size", "2", "--hidden", "16", "--eval-interval", "1000", "--steps", "5"]


def refused_by_the_cli(capsys, tmp_path, argv, needle):
    code, out, err = cli(capsys, "run", *TINY, *argv, "--out", str(tmp_path / "run"))
    assert code == 2 and out == "" and "Traceback" not in err, (code, err)
    assert len(err.strip().splitlines()) == 1 and needle in err, err
    assert not (tmp_path / "run").exists()  # refused before anything started


@pytest.mark.parametrize("text,needle", [
    ("{world_size: 2, steps: 20, world_size: 3}\n",
     "names 'world_size' twice (both on line 1): give each setting once"),
    ("world_size: 2\nfaults: [{kind: kill, rank: 1, step: 5, rank: 0}]\n",
     "names 'rank' twice (both on line 2): give each setting once"),
    ("world_size: 2\nfaults:\n  - kind: kill\n    rank: 1\n    step: 3\n    rank: 0\n",
     "names 'rank' twice (lines 4 and 6)"),
    ("steps: 5\nworld_size: 2\nsteps: 7\n", "names 'steps' twice (lines 1 and 3)"),
], ids=["flow mapping", "a fault's flow mapping", "a fault's block mapping", "block mapping"])
def test_a_config_file_giving_a_key_twice_is_refused(tmp_path, capsys, text, needle):
    (tmp_path / "twice.yaml").write_text(text)
    refused_by_the_cli(capsys, tmp_path, ["--config", str(tmp_path / "twice.yaml")], f"config: '{tmp_path}/twice."
                       f"yaml' {needle}")


@pytest.mark.parametrize("fault,needle", [
    ("kill:rank=0,step=3,step=4", "fault: step= is given twice in 'kill:rank=0,step=3,step=4': give each key once"),
    ("kill:rank=0,rank=1,step=3", "fault: rank= is given twice in 'kill:rank=0,rank=1,step=3'"),
    ("random:mtbf_steps=5,seed=1,seed=2", "fault: seed= is given twice in 'random:mtbf_steps=5,seed=1,seed=2'"),
])
def test_a_fault_string_giving_a_key_twice_is_refused(tmp_path, capsys, fault, needle):
    refused_by_the_cli(capsys, tmp_path, ["--fault", fault], needle)
    with pytest.raises(ConfigError, match=re.escape(needle)):
        parse_fault(fault)


def test_an_apoptosis_string_giving_a_key_twice_is_refused(tmp_path, capsys):
    needle = "apoptosis: tol= is given twice in 'tol=0.02,tol=0.03': give each key once"
    refused_by_the_cli(capsys, tmp_path, ["--apoptosis", "tol=0.02,tol=0.03"], needle)
    with pytest.raises(ConfigError, match=re.escape(needle)):
        ApoptosisConfig.parse("tol=0.02,tol=0.03")


def test_a_finding_giving_its_margin_twice_is_refused_by_the_registry(tmp_path):
    text = registry.REGISTRY_FILE.read_text()
    line = "        margin: 1.0\n"
    assert line in text
    at = text.index(line) + len(line)
    path = tmp_path / "registry.yaml"
    path.write_text(text[:at] + "        margin: 3.0\n" + text[at:])
    first = text[:at].count("\n")
    with pytest.raises(RegistryError) as caught:
        registry.load(path)
    assert str(caught.value) == f"{path}: names 'margin' twice (lines {first} and {first + 1}): give each key once"
    path.write_text(text)
    assert registry.load(path).findings  # the committed registry, copied, loads


def test_a_flow_mapping_in_the_registry_giving_a_key_twice_is_refused(tmp_path):
    path = tmp_path / "registry.yaml"
    path.write_text("alpha: 0.025\npapers: {a: {workload: {}, findings: [{id: x, margin: 0, margin: 1}]}}\n")
    with pytest.raises(RegistryError, match=r"names 'margin' twice \(both on line 2\)"):
        registry.load(path)


def test_a_grid_file_or_a_sweep_value_giving_a_key_twice_is_refused(tmp_path):
    (tmp_path / "grid.yaml").write_text("- {lr: 0.1, lr: 0.2}\n")
    with pytest.raises(SweepError, match=r"grid file .*grid.yaml' names 'lr' twice \(both on line 1\)"):
        grid_points(grid=tmp_path / "grid.yaml")
    with pytest.raises(SweepError, match=r"value '\{a: 1, a: 2\}' names 'a' twice"):
        parse_value("{a: 1, a: 2}")


def test_the_strict_reader_reads_everything_else_as_safe_load_does():
    import yaml

    for text in ["a: {x: 1, y: [1, {x: 2}]}\nb: [{x: 1}, {x: 1}]\n", "base: &b {x: 1, y: 2}\nc:\n  <<: *b\n  x: 3\n",
                 "", "- 1\n- 1\n", "{1: a, '1': b}"]:
        assert load_yaml(text) == yaml.safe_load(text), text
    with pytest.raises(DuplicateKeyError, match="names 'x' twice"):
        load_yaml("a: [{x: 1,\n  x: 2}]")


def test_every_yaml_the_package_reads_goes_through_the_strict_reader():
    """The one reader: no other place of the package calls PyYAML's loaders."""
    calls = [f"{path.relative_to(ROOT)}: {line.strip()}" for path in sorted((ROOT / "workbench").rglob("*.py"))
             for line in path.read_text().splitlines()
             if re.search(r"yaml\.(safe_load|load|full_load|unsafe_load|load_all|safe_load_all)\(", line)]
    assert calls == ["workbench/config/files.py: return yaml.load(text, Loader=_strict_loader())  # a SafeLoader"], \
        calls
