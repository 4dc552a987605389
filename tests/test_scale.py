"""The scale model (workbench/strategies/scale, docs/scale.md): the closed form against hand-computed cases, the
simulation against the closed form and against Daly's exact expression, correlated failures and spares running
out moving the result the expected way, a crossover found, the published check (and a planted defect failing
it), the docs' table held to the code, and ``workbench scale`` refusing bad input in one line."""

from __future__ import annotations

import json
import math
import time
from dataclasses import replace
from pathlib import Path

import pytest
from test_bad_meetings import cli

from workbench import strategies
from workbench.base.errors import ConfigError
from workbench.strategies import scale
from workbench.strategies.scale import CostLaw, Costs, intervals, published
from workbench.strategies.scale.profiles import Redo

ROOT = Path(__file__).resolve().parents[1]
COSTS = Costs(step_s=1.0, detection_s=5.0, settle_s=10.0, join_s=120.0, restart_s=300.0, reload_s=60.0,
              checkpoint_s=30.0)


def test_young_daly_and_the_exact_optimum_by_hand():
    assert intervals.young(60.0, 3600.0) == pytest.approx(math.sqrt(2 * 60 * 3600))  # 657.3 s
    x = 60.0 / 7200.0
    assert intervals.daly(60.0, 3600.0) == pytest.approx(657.267 * (1 + math.sqrt(x) / 3 + x / 9) - 60, rel=1e-4)
    assert intervals.daly(9000.0, 3600.0) == 3600.0  # C >= 2M: the MTBF itself
    best = intervals.best_restart_interval(60.0, 300.0, 3600.0)
    grid = max((intervals.restart_efficiency(t, 60.0, 300.0, 3600.0), t) for t in range(100, 3000))
    assert best == pytest.approx(grid[1], abs=1.0)
    # the default interval of a checkpointing strategy is Young's at the job's MTBF
    r = scale.predict("checkpoint_restart", 1000, job_mtbf_hours=2.0, costs=COSTS, method="closed")
    assert r.interval_s == pytest.approx(math.sqrt(2 * 30.0 * 7200.0))


def test_no_failures_and_no_checkpoint_stall_is_fully_effective():
    for name in scale.NAMES:
        r = scale.predict(name, 4096, 1e12, checkpoint_s=0.0)
        assert r.effective == pytest.approx(1.0, abs=1e-9), name
        assert r.method == "closed form" and r.first_order


def test_the_closed_form_by_hand():
    # checkpoint_restart: 1000 ranks, a failure every 10 h, τ = 600 s, C = 30 s, stall 5 + 300 + 60 s
    r = scale.predict("checkpoint_restart", 1000, job_mtbf_hours=10.0, costs=COSTS, interval_s=600.0,
                      method="closed")
    redo = (600 ** 2 / 2 + 30 * 600) / 630
    assert r.effective == pytest.approx(600 / 630 * (1 - (365 + redo) / 36000))
    assert r.steps_redone == pytest.approx(72 * redo)  # 72 failures in 720 h, redo/1 s steps each
    # shrink: the stall, and the ranks lost over the job, λ·T/(2p) of it on average; 1 sample per lost rank
    r = scale.predict("shrink", 1000, job_mtbf_hours=10.0, costs=COSTS, method="closed")
    assert r.effective == pytest.approx(1 - 15 / 36000 - 72 / 2000)
    assert r.final_world == pytest.approx(928) and r.samples_lost_per_hour == pytest.approx(0.1)
    # torchft: the step in flight lost, the replica group of 10 out for its join
    r = scale.predict("torchft", 1000, job_mtbf_hours=10.0, costs=COSTS, replica_ranks=10, method="closed")
    assert r.effective == pytest.approx(1 - (15 + 1 + 10 / 1000 * 120) / 36000)


@pytest.mark.parametrize("name", ["checkpoint_restart", "shrink", "rollback", "forward", "reinit", "regrow",
                                  "torchft", "torchrun", "ulfm"])
def test_the_simulation_agrees_with_the_closed_form_where_both_apply(name):
    """First order (λ × a failure's cost ≤ 0.1, a shrinking world losing ≤ 10 %), exponential, spares enough:
    within 1 point over 4,000 failures."""
    options = dict(world=100_000, mtbf_hours=100_000 * 20.0, costs=COSTS, job_hours=80_000.0, replica_ranks=8)
    closed = scale.predict(name, method="closed", **options)
    simulated = scale.predict(name, method="simulate", seed=1, **options)
    assert closed.first_order and closed.failures == pytest.approx(4000)
    assert simulated.effective == pytest.approx(closed.effective, abs=0.01), (closed, simulated)
    assert simulated.failures == pytest.approx(closed.failures, rel=0.05)
    assert simulated.steps_redone == pytest.approx(closed.steps_redone, rel=0.1, abs=1.0)


def test_the_simulation_reproduces_daly_exact_where_the_first_order_fails():
    """A failure every hour against a 5-minute restart and a 60 s checkpoint: failures during a restart and
    during a checkpoint matter; the simulation matches Daly's exact expression, the first order does not."""
    costs = Costs(step_s=1.0, detection_s=0.0, restart_s=300.0, reload_s=0.0, checkpoint_s=60.0)
    runs = [scale.predict("checkpoint_restart", 1000, job_mtbf_hours=1.0, costs=costs, method="simulate",
                          seed=seed, job_hours=4000.0) for seed in range(2)]
    exact = intervals.restart_efficiency(runs[0].interval_s, 60.0, 300.0, 3600.0)
    assert sum(r.effective for r in runs) / 2 == pytest.approx(exact, abs=0.01)
    closed = scale.predict("checkpoint_restart", 1000, job_mtbf_hours=1.0, costs=costs, method="closed")
    assert not closed.first_order and abs(closed.effective - exact) > 0.01
    auto = scale.predict("checkpoint_restart", 1000, job_mtbf_hours=1.0, costs=costs)
    assert auto.method == "simulation"


def test_node_failures_and_spares_running_out_move_the_result_the_expected_way():
    base = dict(world=4096, mtbf_hours=20000.0, costs=COSTS, method="simulate", seed=3)
    alone = scale.predict("checkpoint_restart", **base)
    nodes = scale.predict("checkpoint_restart", node_mtbf_hours=20000.0, ranks_per_node=8, **base)
    assert nodes.effective < alone.effective and nodes.failures > alone.failures
    assert nodes.spares_used > alone.spares_used + 7 * (nodes.failures - alone.failures) * 0.5
    short = scale.predict("checkpoint_restart", spares=20, replacement_s=4 * 3600.0, **base)
    assert short.spares_used == 20 and short.effective < alone.effective - 0.05
    assert not scale.predict("checkpoint_restart", spares=20, **{**base, "method": "closed"}).first_order
    regrow = scale.predict("regrow", **base)
    regrow_short = scale.predict("regrow", spares=20, replacement_s=24 * 3600.0, **base)
    assert regrow_short.effective < regrow.effective
    shrink_nodes = scale.predict("shrink", node_mtbf_hours=20000.0, ranks_per_node=8, **base)
    assert shrink_nodes.final_world < scale.predict("shrink", **base).final_world - 100
    weibull = scale.predict("checkpoint_restart", weibull_shape=0.7, **base)  # infant mortality: more, early
    assert weibull.failures > alone.failures and weibull.method == "simulation"


def test_a_crossover_is_found_by_bisection():
    """Per-rank MTBF fixed: a shrinking world loses the same share at any size (T/2M), a restart loses more as
    the world grows; checkpoint_restart leads small and shrink large, and they cross in between."""
    fixed = dict(mtbf_hours=10000.0, costs=COSTS)
    at = scale.crossover("checkpoint_restart", "shrink", vary="world", low=8, high=100000, **fixed)
    assert at is not None and 8 < at < 100000
    below = scale.predict("checkpoint_restart", int(at / 2), **fixed).effective - \
        scale.predict("shrink", int(at / 2), **fixed).effective
    above = scale.predict("checkpoint_restart", int(at * 2), **fixed).effective - \
        scale.predict("shrink", int(at * 2), **fixed).effective
    assert below > 0 > above
    # at 64 ranks: failing ranks leave a shrinking world short for long (restart leads); rare ones do not
    mtbf = scale.crossover("checkpoint_restart", "shrink", vary="mtbf_hours", low=100, high=1e8, world=64,
                           costs=COSTS)
    assert mtbf is not None and 100 < mtbf < 1e8
    assert scale.crossover("rollback", "checkpoint_restart", low=8, high=16, mtbf_hours=1e9, costs=COSTS) is None


def test_a_tie_is_no_crossover_and_each_strategy_keeps_its_own_costs():
    """At an MTBF so short that both strategies make no progress, both sit at 0 %: no crossing there. Given b's own
    costs (a restart ten times dearer), the crossing moves to smaller worlds, where the restart hurts sooner."""
    assert scale.crossover("checkpoint_restart", "shrink", vary="mtbf_hours", low=1e-6, high=1e-5, world=64,
                           costs=COSTS) is None
    same = scale.crossover("shrink", "checkpoint_restart", low=8, high=100000, mtbf_hours=10000.0, costs=COSTS)
    dearer = scale.crossover("shrink", "checkpoint_restart", low=8, high=100000, mtbf_hours=10000.0, costs=COSTS,
                             b_costs=replace(COSTS, restart_s=3000.0))
    assert same is not None and dearer is not None and dearer < same


def test_the_cli_finds_the_crossover_the_api_does(capsys):
    costs = ["--restart-s", "300", "--checkpoint-s", "30", "--step-s", "1", "--detection-s", "5", "--settle-s",
             "10", "--join-s", "120", "--reload-s", "60"]
    code, out, err = cli(capsys, "scale", "--crossover", "shrink", "--mtbf-hours", "10000", "--json", *costs)
    found = json.loads(out)
    api = scale.crossover("checkpoint_restart", "shrink", vary="world", low=2, high=1e6, mtbf_hours=10000.0,
                          costs=COSTS)
    assert code == 0 and err == "" and found["crossover"] == api and found["vary"] == "world"
    code, out, _ = cli(capsys, "scale", "--crossover", "shrink", "--mtbf-hours", "10000", *costs)
    assert out.strip() == (f"checkpoint_restart and shrink cross at world = {api:.6g}: checkpoint_restart ahead "
                           "below it, shrink above")
    code, out, err = cli(capsys, "scale", "--crossover", "shrink", "--job-mtbf-hours", "3")
    assert code == 2 and out == "" and "--crossover takes a rank's MTBF (--mtbf-hours)" in err
    assert len(err.strip().splitlines()) == 1


def test_the_published_check_passes_at_least_five_figures_every_input_cited():
    rows = published.check()
    passed = [r for r in rows if r.passed]
    assert len(passed) >= 5, published.markdown_table(rows)
    for row in rows:
        f = row.figure
        assert f.source.url.startswith("https://") and f.source.where and f.source.read and f.cited
        if row.passed is False or row.passed is None:
            assert f.note, f"{f.name}: a miss keeps its reason"
    names = {r.figure.name for r in passed}
    assert "torchft, 300 GPUs, a failure every 60 s (step efficiency)" in names
    assert any(name.startswith("Llama 3") for name in names)


def test_a_model_that_ignores_steps_redone_fails_the_published_check():
    """The planted defect: no strategy redoes anything. The torchft run (the step in flight lost at each
    failure) and Meta's E[ETTR] projection (half a checkpoint interval redone) then miss."""
    def forgetful(strategy, **options):
        return scale.predict(replace(scale.profile(strategy), redo=Redo.NONE), **options)

    honest = {r.figure.name: r.passed for r in published.check()}
    planted = {r.figure.name: r.passed for r in published.check(forgetful)}
    broken = [name for name in honest if honest[name] and not planted[name]]
    assert "torchft, 300 GPUs, a failure every 60 s (step efficiency)" in broken
    assert "Meta E[ETTR] at 100,000 GPUs, RSC-2 failure rate (projected)" in broken


def test_the_docs_table_is_the_code_s():
    page = (ROOT / "docs" / "scale.md").read_text()
    table = published.markdown_table()
    assert table in page, ("docs/scale.md's published table is stale: paste workbench.strategies.scale."
                           "published.markdown_table() between its markers")


def test_every_workbench_strategy_has_a_profile():
    modelled = set(scale.NAMES) - {"regrow"}  # regrow is shrink with --regrow
    assert modelled <= set(strategies.NAMES)
    assert set(strategies.NAMES) - modelled == {"none", "rollback_then_restart"}


def test_cost_laws_and_their_formats():
    assert CostLaw.of(0.5)(4096, 1e9) == 0.5
    assert CostLaw.of("0.01*log(p)+0.02")(1024, 0) == pytest.approx(0.12)
    assert CostLaw.of("2e-6*p")(1000, 0) == pytest.approx(0.002)
    assert CostLaw.of("4*params/25e9")(8, 1e9) == pytest.approx(0.16)
    assert CostLaw.of({"form": "log", "a": 1, "b": 2}) == CostLaw("log", 1, 2)
    c = Costs(restart_s="30*log(p)")
    assert Costs.from_dict(c.to_dict()) == c
    for bad, needle in [("x*p", r"a number, a\*log\(p\)\+b"), ({"form": "cubic"}, "form 'cubic' is not known"),
                        ({"a": 1, "c": 2}, "key 'c' is not known"), (True, "is not allowed")]:
        with pytest.raises(ConfigError, match=needle):
            CostLaw.of(bad)
    with pytest.raises(ConfigError, match="'restart' is not a cost"):
        Costs.from_dict({"restart": 1})


def test_bad_inputs_of_the_api_are_one_line_errors():
    for call, needle in [
        (lambda: scale.predict("hope", 8, 1.0), "strategy: 'hope' is not known: allowed checkpoint_restart"),
        (lambda: scale.predict("shrink", 0, 1.0), "world: 0 is not allowed"),
        (lambda: scale.predict("shrink", 8, -1.0), "mtbf_hours: -1.0 is not allowed"),
        (lambda: scale.predict("shrink", 8), "give a rank MTBF, a node MTBF or both"),
        (lambda: scale.predict("checkpoint_restart", 8, 1.0, regrow=True), "nothing to regrow"),
        (lambda: scale.predict("shrink", 8, 1.0, method="guess"), "method: 'guess' is not known"),
        (lambda: scale.predict("shrink", 8, 1.0, step_s=0.0), "step_s: 0.0 is not allowed"),
    ]:
        with pytest.raises(ConfigError, match=needle):
            call()


def test_the_cli_answers_and_refuses_bad_input_in_one_line(capsys):
    code, out, err = cli(capsys, "scale", "--strategy", "shrink", "--world", "4096", "--mtbf-hours", "30000")
    assert code == 0 and "effective training time: " in out and err == ""
    code, out, _ = cli(capsys, "scale", "--world", "4096", "--job-mtbf-hours", "3", "--json",
                       "--restart-s", "600", "--checkpoint-s", "60", "--step-s", "5")
    assert code == 0 and '"strategy": "checkpoint_restart"' in out
    for argv, needle in [
        (["--mtbf-hours", "-3"], "argument --mtbf-hours: '-3' is not allowed: a number of hours > 0"),
        (["--strategy", "hope", "--mtbf-hours", "3"], "argument --strategy: invalid choice: 'hope'"),
        (["--world", "many", "--mtbf-hours", "3"], "argument --world: 'many' is not allowed: an integer >= 1"),
        (["--mtbf-hours", "3", "--step-s", "nan"], "argument --step-s: 'nan' is not allowed"),
        (["--world", "8"], "mtbf_hours: give a rank MTBF, a node MTBF or both"),
        (["--mtbf-hours", "3", "--costs", "no/such.json"], "costs: no/such.json: cannot be read"),
    ]:
        code, out, err = cli(capsys, "scale", *argv)
        assert code == 2 and out == "" and "Traceback" not in err, err
        assert len(err.strip().splitlines()) == 1 and needle in err, err


def test_one_simulated_point_at_100k_ranks_over_30_days_is_fast():
    """The speed gate's figure (benchmarks/gate.py, scale_des_100k) holds ≤ 10 s; here a loose 10 s too."""
    from workbench.strategies.scale.simulate import SPEED_POINT

    started = time.perf_counter()
    r = scale.predict(**SPEED_POINT)
    assert time.perf_counter() - started < 10.0
    assert r.method == "simulation" and r.failures > 1000 and 0 < r.effective < 1
