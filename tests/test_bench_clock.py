"""``benchmarks/bench_clock.py`` judges each aim of the rank clock as met, missed, or inconclusive where the host
of that run could not test it (its wall clock, its idle cores' wake-up, its own speed): the judging on made-up
figures, and the host's measurements for real."""

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("bench_clock", ROOT / "benchmarks" / "bench_clock.py")
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)


def figures(wall_step_x=1.6, rank_step_x=1.05, points=(10.0, 20.0), hog_rank=1.05, hog_wall=1.3, agree_x=1.1,
            spread=1.08) -> dict:
    return {"one_vs_two": {"shrink": {"wall_step_x": wall_step_x, "rank_step_x": rank_step_x,
                                      "rank_overhead_pt": list(points)}},
            "hog": {"1 core": {"shrink": {"rank_train_x": hog_rank, "wall_train_x": hog_wall}}},
            "core_per_rank": {"agree_x": agree_x}, "copies": {"rank_spread": spread}}


HOST = {"wake_two_cores_us": [12.0, 20.0], "speed_spread": 1.02}


def test_every_aim_is_met_on_a_host_that_can_test_it():
    assert bench.verdicts(figures(points=(400.0, 450.0)), HOST, "rank")["one_vs_two"]["shrink"] == "met"  # 12 %
    judged = bench.verdicts(figures(), HOST, "rank")
    assert judged["one_vs_two"] == {"shrink": "met"} and judged["hog"] == {"1 core/shrink": "met"}
    assert judged["core_per_rank"] == "met" and judged["copies"] == "met"
    assert judged["count"] == {"met": 4, "missed": 0, "inconclusive": 0}


@pytest.mark.parametrize("change, aim", [
    ({"rank_step_x": 1.2}, "one_vs_two"), ({"points": (10.0, 30.0)}, "one_vs_two"),
    ({"points": (400.0, 480.0)}, "one_vs_two"),
    ({"hog_rank": 1.12}, "hog"), ({"agree_x": 1.3}, "core_per_rank"), ({"spread": 1.14}, "copies")])
def test_a_figure_past_its_margin_is_missed(change, aim):
    judged = bench.verdicts(figures(**change), HOST, "rank")
    verdict = judged[aim] if isinstance(judged[aim], str) else next(iter(judged[aim].values()))
    assert verdict == "missed" and judged["count"]["missed"] == 1


def test_a_host_that_cannot_test_an_aim_makes_it_inconclusive_with_the_reason():
    slow_wake = {"wake_two_cores_us": [300.0, 480.0], "speed_spread": 1.3}
    judged = bench.verdicts(figures(wall_step_x=1.2, hog_wall=1.02, agree_x=1.5, spread=1.2), slow_wake, "rank")
    assert judged["one_vs_two"]["shrink"] == "inconclusive: the wall step differs only 1.2x"
    assert judged["hog"]["1 core/shrink"].startswith("inconclusive: the hog moved the wall clock only 1.02x")
    assert judged["core_per_rank"].startswith("inconclusive: an idle core wakes in 300.0 us")
    assert judged["copies"] == "inconclusive: the host's own speed moved 1.3x during the run"
    # the probe is there to take the host's speed out: its copies are judged whatever the host did
    assert bench.verdicts(figures(spread=1.2), slow_wake, "probe")["copies"] == "missed"


def test_the_host_measurements_read_real_round_trips_and_speed():
    two, one = bench.wake_us((0, 0), rounds=200), bench.host_speed_us(0)
    assert len(two) == 2 and 0 < two[0] <= two[1] < 1e6
    assert one > 0
