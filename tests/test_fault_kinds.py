"""workbench/faults/kinds.py: one object per fault kind, looked up once; no fault kind compared anywhere else; the
docs' worked example (``delay:rank=R,step=S,ms=M``: a rank's messages of one step held back) added as one object,
checked here on its own and on a real run."""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest
from structure_tool import comparisons

import workbench
from workbench import strategies
from workbench.base import checkpoint, protocol
from workbench.base.errors import ConfigError
from workbench.config.fields import SETTINGS
from workbench.config.run import FAULT_KINDS, RunConfig
from workbench.faults import events, kinds
from workbench.faults.kinds import Fires
from workbench.faults.spec import FaultSpec, RandomFailures

pytestmark = pytest.mark.usefixtures("no_leaks")

ROOT = Path(__file__).resolve().parents[1]
ROOM = {ROOT / "workbench" / "faults" / "kinds.py"}
NAMES = {*kinds.REGISTRY, kinds.RANDOM}
# the names are words of other vocabularies too (a column "slow", an event "resize", the protocol's "kill" and
# "flip" messages): a comparison counts where the other side speaks of a kind, a fault or a command's name
ABOUT_KIND = ("kind", "fault", "name", "command")
# a bare ``kind`` is also the protocol's message kind: comparing it with a message's name is message dispatch
MESSAGES = {*protocol.CONTROL_KINDS, *protocol.TEMPLATE_KINDS}


def test_every_kind_is_one_frozen_object_and_the_tables_are_read_from_them():
    assert FAULT_KINDS == tuple(kinds.REGISTRY) and "delay" in FAULT_KINDS
    for name, kind in kinds.REGISTRY.items():
        assert kinds.get(name) is kind and kind.name == name
        with pytest.raises(AttributeError):
            kind.name = "other"  # frozen
        assert all(form.startswith(f"{name}:") for form in kind.grammar)
        assert kind.signal in (None, "SIGKILL", "SIGSTOP") and not (kind.signal and kind.blocks)
        assert kind.names_rank or kind.fires is Fires.BOUNDARY
        assert kind.button is None or kind.live  # a button fires the kind live
        assert events.get(name).fault and events.get(name).marker.live  # its event, marked in the lab
    assert [name for name in kinds.REGISTRY if kinds.get(name).accepts(peer=True)] == ["kill", "hang"]
    assert RandomFailures(mtbf_steps=5).kind in kinds.RANDOM_NAMES == ("kill", "slow")
    assert all(form in SETTINGS["faults"].help for form in kinds.GRAMMAR)
    with pytest.raises(ConfigError, match=r"^fault: kind 'nope' is not known: allowed kill, hang, .*delay, random$"):
        kinds.get("nope")


def _kind_comparisons(path: Path, root: Path = ROOT) -> list[str]:
    return comparisons("a fault kind", path, root)  # tools/check_structure.py's rule, run on one file


def test_no_fault_kind_is_compared_outside_the_kinds_room():
    files = [p for p in sorted((ROOT / "workbench").rglob("*.py")) if p not in ROOM]
    assert len(files) > 50
    offenders = [hit for path in files for hit in _kind_comparisons(path)]
    assert offenders == []


def test_the_scan_finds_a_planted_comparison(tmp_path):
    planted = tmp_path / "planted.py"
    planted.write_text('def f(fault, m, name, kind, c):\n    if fault.kind in ("kill", "hang"):\n        pass\n'
                       '    a = m["kind"] == "stall", name == "slow", kind == "resize", m.get("kind") == "random"\n'
                       '    return kind == "flip", c in ("cpu_s", "slow")\n')
    hits = _kind_comparisons(planted, tmp_path)
    assert len(hits) == 5 and not any('kind == "flip"' in hit or "cpu_s" in hit for hit in hits)


# -- the worked example: delay ----------------------------------------------------------------------------------
def test_delay_is_parsed_printed_and_checked():
    fault = FaultSpec.parse("delay:rank=1,step=5,ms=300")
    assert fault == FaultSpec("delay", 1, step=5, ms=300) and str(fault) == "delay:rank=1,step=5,ms=300"
    assert kinds.of(fault) is kinds.DELAY and kinds.DELAY.fires is Fires.RANK and kinds.DELAY.signal is None
    assert RunConfig(world_size=2, faults=[{"kind": "delay", "rank": 0, "time": 1.5, "ms": 20}]).faults[0].ms == 20


@pytest.mark.parametrize("fault,message", [
    ("delay:rank=1,step=5", "delay needs ms=M, an integer 1..600000"),
    ("delay:rank=1,step=5,ms=0", "delay needs ms=M, an integer 1..600000"),
    ("delay:rank=1,step=5,ms=x", "ms='x' in 'delay:rank=1,step=5,ms=x' is not a number"),
    ("delay:rank=1,step=5,ms=9,factor=2", "'factor=2' in .* is not one of rank=R, step=S, time=T, ms="),
    ("delay:step=5,ms=9", "names no rank"),
    ("kill:rank=1,step=5,ms=9", "'ms=9' in .* is not one of rank=R, step=S, time=T$"),
])
def test_bad_delays_are_refused_in_one_line(fault, message):
    with pytest.raises(ConfigError, match=message) as caught:
        RunConfig(world_size=2, steps=20, faults=[fault])
    assert "\n" not in str(caught.value)


def test_a_peer_strategy_refuses_a_delay_in_the_one_place_that_decides():
    with pytest.raises(ConfigError, match="'torchrun' runs the peer system as its users do; delay faults are ours"):
        kinds.refuse_on_peer("torchrun", [FaultSpec("delay", 1, step=3, ms=5)])
    kinds.refuse_on_peer("torchrun", [FaultSpec("kill", 1, step=3), RandomFailures(mtbf_steps=5)])
    assert strategies.get("torchrun").peer is not None


def test_a_delayed_run_is_bitwise_the_failure_free_run_and_its_step_takes_the_delay_longer(tmp_path):
    """Rank 0's messages of step 6 are held back 400 ms: rank 1 waits for them in the exchange, and rank 0's own step
    (the step time the run records) takes at least 400 ms, ~350 ms over its median; nothing else changes (the final
    weights are bitwise those of the run without)."""
    steps, common = 12, dict(world_size=2, eval_interval=12, seed=3)
    golden = workbench.run(steps=steps, out=tmp_path / "golden", **common)
    result = workbench.run(steps=steps, out=tmp_path / "delay", faults=["delay:rank=0,step=6,ms=400"], **common)
    assert result.completed and result.summary["world_size_final"] == 2 and not result.failures
    (event,) = [e for e in result.events if e["kind"] == "delay"]
    assert (event["step"], event["rank"]) == (6, 0)
    times = {row["step"]: row["step_time"] for row in result.metrics}
    others = [t for s, t in times.items() if s not in (0, 6)]
    # the 400 ms are inside rank 0's step 6; the step's own work overlaps them (the earlier buckets' exchange runs
    # in the background while the rank holds its last one), so the step is 400 ms plus less than a whole step
    assert times[6] >= 0.4 and times[6] - statistics.median(others) >= 0.35
    ours = checkpoint.load(result.summary["final_checkpoint"]).model
    reference = checkpoint.load(golden.summary["final_checkpoint"]).model
    assert all(ours[k].equal(reference[k]) for k in reference)
