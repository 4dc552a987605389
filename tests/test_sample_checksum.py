"""Which samples entered each committed update: the sample-id checksum (``sample_checksum``, beside ``samples``)
that the ranks carry in the reduction of the update, and CCGrid'22's ``samples_missing`` that compares it with the
failure-free run's (docs/reproduce.md). Real runs of a few steps on digits, a planted redo over the wrong samples
(a ``sitecustomize.py`` in the rank processes, as tests/test_reproduce_planted.py plants its defects), and frames."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from planting import run_planted, sitecustomize

import workbench
from workbench.campaigns.reproduce.ccgrid22 import samples_missing
from workbench.config.run import RunConfig
from workbench.workloads.data import (
    BatchSequence,
    checksum_of,
    load_dataset,
    sample_checksum,
    sample_figures,
    sample_hash,
)

STEPS, BATCH = 6, 64


def schedule(seed: int, steps: int = STEPS) -> list[int]:
    """The checksum of every step's global batch in the failure-free schedule of digits at ``seed``."""
    batches = BatchSequence(len(load_dataset(RunConfig(seed=seed)).y_train), BATCH, seed)
    return [sample_checksum(batches(step)) for step in range(steps)]


def checksums(result) -> list[int]:
    return [row["sample_checksum"] for row in result.metrics]


def test_the_hash_and_its_halves_are_exact():
    ids = np.array([0, 1, 2, 1437, 2**31 + 5, 2**40])
    assert sample_hash(ids).tolist() == [(i * 2654435761) % 2**20 for i in ids.tolist()]
    figures = sample_figures(ids)
    assert figures[0] == 6 and checksum_of(figures) == sum((i * 2654435761) % 2**20 for i in ids.tolist())
    # float32 sums of the halves stay exact up to 2^14 samples; beyond, no checksum rather than a rounded one
    assert checksum_of([2.0**14, 1023.0 * 2**14, 5.0]) is not None
    assert checksum_of([2.0**14 + 1, 0.0, 0.0]) is None and checksum_of([3.0, 1.5, 0.0]) is None
    assert checksum_of([3.0, float("nan"), 0.0]) is None


@pytest.mark.parametrize("settings", [{}, {"parallelism": "pipeline"}], ids=["data", "pipeline"])
def test_every_committed_step_carries_the_checksum_of_the_schedules_batch(settings, tmp_path):
    """World 2: each step's checksum is the sum of h(id) over the failure-free schedule's global batch of that step;
    another seed draws other batches, so other checksums."""
    result = workbench.run(world_size=2, steps=STEPS, seed=3, eval_interval=STEPS, out=tmp_path / "a", **settings)
    assert result.completed, result.summary["reason"]
    assert [row["samples"] for row in result.metrics] == [BATCH] * STEPS
    assert checksums(result) == schedule(3)
    frame = workbench.RunResult.load(tmp_path / "a" / "result.h5").to_dataframe()  # and back from result.h5
    assert frame.sample_checksum.tolist() == schedule(3)
    other = workbench.run(world_size=2, steps=STEPS, seed=4, eval_interval=STEPS, out=tmp_path / "b", **settings)
    assert checksums(other) == schedule(4) and all(a != b for a, b in zip(schedule(3), schedule(4)))


def test_gossip_replicas_carry_the_checksum_of_their_own_batches(tmp_path):
    """Gossip has no global batch: rank 0's own batch (every replica's, summed, on the steps that measure the
    consensus), as ``samples`` counts; the same seed draws the same partitions, so the same checksums."""
    runs = [workbench.run(world_size=2, steps=STEPS, seed=5, eval_interval=STEPS, parallelism="gossip",
                          consensus_every=3, out=tmp_path / name) for name in "ab"]
    assert all(r.completed for r in runs)
    first, second = (checksums(r) for r in runs)
    assert first == second and all(isinstance(c, int) for c in first)
    assert [row["samples"] for row in runs[0].metrics] == [BATCH // 2] * 2 + [BATCH] + [BATCH // 2] * 2 + [BATCH]


def test_rollback_after_a_kill_misses_no_sample_and_forward_misses_the_dead_share(tmp_path):
    """World 3, rank 1 killed at step 3. Rollback redoes the step over the same samples: as many, the same
    checksum. Forward applied bucket 0 from every share before the fault and finished the rest without the dead
    one: the samples that entered the whole update are the survivors', and samples_missing says so."""
    common = {"world_size": 3, "steps": STEPS, "seed": 1, "eval_interval": STEPS}
    base = workbench.run(out=tmp_path / "base", **common)
    runs = {strategy: workbench.run(out=tmp_path / strategy, strategy=strategy, faults=["kill:rank=1,step=3"],
                                    **common) for strategy in ("rollback", "forward")}
    assert base.completed and all(r.completed for r in runs.values())
    assert checksums(base) == schedule(1)
    assert all(isinstance(c, int) for r in runs.values() for c in checksums(r))  # compared, not left out
    assert samples_missing(runs["rollback"], base) == 0 and checksums(runs["rollback"])[3] == schedule(1)[3]
    share = len(np.array_split(np.arange(BATCH), 3)[1])
    assert samples_missing(runs["forward"], base) == share == runs["forward"].summary["samples_lost_total"]
    killed = runs["forward"].metrics[3]
    assert killed["samples"] == BATCH - share and killed["sample_checksum"] != schedule(1)[3]


PLANT = sitecustomize('''\
"""Planted by tests/test_sample_checksum.py: rollback's ranks redo a failed step over the NEXT step's global batch:
as many samples as the failed step's, but the wrong ones."""
TARGET = "workbench.rank.replicated"
BEGUN = [-1]  # the highest step this rank process has begun: a step at or below it is being redone


def plant(module):
    train_step = module.Trainer.train_step

    def broken_train_step(self):
        redo = self.strategy.name == "rollback" and self.step <= BEGUN[0]
        BEGUN[0] = max(BEGUN[0], self.step)
        if not redo:
            return train_step(self)
        batches = self.batches
        self.batches = lambda step: batches(step + 1)
        try:
            return train_step(self)
        finally:
            self.batches = batches

    module.Trainer.train_step = broken_train_step
''')

RUNS = '''\
import json, sys
import workbench
from workbench.campaigns.reproduce.ccgrid22 import samples_missing

common = {"world_size": 3, "steps": 6, "seed": 2, "eval_interval": 6}
base = workbench.run(out=sys.argv[1] + "/base", **common)
redo = workbench.run(out=sys.argv[1] + "/rollback", strategy="rollback", faults=["kill:rank=2,step=3"], **common)
blind = redo.to_dataframe().drop(columns="sample_checksum")  # a table without the checksum: the count alone
counted = type("Run", (), {"to_dataframe": lambda self: blind})()
print(json.dumps({"outcome": [base.outcome, redo.outcome], "missing": samples_missing(redo, base),
                  "count_only": samples_missing(counted, base), "samples": [r["samples"] for r in redo.metrics],
                  "lost": redo.summary["samples_lost_total"]}))
'''


def planted_runs(out: Path, plant: bool) -> dict:
    return run_planted(RUNS, out, PLANT if plant else None, timeout=300)


def test_a_rollback_that_redoes_a_step_over_the_wrong_samples_is_counted_missing(tmp_path):
    """The hole the checksum closes: a redo over as many samples as the failed step's, but other ones. The count
    alone sees nothing (0); the checksum counts the whole step's batch missing. Unplanted: 0 either way."""
    sound = planted_runs(tmp_path / "sound", plant=False)
    assert sound["outcome"] == ["completed", "completed"] and sound["missing"] == sound["count_only"] == 0, sound
    broken = planted_runs(tmp_path / "broken", plant=True)
    assert broken["outcome"] == ["completed", "completed"], broken
    assert broken["samples"] == [BATCH] * STEPS and broken["lost"] == 0, broken  # the count and the flag: all well
    assert broken["count_only"] == 0 and broken["missing"] == BATCH, broken


class Frames:
    """A run as samples_missing reads it: per-step rows (step, samples[, sample_checksum])."""

    def __init__(self, rows: list[tuple], checksum: bool = True) -> None:
        columns = ["step", "samples", "sample_checksum"][: 3 if checksum else 2]
        self.frame = pd.DataFrame([row[: len(columns)] for row in rows], columns=columns)

    def to_dataframe(self) -> pd.DataFrame:
        return self.frame


def test_samples_missing_reads_the_checksum_where_both_runs_have_one():
    base = Frames([(0, 64, 100), (1, 64, 200), (2, 64, 300), (3, 64, 400)])
    assert samples_missing(Frames([(0, 64, 100), (1, 64, 200), (2, 64, 300), (3, 64, 400)]), base) == 0
    # a failed step redone whole (its short report first): the last report counts
    assert samples_missing(Frames([(0, 64, 100), (1, 64, 200), (2, 48, 250), (2, 64, 300), (3, 64, 400)]), base) == 0
    # redone over other samples of the right count: all of them missing
    assert samples_missing(Frames([(0, 64, 100), (1, 64, 200), (2, 64, 301), (3, 64, 400)]), base) == 64
    assert samples_missing(Frames([(0, 64, 100), (1, 64, 201), (2, 64, 301), (3, 64, 400)]), base) == 128
    # a share dropped: the count's difference (whatever its checksum); a step never committed: all of it
    assert samples_missing(Frames([(0, 64, 100), (1, 48, 150), (2, 64, 300), (3, 64, 400)]), base) == 16
    assert samples_missing(Frames([(0, 64, 100), (1, 64, 200), (3, 64, 400)]), base) == 64
    # no checksum in the run, in the failure-free run, or at a step: the count alone decides there
    wrong = [(0, 64, 100), (1, 64, 200), (2, 64, 301), (3, 64, 400)]
    assert samples_missing(Frames(wrong, checksum=False), base) == 0
    assert samples_missing(Frames(wrong), Frames(base.frame.values.tolist(), checksum=False)) == 0
    assert samples_missing(Frames([(0, 64, 100), (1, 64, 200), (2, 64, math.nan), (3, 64, 400)]), base) == 0
