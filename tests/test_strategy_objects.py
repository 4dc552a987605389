"""workbench/strategies/registry.py: one object per strategy, looked up once; no strategy name compared anywhere
else; the docs' worked example (``rollback_then_restart``: rollback for the first failure, checkpoint_restart
after) added as one object, checked here on the membership machine and on a real run."""

from __future__ import annotations

import ast
import time
from pathlib import Path

import pytest

import workbench
from workbench import strategies
from workbench.base import checkpoint, modes
from workbench.base.errors import ConfigError
from workbench.config.run import PARALLEL_STRATEGIES, PARALLELISMS, REGROW_STRATEGIES, STRATEGIES, RunConfig
from workbench.strategies import Reaction
from workbench.supervisor.membership import Generation, Lost, Membership, Restart, Retire, Start

pytestmark = pytest.mark.usefixtures("no_leaks")

ROOT = Path(__file__).resolve().parents[1]
ROOM = {ROOT / "workbench" / "strategies" / "registry.py"}
# the reproductions read result tables, whose rows are labelled by strategy name: selecting rows is not behaviour
RESULT_READERS = ("campaigns/reproduce/",)
# names that mean something else too (an augment "none", a pipeline's "forward" phase, apoptosis's "shrink"): a
# comparison with them counts when the other side speaks of a strategy
AMBIGUOUS = {"none", "forward", "shrink"}
ABOUT_STRATEGY = ("strategy", "recovery", "recovering", "peer")


def test_every_name_is_one_frozen_object_and_the_config_tables_are_read_from_them():
    assert STRATEGIES == tuple(strategies.REGISTRY)
    for name, strategy in strategies.REGISTRY.items():
        assert strategies.get(name) is strategy and strategy.name == name
        with pytest.raises(AttributeError):
            strategy.name = "other"  # frozen
        assert not strategy.regrow or strategy.reaction is Reaction.REGROUP
        assert not strategy.writes_checkpoints or strategy.checkpoint_every
        assert (strategy.peer is not None) == (strategy.reaction is Reaction.PEER)
    assert REGROW_STRATEGIES == ("shrink", "rollback", "forward")
    assert set(PARALLEL_STRATEGIES) == set(PARALLELISMS)  # each mode names the strategies it allows
    assert all(m.strategies is None or set(m.strategies) <= set(STRATEGIES) for m in modes.REGISTRY.values())
    assert PARALLEL_STRATEGIES["pipeline"] == ("none", "checkpoint_restart", "reinit")
    assert PARALLEL_STRATEGIES["data"] == STRATEGIES
    with pytest.raises(ConfigError, match=r"^strategy: 'nope' is not known: allowed none, checkpoint_restart"):
        strategies.get("nope")


def test_escalation_recovers_the_first_failure_by_rollback_and_every_later_one_by_restart():
    example = strategies.get("rollback_then_restart")
    assert [example.recovering(n).name for n in range(3)] == ["rollback", "checkpoint_restart", "checkpoint_restart"]
    assert strategies.ROLLBACK.recovering(5) is strategies.ROLLBACK
    # its ranks keep what both need: the pre-update state of each step and a checkpoint every 25 steps
    assert example.snapshot_buckets and example.writes_checkpoints and example.checkpoint_every == 25
    assert RunConfig(strategy="rollback_then_restart").checkpoint_every == 25
    with pytest.raises(ConfigError, match="^regrow: .*it restarts ranks after the first failure"):
        RunConfig(strategy="rollback_then_restart", regrow=True)
    with pytest.raises(ConfigError, match="does not apply to parallelism 'gossip'"):
        RunConfig(strategy="rollback_then_restart", parallelism="gossip")


def test_membership_follows_the_escalation():
    m = Membership("rollback_then_restart", 4)
    starts = m.start()
    for s in starts:
        decisions = m.ready(s.id)
    (first,) = [d for d in decisions if isinstance(d, Generation)]
    out = m.died(first.holders[2], "was killed (SIGKILL)", step=40)
    (gen,) = [d for d in out if isinstance(d, Generation)]
    assert gen.recovery == "rollback" and gen.members == (0, 1, 3) and gen.resume is None
    m.checkpoint("/ckpt/step_000090.h5")
    out = m.died(gen.holders[1], "was killed (SIGKILL)", step=100)
    assert isinstance(out[-1], Restart)
    out += m.restart()  # as the supervisor does once the retired ranks' last reports are read
    (lost,) = [d for d in out if isinstance(d, Lost)]
    assert lost.world_size_after == 4 and any(isinstance(d, Retire) for d in out)
    fresh = [d for d in out if isinstance(d, Start)]
    assert sorted(s.label for s in fresh) == [0, 1, 2, 3]
    for s in fresh:
        decisions = m.ready(s.id)
    (restarted,) = [d for d in decisions if isinstance(d, Generation)]
    assert restarted.recovery == "checkpoint_restart" and restarted.resume == "/ckpt/step_000090.h5"
    assert restarted.members == (0, 1, 2, 3)


def _strategy_comparisons(path: Path, root: Path = ROOT) -> list[str]:
    source = path.read_text()
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Compare):
            continue
        sides = [node.left, *node.comparators]
        for side in sides:
            values = side.elts if isinstance(side, (ast.Tuple, ast.List, ast.Set)) else [side]
            names = {v.value for v in values if isinstance(v, ast.Constant) and v.value in strategies.REGISTRY}
            text = (ast.get_source_segment(source, node) or "") if names else ""  # slow: only where it is read
            for name in names:
                if name not in AMBIGUOUS or any(word in text for word in ABOUT_STRATEGY):
                    found.append(f"{path.relative_to(root)}:{node.lineno}: {text}")
    return found


def test_no_strategy_name_is_compared_outside_the_strategies_room():
    files = [p for p in sorted((ROOT / "workbench").rglob("*.py"))
             if p not in ROOM and not p.relative_to(ROOT / "workbench").as_posix().startswith(RESULT_READERS)]
    assert len(files) > 50
    offenders = [hit for path in files for hit in _strategy_comparisons(path)]
    assert offenders == []


def test_the_scan_finds_a_planted_comparison(tmp_path):
    planted = tmp_path / "planted.py"
    planted.write_text('def f(config, mode):\n    if config.strategy in ("rollback", "shrink"):\n        pass\n'
                       '    return mode == "forward", config.recovery != "none"\n')
    hits = _strategy_comparisons(planted, tmp_path)
    assert len(hits) == 3 and not any('mode == "forward"' in hit for hit in hits)


def test_the_worked_example_runs_rollback_then_a_restart_from_the_checkpoint(tmp_path):
    """Two kills: the first is rolled back (world 3, nothing lost or redone), the second restarts the world from
    the checkpoint of step 90 (10 steps redone); the final weights match the run without a fault."""
    steps, common = 140, dict(world_size=4, eval_interval=140, checkpoint_every=30)
    golden = workbench.run(steps=steps, out=tmp_path / "golden", **common)
    result = workbench.run(steps=steps, strategy="rollback_then_restart", out=tmp_path / "example",
                           faults=["kill:rank=2,step=40", "kill:rank=1,step=100"], **common)
    assert result.completed, result.summary["reason"]
    first, second = result.failures
    assert (first["samples_lost"], first["steps_redone"], first["world_size_after"]) == (0, 0, 3)
    assert (second["samples_lost"], second["steps_redone"], second["world_size_after"]) == (0, 10, 4)
    assert [row["step"] for row in result.metrics] == list(range(100)) + list(range(90, steps))
    assert result.summary["world_size_final"] == 4 and result.summary["replicas_identical"]
    ours = checkpoint.load(result.summary["final_checkpoint"]).model
    reference = checkpoint.load(golden.summary["final_checkpoint"]).model
    assert max((ours[k] - reference[k]).abs().max().item() for k in ours) < 1e-4


def test_a_restart_skips_checkpoints_that_do_not_verify():
    bad = {"/c/step_000090.h5": "checksum mismatch in model/fc1.weight", "/c/step_000060.h5": "is empty (0 bytes)"}
    m = Membership("checkpoint_restart", 2, verify=bad.get)
    for s in m.start():
        first = m.ready(s.id)
    for path in ("/c/step_000030.h5", "/c/step_000060.h5", "/c/step_000090.h5"):
        m.checkpoint(path)
    out = m.died(first[0].holders[1], "was killed (SIGKILL)", step=100)
    out += m.restart()
    skipped = [d.detail for d in out if getattr(d, "kind", None) == "checkpoint_skipped"]
    assert len(skipped) == 2 and "step_000090.h5 cannot be resumed from (checksum mismatch" in skipped[0]
    assert "trying checkpoint /c/step_000030.h5" in skipped[1] and m.resume == "/c/step_000030.h5"
    for s in [d for d in out if isinstance(d, Start)]:
        decisions = m.ready(s.id)
    assert [d.resume for d in decisions if isinstance(d, Generation)] == ["/c/step_000030.h5"]
    # nothing verifies: the world starts again from step 0
    m2 = Membership("checkpoint_restart", 2, verify=lambda path: "corrupt")
    for s in m2.start():
        first = m2.ready(s.id)
    m2.checkpoint("/c/step_000030.h5")
    out = m2.died(first[0].holders[0], "was killed (SIGKILL)", step=40)
    out += m2.restart()
    assert m2.resume is None and any("resume from step 0" in getattr(d, "detail", "") for d in out)


def test_checkpoint_restart_falls_back_from_a_corrupt_latest_checkpoint(tmp_path):
    """Rank 2 freezes at step 95; while the supervisor waits for its heartbeat, a bit of the latest checkpoint
    (step 90) is flipped at rest: the restart verifies it, says so, and resumes from step 60."""
    import h5py

    run = workbench.start(world_size=4, steps=140, eval_interval=140, strategy="checkpoint_restart",
                          checkpoint_every=30, heartbeat_timeout=2.0, faults=["hang:rank=2,step=95"],
                          out=tmp_path / "run")
    try:
        deadline = time.monotonic() + 120
        while not any(e["kind"] == "hang" for e in list(run.events)):
            assert time.monotonic() < deadline, "the planned hang did not fire"
            time.sleep(0.02)
        latest = tmp_path / "run" / "checkpoints" / "step_000090.h5"
        with h5py.File(latest, "r+") as f:  # one flipped bit in one weight, its checksum left as it was
            weight = f["model/fc1.weight"]
            values = weight[()]
            values.view("uint32")[0, 0] ^= 1 << 30
            weight[...] = values
        result = run.wait(timeout=120)
    except BaseException:
        run.stop()
        run.wait(timeout=60)
        raise
    assert result.completed, result.summary["reason"]
    skipped = [e for e in result.events if e["kind"] == "checkpoint_skipped"]
    assert len(skipped) == 1 and "step_000090.h5 cannot be resumed from (checksum mismatch in model/fc1.weight)" \
        in skipped[0]["detail"] and "trying checkpoint" in skipped[0]["detail"]
    (failure,) = result.failures
    assert failure["steps_redone"] == 95 - 60
    assert [row["step"] for row in result.metrics] == list(range(95)) + list(range(60, 140))
    assert result.summary["replicas_identical"]
