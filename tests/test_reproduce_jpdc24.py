"""JPDC'24 soft errors (workbench.campaigns.reproduce.jpdc24) against its pre-registration: on synthetic campaign tables
a correct campaign holds, a broken mechanism (mantissa flips not masked, no platform difference, a flip that did not
land) makes the registered finding or the mechanism check fail, and too few models leave it inconclusive; the
paper scale's settings are the registry's; one tiny real campaign."""

from __future__ import annotations

import struct

import pandas as pd
import pytest

from workbench.campaigns.reproduce import jpdc24
from workbench.campaigns.reproduce.common import campaign_settings
from workbench.campaigns.reproduce.registry import FAILS, HOLDS, INCONCLUSIVE, load


@pytest.fixture(autouse=True)
def _the_registered_rule_alone(monkeypatch):
    """These tests check each finding's registered rule on synthetic tables; an underpowered or descriptive finding's
    power note (it changes no status) is tests/test_stats_power.py's."""
    from workbench.campaigns.reproduce import power

    monkeypatch.setattr(power, "powered", lambda finding, decision: decision)



def ieee_flip(value, bit):
    """``value`` as float32 with ``bit`` (LSB-0) flipped."""
    (raw,) = struct.unpack("<I", struct.pack("<f", value))
    return struct.unpack("<f", struct.pack("<I", raw ^ (1 << bit)))[0]


def frames(models=5, mantissa="masked", gap=True, landed=None):
    """Alterations: 10 resumes per (model, platform, flips); data loses fewer than pipeline (``gap``), 100 flips
    more than 1. Single flips of 0.01: bit 30 wrecks 2 or 3 of 3, bits 23-29 are masked; mantissa bits 0-22 of
    1.0."""
    alterations, bits = [], []
    for seed in range(models):
        odd = seed % 2
        for platform in ("data", "pipeline"):
            wrecked = {1: odd, 100: 6 + odd} if platform == "data" or not gap else {1: 1 + odd, 100: 9 - odd}
            for k in (1, 100):
                alterations += [{"platform": platform, "seed": seed, "world_size": 2, "group": "weights", "flips": k,
                                 "flipped": k, "landed": k if landed is None else landed, "trial": t,
                                 "clean_outcome": "completed",
                                 "outcome": "nonfinite" if t < wrecked[k] else "masked"} for t in range(10)]
            bits += [{"platform": platform, "seed": seed, "bit": b, "old": 0.01, "new": ieee_flip(0.01, b),
                      "outcome": "degraded" if b == 30 and t < 2 + odd else "masked"}
                     for b in range(23, 31) for t in range(3)]
            bits += [{"platform": platform, "seed": seed, "bit": b, "old": 1.0, "new": 1.0 + 2.0**(b - 23),
                      "outcome": mantissa} for b in range(23) for t in range(2)]
    return pd.DataFrame(alterations), pd.DataFrame(bits)


def decisions(verdict):
    return {(d["key"].split(".")[1], d["label"]): d["status"] for d in verdict.decisions}


def test_a_correct_campaign_holds_every_registered_finding_and_mechanism_check():
    v = jpdc24.verdict(*frames(), "paper")
    assert v.status == HOLDS, v.summary()
    assert set(decisions(v).values()) == {HOLDS} and len(v.decisions) == 7  # 2 + 2 per platform, 1 across
    assert decisions(v)[("data_vs_model_parallel", "data - pipeline")] == HOLDS
    assert v.statistics["models_per_platform"] == {"data": 5, "pipeline": 5}
    assert all(c.ok for c in v.checks) and len(v.checks) == 7
    top = next(c for c in v.checks if c.name.startswith("flips of the top exponent bit (30) wreck training (data)"))
    assert top.detail.endswith("per exponent bit: wreck 30; masked 29, 28, 27, 26, 25, 24, 23"), top.detail
    assert v.statistics["exponent_bits"]["data"][30] == pytest.approx(12 / 15)  # 2 or 3 of 3 in 5 models
    v.require()


def test_the_exponent_finding_covers_every_exponent_bit_not_bit_30_alone():
    """The exponent's share pools its eight bits alike: bit 30 alone (7 bits masked) is 1/8 of it, and a campaign
    that flipped bit 30 alone is not comparable."""
    alterations, bits = frames()
    v = jpdc24.verdict(alterations, bits, "paper")
    (data,) = [d for d in v.decisions if d["key"] == "jpdc24.exponent_wrecks" and d["label"] == "data"]
    assert data["mean"] == pytest.approx(12 / 15 / 8)
    only_30 = bits[~bits.bit.isin(range(23, 30))]
    v = jpdc24.verdict(alterations, only_30, "paper")
    assert not v.comparable and "every exponent bit 23-30" in v.reason


def test_mantissa_flips_not_masked_fail_the_finding_and_the_mechanism():
    v = jpdc24.verdict(*frames(mantissa="degraded"), "paper")
    assert v.status == FAILS
    found = decisions(v)
    assert found[("low_mantissa_masked", "data")] == found[("low_mantissa_masked", "pipeline")] == FAILS
    assert found[("exponent_wrecks", "data")] == FAILS  # bit 30 wrecks no more often than the mantissa now
    broken = {c.name for c in v.checks if not c.ok}
    assert broken == {"every single flip's outcome is one its value allows",  # bits 0-9 move a value by <= 2^-14
                      "mantissa flips (bits 0-22) masked in a clear majority (data)",
                      "mantissa flips (bits 0-22) masked in a clear majority (pipeline)"}
    with pytest.raises(AssertionError, match="the mechanism fails"):
        v.require_mechanism()


def test_no_platform_difference_does_not_hold():
    v = jpdc24.verdict(*frames(gap=False), "paper")
    found = decisions(v)
    assert found[("data_vs_model_parallel", "data - pipeline")] == FAILS  # shown equal within 2 points
    assert v.status == FAILS and all(c.ok for c in v.checks)
    v.require_mechanism()  # the mechanism is sound: only the registered finding fails
    with pytest.raises(AssertionError, match="data_vs_model_parallel data - pipeline does not hold"):
        v.require()


def test_a_flip_that_did_not_land_fails_the_mechanism():
    v = jpdc24.verdict(*frames(landed=0), "small")
    assert [c.name for c in v.checks if not c.ok] == ["every flip landed once, in its state group"]


def test_one_model_per_platform_is_inconclusive():
    v = jpdc24.verdict(*frames(models=1), "small")
    assert v.status == INCONCLUSIVE, v.summary()
    assert set(decisions(v).values()) == {INCONCLUSIVE}  # no interval over one model; 46 mantissa flips too few
    v.require_mechanism()


def test_without_both_platforms_it_is_not_comparable():
    alterations, bits = frames()
    v = jpdc24.verdict(alterations[alterations.platform == "data"], bits, "small")
    assert not v.comparable and "two platforms" in v.reason
    with pytest.raises(AssertionError, match="not comparable"):
        v.require_mechanism()


def test_the_paper_scale_is_the_registrys_workload(tmp_path):
    workload = load().workload("jpdc24")
    settings = campaign_settings(jpdc24.KEY, jpdc24.SCALES, "paper", tmp_path, {"seeds": [3]})
    assert set(jpdc24.SCALES["small"]) - {"seeds"} <= set(workload)  # every setting the campaign reads is registered
    assert {k: settings[k] for k in workload} == workload and settings["reporting"] is False
    assert load().seed_count("jpdc24") >= 5 and workload["dataset"] == "synthetic_image"
    reporting = campaign_settings(jpdc24.KEY, jpdc24.SCALES, "paper", tmp_path, {})
    assert reporting["reporting"] and len(reporting["seeds"]) == load().seed_count("jpdc24")


def test_bad_campaign_input_is_one_clear_error_before_any_run(tmp_path):
    from workbench.base.errors import ConfigError

    with pytest.raises(ConfigError, match=r"unknown campaign setting\(s\) per_bit; this campaign's are model"):
        jpdc24.campaign("small", out=tmp_path, per_bit=3)
    with pytest.raises(ConfigError, match=r"'medium' is not a scale of this campaign; choose one of small, paper"):
        jpdc24.campaign("medium", out=tmp_path)
    assert not (tmp_path / "runs").exists()


def test_altered_checkpoints_of_another_model_are_never_reused(tmp_path):
    """The same ``out`` for another model: the altered checkpoints are made again from that model's checkpoint
    (a stale one would fail to load, and its failure would count as a soft-error outcome)."""
    tiny = {"worlds": [2], "platforms": ["data"], "seeds": [0], "steps": 8, "resume_steps": 4, "flips": [1],
            "groups": ["weights"], "trials": 1, "exponent_trials": 1, "mantissa_trials": 1, "bit_steps": 2}
    for model in ("mlp", "cnn"):
        alterations, bits = jpdc24.campaign("small", out=tmp_path, model=model, **tiny)
        # a random bit of one weight, resumed 4 steps: landed once (a stale checkpoint would crash: fail to load)
        assert len(alterations) == 1 and alterations.landed.iloc[0] == 1, (model, alterations)
        assert alterations.outcome.iloc[0] != "crash" and alterations.clean_outcome.iloc[0] == "completed"
        assert sorted(bits.bit.unique()) == list(range(31)) and len(bits) == 31
    assert len(list((tmp_path / "runs" / "s0-data-w2").glob("weights-k1-t0-*.h5"))) == 2
