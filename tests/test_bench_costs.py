"""``benchmarks/fit_costs.py`` chooses each cost's law by its stated rule (synthetic data from every form, and a
noisy constant it must not take for a trend), writes laws ``load_costs`` reads; ``benchmarks/bench_costs.py``
answers bad arguments in one line with exit 2."""

import importlib.util
import json
import math
import random
import sys
from pathlib import Path

import pytest

from workbench.strategies.scale import load_costs

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))


def load(name):
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


fit_costs = load("fit_costs")
bench_costs = load("bench_costs")
WORLDS = [2, 4, 8, 16, 32, 2, 4, 8, 2]
PARAMS = [1e6] * 5 + [19e6] * 3 + [100e6]


@pytest.mark.parametrize("form, law", [
    ("constant", lambda p, q: 0.015), ("log", lambda p, q: 0.01 * math.log2(p) + 0.02),
    ("linear", lambda p, q: 0.003 * p + 0.1), ("bytes", lambda p, q: 8 * q / 2e9)])
def test_the_fit_chooses_the_form_the_data_was_made_from(form, law):
    result = fit_costs.fit(WORLDS, PARAMS, [law(p, q) for p, q in zip(WORLDS, PARAMS)], per_param=8)
    assert result["chosen"] == form
    chosen = result["candidates"][form]
    assert chosen["rms"] < 1e-9
    if form == "bytes":
        assert chosen["a"] == 8 and chosen["b"] == pytest.approx(2e9)


def test_a_noisy_constant_is_not_taken_for_a_trend_and_a_noisy_trend_is_found():
    rng = random.Random(3)
    worlds, params = [2, 4, 8, 16, 32] * 3, [1e6] * 15
    flat = [0.05 * (1 + rng.gauss(0, 0.1)) for _ in worlds]
    assert fit_costs.fit(worlds, params, flat)["chosen"] == "constant"
    rising = [(0.002 * p + 0.01) * (1 + rng.gauss(0, 0.05)) for p in worlds]
    assert fit_costs.fit(worlds, params, rising)["chosen"] == "linear"


def test_one_point_is_a_constant_and_two_worlds_cannot_choose_a_slope():
    assert fit_costs.fit([2], [1e6], [0.3])["chosen"] == "constant"
    assert set(fit_costs.fit([2, 4], [1e6, 1e6], [0.3, 0.5])["candidates"]) == {"constant"}


def point(strategy, world, params, model, **p50):
    costs = {name: {"p50": None} for name in bench_costs.TIMES + bench_costs.COUNTS}
    costs.update({"checkpoint_stall_s": {"p50": None}, "step_s": {"p50": 0.01 * world}})
    costs.update({name: {"p50": value} for name, value in p50.items()})
    return {"strategy": strategy, "model": model, "params": params, "world": world, "n_failures": 10,
            "costs": costs, "commit": "abc", "machine": "m", "date": "2026-01-01"}


def test_the_written_laws_load_with_load_costs(tmp_path):
    rows = [point("shrink", w, 1e6, "1M", detection_s=0.02, settle_s=0.02 + 0.01 * math.log2(w), samples_lost=32)
            for w in (2, 4, 8, 16)]
    rows += [point("checkpoint_restart", w, 1e6, "1M", detection_s=0.01, settle_s=0.3, checkpoint_stall_s=4e-4,
                   steps_redone=10, bytes_moved=4e6) for w in (2, 4, 8)]
    path = tmp_path / "costs.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert fit_costs.main(["--costs", str(path), "--out", str(tmp_path)]) == 0
    costs = load_costs(tmp_path / "cost_laws.json")
    assert costs["shrink"].settle_s.form == "log" and costs["shrink"].settle_s(8) == pytest.approx(0.03)
    assert costs["shrink"].step_s.form == "linear" and costs["checkpoint_restart"].restart_s(4) == pytest.approx(0.29)
    fits = json.loads((tmp_path / "cost_fits.json").read_text())
    assert fits["fits"]["checkpoint_restart"]["steps_redone"]["law"] == "10"
    assert "1M@32 shrink" in fits["meta"]["missing"] and "1M@2 shrink" not in fits["meta"]["missing"]


@pytest.mark.parametrize("argv, said", [
    (["--models", "2M"], "--models '2M' is not known"), (["--only", "nope"], "--only 'nope' is not known"),
    (["--worlds", "1"], "--worlds '1' is not allowed"), (["--worlds", "x"], "--worlds 'x' is not allowed"),
    (["--models", "100M", "--worlds", "4"], "no point of the grid"), (["--failures", "0"], "--failures 0"),
    (["--bogus"], "unrecognized arguments")])
def test_bad_arguments_are_one_line_and_exit_2(argv, said, capsys):
    with pytest.raises(SystemExit) as exited:
        bench_costs.main(argv)
    err = capsys.readouterr().err
    assert exited.value.code == 2 and said in err and err.count("\n") == 1


def test_the_plan_skips_points_already_measured(tmp_path, capsys):
    out = tmp_path / "costs.jsonl"
    lines = [{"strategy": "shrink", "model": "1M", "world": 2, "n_failures": 10},
             {"strategy": "torchft", "model": "1M", "world": 2, "n_failures": 9},  # short: measured again
             {"strategy": "ulfm", "model": "1M", "world": 2, "n_failures": 0, "unavailable": "no mpi4py"}]
    out.write_text("".join(json.dumps(line) + "\n" for line in lines))
    assert bench_costs.main(["--models", "1M", "--worlds", "2", "--plan", "--out", str(out)]) == 0
    err = capsys.readouterr().err
    assert "2 of 9 points already in" in err and "1M@2 torchft" in err and "1M@2 rollback" in err
    assert "1M@2 shrink" not in err and "1M@2 ulfm" not in err


def test_the_docs_table_is_the_fit_of_the_results():
    fitted = json.loads((ROOT / "benchmarks" / "results" / "cost_fits.json").read_text())
    page = (ROOT / "docs" / "scale.md").read_text()
    assert fit_costs.docs_block(fitted["meta"], fitted["fits"]) in page, (
        "docs/scale.md's measured costs are stale: run python benchmarks/fit_costs.py --docs docs/scale.md")
    laws = load_costs(ROOT / "benchmarks" / "results" / "cost_laws.json")
    assert set(laws) == set(fitted["fits"])


def test_a_tiny_point_end_to_end_gives_a_line_the_fit_reads(tmp_path):
    out = tmp_path / "costs.jsonl"
    assert bench_costs.main(["--models", "1M", "--worlds", "2", "--only", "regrow", "--failures", "1",
                             "--out", str(out)]) == 0
    (row,) = [json.loads(line) for line in out.read_text().splitlines()]
    assert row["strategy"] == "regrow" and row["world"] == 2 and row["params"] == 993_930 and row["n_failures"] >= 1
    assert row["costs"]["join_s"]["p50"] > 0 and row["costs"]["bytes_moved"]["p50"] > 0
    assert {"p50", "p99", "clock"} <= set(row["costs"]["step_s"]) and row["clock"] in ("wall", "rank")
    assert row["load_1min"] >= 0 and row["commit"] and row["machine"] and row["date"]
    assert fit_costs.main(["--costs", str(out), "--out", str(tmp_path)]) == 0
    assert load_costs(tmp_path / "cost_laws.json")["regrow"].join_s.form == "constant"
