"""The peer systems as strategies: torchft (lighthouse, Manager, its DDP/optimizer) and torchrun (restart the
world from the last checkpoint), on our harness with our faults and figures."""

import subprocess
import sys

import pytest

import workbench
from workbench.config.errors import ConfigError
from workbench.config.run import RunConfig

TINY = {"world_size": 2, "steps": 100, "eval_interval": 50, "hidden": [32], "seed": 1}
# torchft: long enough after the kill that the replacement (a fresh interpreter: 3 s to start idle, 7-9 s on
# loaded cores) finds its peer still training; 1500 steps (3-4 s alone idle) lost that race under load
LONG = {**TINY, "steps": 5000, "eval_interval": 2500}


def test_torchft_detects_by_heartbeat_restarts_the_replica_and_heals_it(tmp_path):
    pytest.importorskip("torchft", reason="the peers extra is not installed (pip install -e .[peers])")
    # 2 s, not 1: a fresh replacement building torchft's Manager on loaded cores missed 1 s of heartbeats in 2 of
    # 17 runs (a second failure, "froze") where the lighthouse needs the same timeout to drop the dead replica
    result = workbench.run({**LONG, "strategy": "torchft", "heartbeat_timeout": 2.0,
                            "faults": ["kill:rank=1,step=40"]}, out=tmp_path / "ft")
    summary = result.summary
    assert summary["outcome"] == "completed", summary["reason"]  # no escape: the heal is what is tested
    (failure,) = summary["failures"]
    # the lighthouse drops the dead replica only when its heartbeats have been missing for the timeout
    assert failure["detection_s"] >= 1.9 and failure["resume_s"] >= failure["detection_s"]
    assert failure["regrow_s"] is not None and failure["regrow_s"] > failure["resume_s"]
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
