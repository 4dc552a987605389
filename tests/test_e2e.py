"""One end-to-end test per part of the product, fast tier (a few seconds each, 2-4 ranks, the digits MLP): a
checkpoint restart, an interrupted sweep, a flip into an HDF5 checkpoint, the lab panel's fault buttons and a
failure during a recovery. ULFM's lives in tests/test_ulfm.py, torchft's in tests/test_peers.py (docs/testing.md).
"""

from __future__ import annotations

import json
import signal
import struct
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

import workbench
from workbench.base import checkpoint as ckpt
from workbench.base.protocol import HEARTBEAT_PERIOD
from workbench.faults.outcomes import classify
from workbench.launch import cli
from workbench.launch.lab import Lab
from workbench.launch.sweeps.run import is_complete, point_id
from workbench.results.run_result import RunResult
from workbench.supervisor.watchdog import FLOOR_S

GATED = Path(__file__).parent / "notebooks" / "gated_sweep.ipynb"
# checkpoint_restart on 2 ranks; checkpoints every 5 steps are written in the background, so a kill at step 12
# resumes from step 10 or, when that copy had not finished, step 5: the test reads which from the events
CR = {"world_size": 2, "steps": 30, "strategy": "checkpoint_restart", "checkpoint_every": 5, "eval_interval": 30}
KILL = 12


def wait_for(predicate: Callable[[], bool], timeout: float = 60.0, what: str = "condition") -> None:
    """Poll ``predicate`` until true; fail after ``timeout`` s (a bound on a condition, not a sleep)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"{what}: not reached in {timeout:g} s"
        time.sleep(0.02)


def final_state(result: RunResult) -> ckpt.Checkpoint:
    return ckpt.load(result.summary["final_checkpoint"])


def assert_bitwise(ours: ckpt.Checkpoint, reference: ckpt.Checkpoint) -> None:
    """Same step, weights and optimizer state, bit for bit."""
    assert ours.step == reference.step
    assert ours.model.keys() == reference.model.keys() and ours.optimizer.keys() == reference.optimizer.keys()
    for name, tensor in reference.model.items():
        assert torch.equal(ours.model[name], tensor), name
    for name, state in reference.optimizer.items():
        assert state.keys() == ours.optimizer[name].keys(), name
        for key, value in state.items():
            assert torch.equal(ours.optimizer[name][key], value), (name, key)


def losses(result: RunResult) -> list[tuple[int, float]]:
    return [(row["step"], row["loss"]) for row in result.metrics]


def resumed_at(result: RunResult) -> list[int]:
    return [e["step"] for e in result.events if e["kind"] == "recovered"]


@pytest.fixture(scope="module")
def golden(tmp_path_factory: pytest.TempPathFactory) -> RunResult:
    """The failure-free checkpoint_restart run (its checkpoints are the flip test's input)."""
    result = workbench.run(CR, out=tmp_path_factory.mktemp("golden"))
    assert result.completed and [s for s, _ in losses(result)] == list(range(CR["steps"]))
    return result


def test_checkpoint_restart_after_a_kill_is_bitwise_the_failure_free_run(golden, tmp_path):
    """A rank SIGKILLed mid-run: the world restarts from the newest checkpoint; every loss (before the kill and
    after the resume) and the final weights and optimizer state equal the failure-free run's exactly."""
    result = workbench.run({**CR, "faults": [f"kill:rank=1,step={KILL}"]}, out=tmp_path)
    assert result.completed, result.summary["reason"]
    (failure,) = result.failures
    assert (failure["rank"], failure["step"], failure["cause"]) == (1, KILL, "died (SIGKILL)")
    (resume,) = resumed_at(result)
    assert resume in (5, 10) and failure["steps_redone"] == KILL - resume and failure["world_size_after"] == 2
    reference = dict(losses(golden))
    assert losses(result) == [(s, reference[s]) for s in [*range(KILL), *range(resume, CR["steps"])]]
    assert_bitwise(final_state(result), final_state(golden))


def test_a_second_kill_during_the_restart_is_recovered_and_still_bitwise(golden, tmp_path):
    """A failure during a recovery: rank 1 dies at step 12; while the restarted world joins (its generation
    announced, not yet recovered) rank 0 is killed too. The restart starts again and the run ends bitwise where the
    failure-free run ends, with both failures recorded and one recovery."""
    box: dict[str, Any] = {}

    def kill_during_the_restart(kind: str, payload: dict[str, Any]) -> None:
        if kind == "event" and payload["kind"] == "generation" and payload["detail"].startswith("generation 1:"):
            try:
                box["run"].kill(0)
                box["killed"] = payload["time"]
            except Exception as exc:  # noqa: BLE001 - a refused kill is asserted below, not swallowed
                box["error"] = exc

    run = workbench.start({**CR, "faults": [f"kill:rank=1,step={KILL}"]}, out=tmp_path,
                          on_event=kill_during_the_restart)
    box["run"] = run
    result = run.wait(timeout=120)
    assert "error" not in box and "killed" in box, box
    assert result.completed, result.summary["reason"]
    assert [(f["rank"], f["cause"]) for f in result.failures] == [(1, "died (SIGKILL)"), (0, "died (SIGKILL)")]
    kinds = [(e["kind"], e["rank"]) for e in result.events if e["kind"] in ("failure", "restart", "recovered")]
    # the second failure came before the first recovery finished: two restarts, one recovery, after both
    assert kinds == [("failure", 1), ("restart", -1), ("failure", 0), ("restart", -1), ("recovered", -1)]
    assert result.summary["world_size_final"] == 2 and result.summary["steps_completed"] == CR["steps"]
    (resume,) = resumed_at(result)
    reference = dict(losses(golden))
    assert losses(result) == [(s, reference[s]) for s in [*range(KILL), *range(resume, CR["steps"])]]
    assert_bitwise(final_state(result), final_state(golden))


@pytest.mark.parametrize("strategy", ["rollback", "shrink+regrow"])
def test_two_ranks_dying_in_one_step_are_recovered(strategy):
    """Two failures in one step: the supervisor announces a generation without the first dead rank, then one
    without the second; the survivors' rendezvous for the first (its member already dead) must not hold back the
    second's (each group's rendezvous has a store connection of its own). It hung at step 12 before."""
    regrow = strategy.endswith("+regrow")
    # 300 steps (~1 s): the replacements have time to join before the last step (one admitted after it is not)
    run = workbench.start(world_size=4, steps=300, strategy=strategy.removesuffix("+regrow"), regrow=regrow,
                          faults=["kill:rank=2,step=12", "kill:rank=3,step=12"])
    result = run.wait(timeout=90)
    assert result.completed, result.summary["reason"]
    assert sorted(f["rank"] for f in result.failures) == [2, 3]
    assert result.summary["steps_completed"] == 300
    assert result.summary["world_size_final"] == (4 if regrow else 2)
    # rollback redoes the whole mini-batch; shrink goes on without the dead ranks' shares of the failed step
    lost = 0 if strategy == "rollback" else 2 * 64 // 4  # digits' global batch 64 over 4 ranks
    assert result.summary["samples_lost_total"] == lost and result.summary["steps_redone_total"] == 0


def test_a_planned_kill_fires_after_the_others_of_its_step_changed_the_world():
    """Ranks 1 and 3 die at step 2's fault point; rank 2, slowed there, reaches its own after their deaths were
    announced: its wait for the exchange meets the new generation, and its kill fires all the same (it was lost,
    and the run went on with rank 2, 1 time in 60 under load without the slow-down)."""
    result = workbench.run(world_size=4, steps=10, strategy="shrink",
                           faults=["kill:rank=1,step=2", "kill:rank=3,step=2", "kill:rank=2,step=2",
                                   "slow:rank=2,step=2,factor=100,until=3"])
    assert result.completed, result.summary["reason"]
    assert sorted((f["rank"], f["step"]) for f in result.failures) == [(1, 2), (2, 2), (3, 2)]
    assert result.summary["world_size_final"] == 1 and not [e for e in result.events if e["kind"] == "fault_skipped"]


def test_a_planned_fault_that_never_fires_is_said_at_the_end():
    """Rank 3 is gone at step 5 (shrink), so its kill planned at step 20 cannot fire: the run says so."""
    result = workbench.run(world_size=4, steps=30, strategy="shrink", faults=["kill:rank=3,step=5",
                                                                              "kill:rank=3,step=20"])
    assert result.completed and [f["step"] for f in result.failures] == [5]
    (skipped,) = [e for e in result.events if e["kind"] == "fault_skipped"]
    assert (skipped["step"], skipped["rank"]) == (20, 3)
    assert skipped["detail"].startswith("kill:rank=3,step=20 did not fire: rank 3 did not reach step 20")


# a hang that came back 1 time in 6 passes n runs with probability (5/6)**n: 26 runs catch it at >= 99 % (25: 98.9 %)
REPEATS = 26


def finish_at_the_first_regrow(attempt: int) -> RunResult:
    """Three of four ranks killed at step 2 of a run of a million steps; the run is asked to finish (``run.finish``:
    3 steps past the furthest committed) as the first fresh replacement is admitted, so that the other, started at
    the same moment, comes up about as the members finish, whatever the machine's load."""
    box: dict[str, Any] = {}

    def on_event(kind: str, payload: dict[str, Any]) -> None:
        if kind == "event" and payload["kind"] == "regrow" and "finish" not in box:
            box["finish"] = payload["detail"]
            box["run"].finish()

    run = box["run"] = workbench.start(world_size=4, steps=1_000_000, strategy="shrink", regrow=True,
                                       faults=[f"kill:rank={r},step=2" for r in (1, 2, 3)], on_event=on_event)
    try:
        return run.wait(timeout=30)  # ~1 s each on the 2-core VM under load
    except TimeoutError:
        run.stop()
        run.wait(timeout=30)
        raise AssertionError(f"run {attempt + 1} of {REPEATS} hung: {run.status}, {run.events}") from None


def assert_ended_with_those_that_finished(result: RunResult) -> None:
    """The warm spare took the first dead rank's place at once (world size 4, then 3, then 2: the survivor and
    the spare); fresh processes were started for the other two. The world at the end is the members that
    finished: the survivor and each replacement that joined (``regrow_s``: from its first ``joined``), the first
    fresh one always (admitted before the finish was asked), the second where it joined before the end."""
    (finish,) = [e for e in result.events if e["kind"] == "finish"]
    # members a loaded machine let train on before the finish reached them end where they are, all at one step
    steps = result.summary["steps_completed"]
    assert result.completed and steps >= finish["steps"], result.summary["reason"]
    assert [f["world_size_after"] for f in result.failures] == [4, 3, 2], result.failures
    joined = [f["rank"] for f in result.failures if f["regrow_s"] is not None]
    (first,) = [e for e in result.events if e["kind"] == "regrow"][:1]
    spare, admitted = result.failures[0]["rank"], json.loads(first["detail"].split(" rejoined")[0].split("ranks ")[1])
    assert {spare, *admitted} <= set(joined), (joined, result.failures, first)
    world = 1 + len(joined)
    assert result.summary["world_size_final"] == world, (joined, result.summary, result.events)
    assert result.summary["reason"] == (f"finished at a step boundary as asked: {steps} of 1000000 steps "
                                        f"done with world size {world}")
    assert result.summary["replicas_identical"]


def test_replacements_ready_as_the_last_step_is_committed_do_not_hold_the_run():
    """Three of four ranks die in one step; fresh replacements come up while the survivor and the spare train
    the rest: one admitted as they finished waits for them in a generation they never join. The run ended as a
    hang 1 time in 6; now it ends, its world the members that finished. Repeated ``REPEATS`` times, each run
    ending as its second replacement comes up (:func:`finish_at_the_first_regrow`): with the old end rule (all
    members done) 6 runs of 30 hung at load 2 (a fixed 30 steps: 1 of 30 at load 2, 6 of 30 at load 4)."""
    for attempt in range(REPEATS):
        assert_ended_with_those_that_finished(finish_at_the_first_regrow(attempt))


def ieee_flip(value: float, bit: int) -> float:
    (word,) = struct.unpack("<I", struct.pack("<f", value))
    return struct.unpack("<f", struct.pack("<I", word ^ (1 << bit)))[0]


def test_a_flip_into_a_checkpoint_resumes_and_is_classified_against_the_golden_run(golden, tmp_path, capsys):
    """``workbench flip`` alters the golden run's checkpoint of step 15; the unaltered checkpoint resumes to
    exactly the golden run (masked, delta 0); an exponent flip (bit 30) resumes to non-finite losses and is
    classified ``nonfinite``, a mantissa flip (bit 0) ``masked`` though its losses differ."""
    source = Path(golden.summary["final_checkpoint"]).parent / "step_000015.h5"
    assert ckpt.verify(source) == []
    clean = workbench.run({**CR, "resume": str(source)}, out=tmp_path / "clean")
    reference = dict(losses(golden))
    assert losses(clean) == [(s, reference[s]) for s in range(15, CR["steps"])]
    assert classify(clean, golden) | {"accuracy": None} == {
        "outcome": "masked", "detected": False, "recovered": False, "accuracy": None, "accuracy_delta": 0.0,
        "flips": 0}

    found = {}
    for bit in (30, 0):
        altered, log = tmp_path / f"bit{bit}.h5", tmp_path / f"bit{bit}.jsonl"
        assert cli.main(["flip", str(source), "--dataset", "model/fc1.weight", "--index", "7", "--bit", str(bit),
                         "--out", str(altered), "--log", str(log)]) == 0
        capsys.readouterr()
        record = json.loads(log.read_text())
        assert record["bits"] == [bit] and record["new"] == ieee_flip(record["old"], bit)
        assert ckpt.verify(altered) == ["model/fc1.weight"]  # its checksum sees the flip
        result = workbench.run({**CR, "resume": str(altered), "resume_verify": False}, out=tmp_path / f"r{bit}")
        assert result.completed, result.summary["reason"]
        found[bit] = (classify(result, golden)["outcome"], [loss for _, loss in losses(result)])
    assert found[30][0] == "nonfinite" and not all(map(torch.isfinite, torch.tensor(found[30][1])))
    assert found[0][0] == "masked" and found[0][1] != [reference[s] for s in range(15, CR["steps"])]


def test_the_lab_panels_kill_hang_stall_and_flip_buttons_hit_a_live_run():
    """The panel driven as its buttons are, no browser: Flip on rank 0, then Kill 3, Hang 2 and Stall 1, each
    waited for until recovered; the run's events name the fault, its rank and how it was found."""
    lab = Lab(world_size=4, steps=100_000, strategy="shrink", progress_timeout=FLOOR_S)  # the watchdog's floor
    try:
        lab.start_button.click()
        run = lab.run
        wait_for(lambda: len(run.metrics) > 5, what="training")
        lab.flip_rank.value, lab.flip_index.value, lab.flip_bit.value = 0, 3, 23
        lab.flip_button.click()
        wait_for(lambda: any(e["kind"] == "flip" for e in run.events), what="the flip")
        (flip,) = [e for e in run.events if e["kind"] == "flip"]
        head, values = flip["detail"].split(": ")
        old, new = (float(v) for v in values.split(" -> "))
        # a Lab() given no model trains the demo's workload, MNIST-1D's MLP: its first layer is linear1
        assert (flip["rank"], head, new) == (0, "weight linear1.weight[3] bit 23", ieee_flip(old, 23))
        causes = {"Kill 3": "died (SIGKILL)", "Hang 2": "froze (no heartbeat for 2 s)",
                  "Stall 1": f"stalled (alive, but no step committed for {FLOOR_S:g} s)"}
        for n, (column, button) in enumerate([(3, 0), (2, 1), (1, 2)], start=1):
            pressed = lab.rank_buttons.children[column].children[button]
            pressed.click()
            wait_for(lambda n=n: len(resumed_at(run)) == n, what=pressed.description)
            events = [e for e in run.events if e["rank"] == column and e["kind"] in ("kill", "hang", "stall",
                                                                                     "failure")]
            assert [e["kind"] for e in events] == [pressed.description.split()[0].lower(), "failure"], events
            assert events[1]["detail"] == f"rank {column} {causes[pressed.description]}"
            assert run.status["members"] == list(range(4 - n))
            wait_for(lambda b=pressed: b.disabled, what="the dead rank's buttons greyed")
    finally:
        lab.stop_button.click()
    result = run.wait(timeout=60)
    assert [(f["rank"], f["world_size_after"]) for f in result.failures] == [(3, 3), (2, 2), (1, 1)]
    hang, stall = result.failures[1:]
    # neither found before its limit: a hang is judged from the last heartbeat heard, up to one period before it
    assert hang["detection_s"] >= 2.0 - HEARTBEAT_PERIOD and stall["detection_s"] >= FLOOR_S
    lab.close()


def test_an_interrupted_sweep_resumes_and_runs_each_point_once(tmp_path):
    """2 points, one job: SIGINT once the first point is complete (the second waits on a gate, so the signal lands
    in it); the resumed sweep runs exactly the second, and the first point's files are untouched."""
    out, gate = tmp_path / "sweep", tmp_path / "gate"
    argv = [sys.executable, "-m", "workbench", "sweep", str(GATED), "-p", "a", "0", "1", "-p", "gate",
            str(gate), "--out", str(out), "--no-progress"]
    first, later = point_id({"a": 0, "gate": str(gate)}), [point_id({"a": a, "gate": str(gate)}) for a in (1,)]
    proc = subprocess.Popen([*argv, "--jobs", "1"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        wait_for(lambda: is_complete(out / first) or proc.poll() is not None, what="the first point")
        assert proc.poll() is None, proc.communicate()
        wait_for(lambda: (out / later[0] / "point.json").is_file(), what="the second point's start")
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 130 and "interrupted" in err
    assert [is_complete(out / p) for p in (first, *later)] == [True, False]
    kept = {name: (out / first / name).read_bytes() for name in ("point.json", "result.h5")}
    started = json.loads(kept["point.json"])["started"]

    gate.touch()
    resumed = subprocess.run([*argv, "--jobs", "1"], capture_output=True, text=True, timeout=120)
    assert resumed.returncode == 0, resumed.stderr
    assert "2 points: 1 executed (1 completed, 0 failed)" in resumed.stdout, resumed.stdout
    assert {name: (out / first / name).read_bytes() for name in kept} == kept  # not run again
    assert all(json.loads((out / p / "point.json").read_text())["started"] > started for p in later)
    assert sorted(RunResult.load(out / p).config["seed"] for p in (first, *later)) == [0, 1]
