"""The peer systems as strategies: torchft (lighthouse, Manager, its DDP/optimizer) and torchrun (restart the
world from the last checkpoint), on our harness with our faults and figures."""

import subprocess
import sys
import threading
from typing import Any

import pytest

import workbench
from workbench.base.errors import ConfigError
from workbench.config.run import RunConfig
from workbench.workloads.data import BatchSequence, load_dataset, sample_checksum, shard

TINY = {"world_size": 2, "steps": 100, "eval_interval": 50, "hidden": [32], "seed": 1}
# a torchft run that goes on until the test ends it: at the heal (run.stop, or run.finish to compare the weights)
ENDLESS = {"steps": 1_000_000, "eval_interval": 1_000_000}


class Heal:
    """Listens to a torchft run: the replacement's heal (its ``regrow`` event: the first step it committed, healed
    from a peer), then the first step the run commits after it. A test waits on these events, never on a step
    count that the survivor must not outrun (the replacement's start is what load stretches)."""

    def __init__(self) -> None:
        self.healed, self.after = threading.Event(), threading.Event()
        self.event: dict[str, Any] | None = None

    def __call__(self, kind: str, payload: dict[str, Any]) -> None:
        if kind == "event" and payload["kind"] == "regrow" and payload["rank"] >= 0 and self.event is None:
            self.event = payload  # torchft_step's: the replacement committed a step (the membership's has rank -1)
            self.healed.set()
        elif kind == "step" and self.event is not None and payload["step"] > self.event["step"]:
            self.after.set()

    def run_until_healed(self, config: dict[str, Any], out: Any, finish: bool = False) -> Any:
        """Start the run, wait for the heal and a step after it, then stop the run, or (``finish``) have it end at
        the next step boundary, every replica done (its live API); its result."""
        run = workbench.start(config, out=out, on_event=self)
        try:
            assert self.healed.wait(180), f"no heal within 180 s: {[e['detail'] for e in run.events][-5:]}"
            assert self.after.wait(60), "no step committed after the heal"
        except BaseException:
            run.stop("no heal")
            raise
        run.finish() if finish else run.stop("the heal is seen")
        return run.wait(120)


def test_torchft_fast_tier_a_killed_replica_is_replaced_and_heals_from_its_peer(tmp_path):
    """torchft end to end in the fast tier: 2 replicas of a 16-unit MLP, replica 0 (the one whose figures are
    recorded) SIGKILLed at step 30; the test waits for its replacement's heal, then for a step the run commits
    after it, and stops the run. The replacement is then the reporter: its loss says whether it took its peer's
    trained weights (a replacement that kept its fresh ones would report the untrained loss of step 0).

    Where the time goes (2-core VM, idle; the run's own events): each replica is a fresh interpreter (torch 1.9 s,
    torchft 0.3 s; the two at once: 4 s to generation 0), torchft's Manager and first quorum 2.3 s, the steps
    ~5 ms each, the replacement another fresh interpreter (2 s) and Manager (1 s), the heal one quorum. ~9.5 s in
    all, of which ~8 s are three interpreters' start and two Managers: the floor of any torchft run with a
    replacement (peers' ranks are never forked from our template). At load 6-9 the starts take 3-5x as long.
    The steps are never reached (the run is stopped): what the survivor does meanwhile does not matter.
    """
    pytest.importorskip("torchft", reason="the peers extra is not installed (pip install -e .[peers])")
    heal = Heal()
    result = heal.run_until_healed({"world_size": 2, **ENDLESS, "hidden": [16], "seed": 1, "strategy": "torchft",
                                    "faults": ["kill:rank=0,step=30"]}, tmp_path / "ft")
    summary = result.summary
    assert (summary["outcome"], summary["reason"]) == ("stopped", "the heal is seen")
    (failure,) = summary["failures"]
    assert failure["rank"] == 0 and failure["world_size_after"] == 1 and "SIGKILL" in failure["cause"]
    # the lighthouse drops the dead replica after the heartbeat timeout (2 s), or the replacement joins first
    assert 0 < failure["detection_s"] <= failure["resume_s"] <= failure["regrow_s"]
    kinds = [e["kind"] for e in result.events]
    assert kinds.index("kill") < kinds.index("failure") < kinds.index("respawn") < kinds.index("quorum", kinds.index(
        "respawn")), kinds
    # healed: the replacement took its peer's step (after the kill), never a fresh start from step 0
    assert heal.event is not None and heal.event["rank"] == 0 and heal.event["step"] > 30
    assert "healed from a peer" in heal.event["detail"]
    # ... and its weights: from the heal on the replacement reports (world size 2 again), and the loss of its
    # first step on healed weights continues the trained curve (~0.6 at step 30), far from the fresh model's
    # (~2.3 at step 0: what a replacement that did not load its peer's state reports, the same initial weights)
    healed_rows = [row for row in result.metrics if row["step"] > heal.event["step"]]
    assert healed_rows and {row["world_size"] for row in healed_rows} == {2}
    fresh = result.metrics[0]["loss"]
    assert result.metrics[0]["step"] == 0 and healed_rows[0]["loss"] < fresh / 2, (healed_rows[0], fresh)
    assert [row["step"] for row in result.metrics] == sorted({row["step"] for row in result.metrics})


def test_torchft_detects_by_heartbeat_restarts_the_replica_and_heals_it(tmp_path):
    """Replica 1 SIGKILLed at step 40; the test waits for its replacement's heal and a step after it, then asks
    the run to finish at the next step boundary (``run.finish``): both replicas end after the same step and send
    their fingerprints, so the run completes and its replicas' final weights are compared, with no step count
    chosen for the survivor not to outrun the replacement's start."""
    pytest.importorskip("torchft", reason="the peers extra is not installed (pip install -e .[peers])")
    # 2 s, not 1: a fresh replacement building torchft's Manager on loaded cores missed 1 s of heartbeats in 2 of
    # 17 runs (a second failure, "froze") where the lighthouse needs the same timeout to drop the dead replica
    heal = Heal()
    result = heal.run_until_healed({**TINY, **ENDLESS, "strategy": "torchft", "heartbeat_timeout": 2.0,
                                    "faults": ["kill:rank=1,step=40"]}, tmp_path / "ft", finish=True)
    summary = result.summary
    assert summary["outcome"] == "completed", summary["reason"]  # no escape: the heal is what is tested
    assert summary["reason"].startswith("finished at a step boundary as asked")
    # both replicas ended after the same step: the boundary asked for, or (a replica already past it when the
    # message came) the step they had reached together
    (finish,) = [e for e in result.events if e["kind"] == "finish"]
    assert heal.event["step"] < finish["steps"] <= summary["steps_completed"] == result.metrics[-1]["step"] + 1
    (failure,) = summary["failures"]
    # the lighthouse drops the dead replica only when its heartbeats have been missing for the timeout
    assert failure["detection_s"] >= 1.9 and failure["resume_s"] >= failure["detection_s"]
    assert failure["regrow_s"] is not None and failure["regrow_s"] > failure["resume_s"], failure
    assert failure["world_size_after"] == 1
    assert summary["replicas_identical"] is True  # the replacement healed from its peer, bit for bit
    kinds = [e["kind"] for e in result.events]
    assert "quorum" in kinds and "regrow" in kinds


def test_torchrun_restarts_the_world_and_redoes_the_steps_since_the_checkpoint(tmp_path):
    result = workbench.run({**TINY, "strategy": "torchrun", "checkpoint_every": 25,
                            "faults": ["kill:rank=1,step=40"]}, out=tmp_path / "tr")
    summary = result.summary
    assert summary["outcome"] == "completed", summary["reason"]
    (failure,) = summary["failures"]
    # the fault fires after step 40's exchange: rank 0 commits step 40 unless the agent's SIGTERM (it polls every
    # 0.1 s) reaches it first; either way the figure is the failed world's committed steps from the checkpoint on
    last = max(row["step"] for row in result.metrics if row["generation"] == 0)
    assert last in (39, 40)
    assert failure["steps_redone"] == last + 1 - 25  # back to the checkpoint of step 25
    assert failure["samples_lost"] == 0 and failure["world_size_after"] == 2
    assert 0 < failure["detection_s"] <= failure["resume_s"]
    assert summary["replicas_identical"] is True and summary["steps_completed"] == 100
    assert result.config["spawn"] == "fresh"  # what ran: the peers' ranks are never forked by our template
    assert any(e["kind"] == "restart" for e in result.events)
    # rank 0 reports its own share of each step's batch, and the checksum of its ids (redone steps alike)
    batches = BatchSequence(len(load_dataset(RunConfig(seed=1)).y_train), 64, 1)
    assert all(row["sample_checksum"] == sample_checksum(shard(batches(row["step"]), 0, 2)) for row in result.metrics)


def test_torchft_without_the_extra_exits_2_with_the_install_hint():
    hide = ("import importlib.util as u; f = u.find_spec; "
            "u.find_spec = lambda n, *a: None if n == 'torchft' else f(n, *a); "
            "from workbench.launch.cli import main; raise SystemExit(main(['run', '--strategy', 'torchft']))")
    done = subprocess.run([sys.executable, "-c", hide], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "workbench: error: strategy: 'torchft' needs the torchft package (0.2), which is not installed: "
        "pip install -e .[peers]"]


@pytest.mark.parametrize("settings, message", [
    ({"strategy": "torchrun", "regrow": True}, "recovers by its own means"),
    ({"strategy": "torchrun", "parallelism": "gossip"}, "does not apply to parallelism 'gossip'"),
    ({"strategy": "torchrun", "detect": ["guard"]}, "detect is ours and does not apply"),
    ({"strategy": "torchrun", "faults": ["flip:target=weight,rank=0,step=3,tensor=fc1.weight,index=0,bit=30"]},
     "flip faults is ours"),
])
def test_peers_refuse_what_is_ours(settings, message):
    with pytest.raises(ConfigError, match=message):
        RunConfig(**settings)
