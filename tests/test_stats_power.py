"""Power before registration (workbench.campaigns.reproduce.stats): the n each registered test needs, against known
values (G*Power's one-sample t table, the normal closed form, Wilson's zero-count bound, Newcombe's worked example) and
the registry's power blocks recomputed from their own numbers."""

from __future__ import annotations

import math

import pytest

from workbench.campaigns.reproduce import power, registry, stats


@pytest.mark.parametrize("d,n", [(0.5, 34), (0.8, 15), (1.0, 10)])
def test_paired_t_n_matches_the_one_sample_t_table(d, n):
    # G*Power, one-sample t, two-sided alpha 0.05 (= one-sided 0.025), power 0.80: 34, 15, 10
    assert stats.n_paired(1.0, d, 0.0, "superiority", 0.025) == n
    assert stats.t_power(n, 1.0, d, 0.0, "superiority", 0.025) >= 0.8 > stats.t_power(n - 1, 1.0, d, 0.0,
                                                                                        "superiority", 0.025)


def test_the_t_n_sits_just_above_the_normal_closed_form():
    for test, sesoi, margin in [("superiority", 0.5, 0.0), ("non_inferiority", 0.0, 1.0), ("equivalence", 0.0, 1.0),
                                ("difference", 3.0, 2.0)]:
        z = stats.n_normal(2.0, sesoi, margin, test, 0.025)
        n = stats.n_paired(2.0, sesoi, margin, test, 0.025)
        assert math.ceil(z) <= n <= math.ceil(z) + 3, (test, z, n)
    # the closed form itself: ((1.95996 + 0.84162) * 1 / 0.5)^2 = 31.40
    assert stats.n_normal(1.0, 0.5, 0.0, "superiority", 0.025) == pytest.approx(31.396, abs=1e-3)
    # equivalence (TOST) at a true 0 takes z_{1-beta/2}: ((1.64485 + 1.28155) / 0.5)^2 = 34.26
    assert stats.n_normal(1.0, 0.0, 0.5, "equivalence", 0.05) == pytest.approx(34.255, abs=1e-3)


def test_no_n_reaches_power_when_the_effect_of_interest_is_on_the_margins_wrong_side():
    assert stats.n_paired(1.0, 0.0, 0.0, "superiority", 0.025) is None
    assert stats.n_paired(1.0, 2.0, 2.0, "difference", 0.025) is None
    assert stats.t_power(5, 1.0, -1.0, 0.0, "superiority", 0.025) == 0.0


def test_wilson_and_newcombe_against_known_values():
    assert stats.wilson(0, 10) == pytest.approx((0.0, 0.0, 0.27754), abs=1e-5)  # 1.96^2 / (10 + 1.96^2)
    assert stats.wilson(3, 20)[1:] == pytest.approx((0.05237, 0.36042), abs=1e-5)
    # Newcombe (1998), method 10, his example 56/70 - 48/80: 0.2000 [0.0524, 0.3339]
    assert stats.newcombe(56, 70, 48, 80) == pytest.approx((0.2, 0.0524, 0.3339), abs=1e-4)


def test_share_n_from_the_wilson_bound():
    # a true share of 0: every trial masked; the upper bound z^2 / (n + z^2) < 0.05 first at n > z^2 * 0.95 / 0.05
    z = 1.959964
    assert stats.n_share(0.0, 0.05, 0.025) == math.floor(z * z * 0.95 / 0.05) + 1 == 73
    assert stats.share_power(73, 0.0, 0.05, 0.025) == 1.0 and stats.share_power(72, 0.0, 0.05, 0.025) == 0.0
    n = stats.n_share(0.01, 0.05, 0.025)
    assert n is not None and stats.share_power(n, 0.01, 0.05, 0.025) >= 0.8
    assert stats.n_share(0.06, 0.05, 0.025) is None


def test_every_sampled_finding_has_a_power_block_that_its_numbers_give():
    reg = registry.load()
    for finding in reg.findings.values():
        block = finding.power
        if finding.test == "exact":
            assert block is None or block.get("descriptive") or finding.kind == "mechanism", finding.key
            continue
        assert block, f"{finding.key}: no power block"
        if block.get("descriptive"):
            assert block.get("reason"), finding.key
            continue
        assert {"sesoi", "sd_source", "sd", "n_required", "n_registered"} <= set(block), finding.key
        assert block["n_required"] == registry.required_n(finding), finding.key


def planted(power_block: dict | None) -> registry.Finding:
    """A non-inferiority finding (margin 1 pt, alpha 0.0125) with ``power_block``."""
    return registry.Finding("planted", "accuracy_kept", "", "", "test accuracy", "none", "", "non_inferiority", 1.0,
                            0.0125, power=power_block)


UNDERPOWERED = {"sesoi": 0.0, "sd": 10.0, "sd_source": "planted", "n_required": 150, "n_registered": 5}
PAST = [-5.0, -4.2, -5.8, -4.6, -5.4]  # wholly below -1: the interval lies past the margin
STRADDLING = [-3.0, 1.0, -1.5, 0.5, -2.0]
CLEAR = [1.0, 1.2, 0.9, 1.1, 1.0]  # wholly above -1


@pytest.mark.parametrize("values,status", [(PAST, "does not hold"), (STRADDLING, "inconclusive"), (CLEAR, "holds")])
def test_power_is_a_note_and_never_changes_a_decision(values, status):
    """An underpowered finding whose interval lies past its margin does not hold; one whose interval straddles it
    is inconclusive; one wholly on the claim's side holds (its alpha bounds a false *holds* at any n): each with
    its power said in its detail. A powered finding's decision is returned unchanged."""
    finding = planted(UNDERPOWERED)
    assert finding.underpowered
    decision = registry.paired_decision(finding, values)
    noted = power.powered(finding, decision)
    assert decision.status == noted.status == status
    assert (noted.mean, noted.low, noted.high, noted.n) == (decision.mean, decision.low, decision.high, 5)
    assert noted.detail == f"{decision.detail}; underpowered: n = 5 registered, 150 needed for 80 % power"
    descriptive = planted({"descriptive": True, "reason": "178 seeds for a 1-pt margin"})
    said = power.powered(descriptive, registry.paired_decision(descriptive, values))
    assert said.status == status and said.detail.endswith("; descriptive (178 seeds for a 1-pt margin)")
    strong = planted({**UNDERPOWERED, "n_required": 4})
    assert not strong.underpowered
    assert power.powered(strong, registry.paired_decision(strong, values)) == registry.paired_decision(strong, values)


def test_an_underpowered_finding_past_its_margin_fails_its_papers_verdict(monkeypatch):
    """The planted case end to end: a paper-scale verdict whose registered accuracy finding is underpowered and
    lies wholly past its margin does not hold (the rule before made it inconclusive)."""
    from dataclasses import replace

    from workbench.campaigns.reproduce.common import Verdict

    reg = registry.load()
    key = "gossipgrad.accuracy_non_inferior"
    reg.findings[key] = replace(reg.findings[key], power=UNDERPOWERED)
    monkeypatch.setattr(registry, "load", lambda *args, **kwargs: reg)
    verdict = Verdict("gossipgrad", "planted", "", "paper")
    far = reg.ceiling("gossipgrad")[1]["accuracy"] - 0.4  # 40 pt below its ceiling: the ceiling plays no part
    verdict.decide(key, PAST, "p=4", reference=far)
    (decided,) = verdict.decisions
    assert decided["status"] == verdict.status == "does not hold"
    assert "underpowered: n = 5 registered, 150 needed" in decided["detail"] and "40.0 pt below" in decided["detail"]


def test_the_registered_power_blocks_are_tabled():
    reg = registry.load()
    assert reg.finding("apoptosis.accuracy_kept").underpowered
    assert not reg.finding("apoptosis.training_faster").underpowered
    rows = {row["key"]: row["status"] for row in power.table()}
    assert rows["gossipgrad.diffusion_in_log_p"] == "mechanism" and rows["ccgrid22.rollback_keeps_accuracy"] == \
        "descriptive" and rows["apoptosis.training_faster"] == "powered"
