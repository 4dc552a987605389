"""Each RunConfig field's help, allowed values and flag are written once (workbench/config/fields.py): the
``workbench run`` flags and docs/settings.md's table come from there, and the page cannot drift from them."""

import argparse
import dataclasses
import importlib.util
from pathlib import Path

import pytest

from workbench.config import devices
from workbench.config import run as config
from workbench.config.fields import SETTINGS, Setting, flag_of, help_text
from workbench.config.run import RunConfig
from workbench.launch.cli import _config_from_args, build_parser

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("gen_settings", ROOT / "tools" / "gen_settings.py")
gen = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gen)

FIELDS = [f.name for f in dataclasses.fields(RunConfig)]
# the command line is public: a renamed field must not rename its flag unnoticed
FLAGS = ("--world-size --steps --batch-size --lr --lr-schedule --optimizer --model --hidden --width --dataset "
         "--synthetic-size --augment --seed --strategy --regrow --warm-spares --checkpoint-every --resume --no-verify "
         "--eval-interval --detect --detect-every --fault --parallelism --micro-batches --pipeline-stages "
         "--stage-cuts --gossip-sync --shuffle --consensus-every --apoptosis --bucket-cap-mb --buckets "
         "--heartbeat-timeout --progress-timeout --straggler-response --straggler-factor --straggler-window "
         "--preempt-grace --notice-signals --resize-rule --spawn --device --speed-probe --bind --store-port").split()


def run_actions() -> dict[str, argparse.Action]:
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return {s: a for a in sub.choices["run"]._actions for s in a.option_strings}


def test_every_field_has_exactly_one_setting():
    assert sorted(SETTINGS) == sorted(FIELDS)
    assert all(isinstance(s, Setting) and s.help.strip() for s in SETTINGS.values())


def test_the_allowed_values_are_the_tuples_the_configuration_checks():
    assert SETTINGS["strategy"].choices is config.STRATEGIES  # imported, not restated
    assert SETTINGS["optimizer"].choices is config.OPTIMIZERS and SETTINGS["spawn"].choices is config.SPAWNS
    assert SETTINGS["device"].choices is devices.DEVICES
    for name, setting in SETTINGS.items():
        if setting.choices:
            assert "{choices}" in setting.help, name
            assert all(choice in help_text(name) for choice in setting.allowed), name
            assert all(f"`{choice}`" in help_text(name, markdown=True) for choice in setting.allowed), name


def test_the_run_flags_are_generated_from_the_settings():
    actions = run_actions()
    flagged = [name for name in FIELDS if flag_of(name) is not None]
    assert [flag_of(name) for name in flagged] == FLAGS
    for name in flagged:
        action = actions[flag_of(name)]
        assert action.dest == name and action.default is argparse.SUPPRESS
        assert action.help.startswith(help_text(name)) and action.choices is None  # RunConfig names bad values
    unflagged = {name for name in FIELDS if flag_of(name) is None}
    assert unflagged == {"momentum", "guard_limit", "spike_factor", "startup_timeout", "op_timeout", "hosts",
                         "flush_denormal"}
    assert not unflagged & {a.dest for a in actions.values()}


def test_the_generated_flags_parse_into_the_fields():
    args = build_parser().parse_args(["run", "--world-size", "2", "--lr", "0.1", "--hidden", "8,4", "--regrow",
                                      "--strategy", "shrink", "--no-verify", "--detect", "guard,spike",
                                      "--fault", "kill:rank=1,step=3", "--fault", "hang:rank=0,step=4"])
    assert args.hidden == [8, 4] and args.regrow is True and args.resume_verify is False
    cfg = _config_from_args(args)
    assert (cfg.world_size, cfg.lr, cfg.hidden, cfg.regrow, cfg.resume_verify) == (2, 0.1, [8, 4], True, False)
    assert cfg.detect == ["guard", "spike"] and [str(f) for f in cfg.faults] == ["kill:rank=1,step=3",
                                                                                  "hang:rank=0,step=4"]
    assert _config_from_args(build_parser().parse_args(["run"])) == RunConfig()  # nothing given: the defaults


def test_one_edit_of_a_setting_changes_the_flag_and_the_page(monkeypatch):
    monkeypatch.setitem(SETTINGS, "lr", Setting("step size of every update"))
    assert run_actions()["--lr"].help == "step size of every update"
    assert "| `lr` | `--lr` | `0.05` | step size of every update |" in gen.settings_table()


def test_the_settings_page_is_up_to_date():
    """Fails when a setting changed and docs/settings.md was not regenerated: run python tools/gen_settings.py."""
    text = (ROOT / "docs" / "settings.md").read_text(encoding="utf-8")
    assert gen.render(text) == text, "docs/settings.md is out of date: run python tools/gen_settings.py"
    for name in FIELDS:
        assert f"| `{name}` |" in text, name
    assert gen.main(["--check"]) == 0


def test_a_stale_page_fails_the_check_and_is_rewritten(tmp_path, capsys):
    page = tmp_path / "settings.md"
    good = (ROOT / "docs" / "settings.md").read_text(encoding="utf-8")
    page.write_text(good.replace("| number of ranks (1..64) |", "| ranks |"), encoding="utf-8")
    assert gen.main(["--check", "--file", str(page)]) == 1
    assert "out of date" in capsys.readouterr().err
    assert gen.main(["--file", str(page)]) == 0
    assert page.read_text(encoding="utf-8") == good
    assert gen.main(["--check", "--file", str(page)]) == 0


def test_a_page_without_the_markers_is_refused():
    with pytest.raises(ValueError, match="must hold the markers"):
        gen.render("# Settings\n\nno table here\n")
    with pytest.raises(ValueError, match="in that order"):
        gen.render(f"{gen.END}\n{gen.BEGIN}\n")
