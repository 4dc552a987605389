"""A registered comparison runs only on a workload that can show an effect: the registry's ``workloads`` are each
converged, at least 5 pt below their ceiling, of small seed spread and quick enough for a campaign
(workbench/campaigns/reproduce/acceptance.py). Each criterion is planted as a miss and refused by ``registry.load``
with the measured figure; the committed entries carry their figures and pass."""

from __future__ import annotations

import copy

import pytest
import yaml

from workbench.campaigns.reproduce import acceptance, measure_workload, registry

GOOD = {"settings": {"model": "mnist1d_cnn", "dataset": "mnist1d", "world_size": 4, "steps": 2000},
        "measured": {"seeds": [0, 1, 2, 3, 4, 5], "finals": [0.90, 0.91, 0.905, 0.895, 0.90, 0.91],
                     "at_four_fifths": [0.899, 0.908, 0.904, 0.896, 0.899, 0.908], "run_minutes": 0.5,
                     "campaign_runs": 40, "source": "planted"}}


def _registry_with(tmp_path, entry: dict) -> str:
    data = yaml.safe_load(registry.REGISTRY_FILE.read_text())
    data["workloads"] = {**data["workloads"], "planted": entry}  # the committed ones stay: a study runs on one
    path = tmp_path / "registry.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return str(path)


def _planted(change) -> dict:  # noqa: ANN001 - a function that edits the entry
    entry = copy.deepcopy(GOOD)
    change(entry["measured"])
    return entry


def test_a_workload_that_meets_every_criterion_is_accepted(tmp_path):
    reg = registry.load(_registry_with(tmp_path, GOOD))
    figures = acceptance.check("planted", reg.workloads["planted"], reg.ceilings)
    assert figures["seeds"] == 6 and figures["campaign_minutes"] == 20.0
    assert figures["ceiling_gap_pt"] > 5


@pytest.mark.parametrize("change, says", [
    # (a) still climbing: the last fifth gains 2 pt
    (lambda m: m.update(at_four_fifths=[f - 0.02 for f in m["finals"]]), "not converged: the last fifth of the "
                                                                        "steps gains 2.00 pt"),
    # (b) at the ceiling: mnist1d's is measured near 98-99 %
    (lambda m: m.update(finals=[0.97] * 6, at_four_fifths=[0.97] * 6), "at the ceiling: 97.0 % is"),
    # (c) seeds spread 5 pt
    (lambda m: m.update(finals=[0.85, 0.95, 0.85, 0.95, 0.85, 0.95], at_four_fifths=[0.85, 0.95] * 3),
     "seeds spread 5.48 pt"),
    # (d) a campaign of 200 runs of half a minute
    (lambda m: m.update(campaign_runs=200), "its largest campaign takes 100 min"),
    # too few seeds to tell (c)
    (lambda m: m.update(seeds=[0, 1], finals=[0.9, 0.9], at_four_fifths=[0.9, 0.9]), "measured on 2 seeds"),
])
def test_a_planted_miss_of_each_criterion_is_refused_with_its_figure(tmp_path, change, says):
    with pytest.raises(registry.RegistryError) as refused:
        registry.load(_registry_with(tmp_path, _planted(change)))
    message = str(refused.value)
    assert "workload 'planted' cannot show an effect" in message and says in message
    assert "\n" not in message


def test_an_entry_without_measured_figures_or_ceiling_is_refused(tmp_path):
    with pytest.raises(registry.RegistryError, match="measured must hold"):
        registry.load(_registry_with(tmp_path, {"settings": GOOD["settings"]}))
    other = copy.deepcopy(GOOD)
    other["settings"]["dataset"] = "cifar10"
    with pytest.raises(registry.RegistryError, match="no ceiling is registered for 'cifar10'"):
        registry.load(_registry_with(tmp_path, other))


def test_while_measuring_only_the_settings_are_checked(tmp_path):
    path = _registry_with(tmp_path, {"settings": GOOD["settings"]})
    token = registry.MEASURING.set(True)
    try:
        assert "planted" in registry.load(path).workloads
    finally:
        registry.MEASURING.reset(token)


def test_every_committed_workload_carries_its_measured_figures_and_passes():
    reg = registry.load()
    assert reg.workloads, "the registry names no accepted workload"
    for name, entry in reg.workloads.items():
        figures = acceptance.check(name, entry, reg.ceilings)
        assert figures["seeds"] >= acceptance.MIN_SEEDS and entry["measured"]["source"]


def test_the_measuring_command_refuses_bad_input_in_one_line(capsys):
    assert measure_workload.main(["no_such_workload"]) == 2
    assert "no workload 'no_such_workload'" in capsys.readouterr().err
    name = next(iter(registry.load().workloads))
    assert measure_workload.main([name, "--seeds", "2000-2005"]) == 2  # reporting seeds lie outside the tuning range
    assert "never a reporting seed" in capsys.readouterr().err
    assert measure_workload.main([name, "--seeds", "x"]) == 2


def test_an_accepted_workloads_training_settings_reach_a_campaigns_runs():
    """Every setting an accepted workload names besides its model, data, world and budget (Adam, its learning rate,
    schedule and batch) is one a campaign passes to its runs: a study registered on it trains as it was measured."""
    from workbench.campaigns.reproduce.common import RUN_KEYS, run_extras

    for entry in registry.load().workloads.values():
        training = {k: v for k, v in entry["settings"].items() if k not in acceptance.SETTINGS}
        assert set(training) <= set(RUN_KEYS) and run_extras(entry["settings"]) == training
