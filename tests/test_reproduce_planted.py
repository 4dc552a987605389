"""A deliberately broken strategy, planted into the rank processes of a small real campaign, turns its verdict
(issue #46): a rollback whose ranks redo the failed step on a split of its batch that still counts the dead rank
(its share dropped from the redone update) fails CCGrid'22's "rollback loses no samples", which counts from the
samples each committed update summed, not from what the strategy says it did; the same campaign unbroken passes it.
A gossip trainer whose training steps skip the last round of every partner cycle (the schedule function left
intact) fails GossipGraD's "diffusion in ceil(log2 p) rounds", whose rounds replay the partners the ranks exchanged.

The plant is a ``sitecustomize.py`` on PYTHONPATH (as tests/test_slow_paths.py plants its regressions): the
campaign runs in a subprocess whose rank template starts with it, so every rank imports the broken trainer."""

from __future__ import annotations

from pathlib import Path

from planting import run_planted, sitecustomize

PLANT = sitecustomize('''\
"""Planted by tests/test_reproduce_planted.py: rollback's ranks redo a failed step on a split of its global batch
over one rank more than the world, as if the dead rank were still a member: its share is left out of the update."""
import numpy as np

TARGET = "workbench.rank.replicated"
BEGUN = [-1]  # the highest step this rank process has begun: a step at or below it is being redone


def plant(module):
    train_step, shard = module.Trainer.train_step, module.shard

    def broken_train_step(self):
        redo = self.strategy.name == "rollback" and self.step <= BEGUN[0]
        BEGUN[0] = max(BEGUN[0], self.step)
        module.shard = (lambda indices, rank, size: np.array_split(indices, size + 1)[rank]) if redo else shard
        return train_step(self)

    module.Trainer.train_step = broken_train_step
''')

CAMPAIGN = '''\
import json, sys
from workbench.campaigns.reproduce import ccgrid22

frame = ccgrid22.campaign("small", out=sys.argv[1], seeds=[0, 1], steps=60, mtbf=[20], max_failures=1)
v = ccgrid22.verdict(frame, "small")
roll = frame[frame.strategy == "rollback"]
print(json.dumps({"status": v.status, "checks": {c.name: [c.ok, c.detail] for c in v.checks},
                  "failures": roll.failures.tolist(), "missing": roll.samples_missing.tolist()}))
'''


GOSSIP_PLANT = sitecustomize('''\
"""Planted by tests/test_reproduce_planted.py: a gossip trainer whose training steps skip the last hypercube round of
every partner cycle (no exchange); the schedule function itself, and so anything computed from it, is left intact."""
TARGET = "workbench.rank.gossip"


def plant(module):
    train_step = module.GossipTrainer.train_step

    def skipping_train_step(self):
        schedule = self.schedule
        intact = schedule.partner

        def skipping(step, position):
            return None if step % schedule.k == schedule.k - 1 else intact(step, position)

        schedule.partner = skipping
        try:
            return train_step(self)
        finally:
            del schedule.partner  # the schedule function, as the supervisor or a measurement would call it, intact

    module.GossipTrainer.train_step = skipping_train_step
''')

GOSSIP_CAMPAIGN = '''\
import json, sys
from workbench.campaigns.reproduce import gossipgrad

frame, _ = gossipgrad.campaign("small", out=sys.argv[1], seeds=[0], steps=20)
v = gossipgrad.verdict(frame, "small")
gossip = frame[frame.parallelism == "gossip"]
print(json.dumps({"status": v.status, "checks": {c.name: [c.ok, c.detail] for c in v.checks},
                  "after": gossip.spread_after.tolist(), "partners": gossip.diffusion_partners.tolist()}))
'''


def campaign(out: Path, plant: bool, plant_text: str = PLANT, script: str = CAMPAIGN) -> dict:
    """A reduced campaign (by default CCGrid'22's: 2 tuning seeds, 60 steps, one failure each) in a fresh
    interpreter, with the broken strategy planted or not; its verdict's status and checks."""
    return run_planted(script, out, plant_text if plant else None, timeout=400)


def test_a_rollback_that_drops_a_share_on_a_redone_step_turns_the_ccgrid_verdict(tmp_path):
    name = "rollback loses no samples (world 4)"
    sound = campaign(tmp_path / "sound", plant=False)
    assert sound["checks"][name][0], sound  # the unbroken rollback: every sample entered an update
    assert min(sound["failures"]) >= 1 and sound["missing"] == [0, 0], sound
    broken = campaign(tmp_path / "broken", plant=True)
    ok, detail = broken["checks"][name]
    assert not ok and broken["status"] == "does not hold", broken
    assert min(broken["missing"]) > 0 and "entered no committed update" in detail, broken
    # the rest of the mechanism stands: only the planted defect is caught
    assert broken["checks"]["forward drops the dead ranks' share (world 4)"][0], broken


def test_a_gossip_schedule_that_skips_a_round_turns_the_gossipgrad_verdict(tmp_path):
    """p = 2 and 4, one tuning seed, 20 steps. Unbroken, the replayed rounds reach the mean; with the last round of
    each cycle skipped in training (p = 2: no exchange at all; p = 4: two pairs that never meet) they do not,
    though the schedule function, which a check computed by construction would read, is intact."""
    name = "gossipgrad.diffusion_in_log_p: replicas agree within 1e-06 after ceil(log2 p) rounds"
    sound = campaign(tmp_path / "sound", False, GOSSIP_PLANT, GOSSIP_CAMPAIGN)
    assert sound["checks"][name][0] and sound["status"] != "does not hold", sound
    assert sound["partners"] == ["trained", "trained"] and max(sound["after"]) <= 1e-6, sound
    broken = campaign(tmp_path / "broken", True, GOSSIP_PLANT, GOSSIP_CAMPAIGN)
    ok, detail = broken["checks"][name]
    assert not ok and broken["status"] == "does not hold", broken
    assert broken["partners"] == ["trained", "trained"] and min(broken["after"]) > 1e-3 and "2 apart" in detail, broken
    # the rest of the mechanism stands: only the planted defect is caught
    assert broken["checks"]["allreduce: messages per rank per step grow with p"][0], broken
