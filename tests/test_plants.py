"""Each assertion docs/testing.md lists as able to fail, failing: a *plant* breaks exactly the behaviour the assertion
names, in every process the tests start (a ``sitecustomize.py`` whose import hook patches one module as it is
loaded: tests/planting.py), and the tests that hold that behaviour run in a fresh pytest with it. Each of them must
fail in its test body (not at collection or in a fixture, not skipped), with the assertion the row names, and
while it ran the plant must have changed what the code did (``fired``): a plant that never applies cannot pass as
caught. The unplanted control is the suite itself, where the same tests pass.

A plant is ``TARGET`` (the module), ``plant(module)`` (which replaces what it breaks) and a call of ``fired(what)``
where the broken code runs. Writing one: docs/testing.md, "Plants".
"""

from __future__ import annotations

import re
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest
from planting import ROOT, run_tests_planted, sitecustomize


@dataclass(frozen=True)
class Plant:
    name: str
    body: str  # TARGET and plant(module), which calls fired(what) where it breaks the behaviour
    fails: dict[str, str]  # node id -> a piece of the failure the test must report (the assertion the row names)
    timeout: float = 300
    notebook: str | None = None  # a notebook whose cells run (a copy: its outputs go to the test's directory)


PLANTS = [
    Plant("gossip_consensus_zero_after_a_shrink", '''
TARGET = "workbench.rank.gossip"


def plant(module):  # the consensus distance of a gossip world of 3 (after a shrink) reported as 0
    consensus = module.GossipTrainer.consensus

    def zero_at_three(self, stats):
        distance, summed = consensus(self, stats)
        if self.comm.size not in (2, 4):
            fired(f"consensus distance {distance} reported as 0 at world size {self.comm.size}")
            distance = 0.0
        return distance, summed

    module.GossipTrainer.consensus = zero_at_three
''', {"tests/test_parallel_runs.py::test_gossip_shrink_goes_on_with_three_and_says_how": "d > 0 for d in after"}),

    Plant("sweep_interrupt_leaves_a_result", '''
TARGET = "workbench.launch.sweeps.point"


def plant(module):  # the interrupted point's directory keeps a result.h5: the point looks finished
    terminate = module.Worker.terminate

    def leaving_a_result(self, signum, frame):
        if self.current_dir is not None:
            (self.current_dir / "result.h5").write_bytes(b"")
            fired(f"result.h5 left in {self.current_dir.name}")
        terminate(self, signum, frame)

    module.Worker.terminate = leaving_a_result
''', {"tests/test_sweep.py::test_sigint_stops_every_process_and_resumes": "assert finished == set()"}),

    Plant("sensitivity_trial_resumed_one_step_longer", '''
TARGET = "workbench.campaigns.studies.sensitivity"


def plant(module):  # each flipped trial resumes one step more than the unflipped resume it is compared with
    run = module.LocalResume.run

    def one_step_longer(self, steps, model_state=None):
        if model_state is not None:
            fired(f"trial resumed {steps + 1} steps")
            steps += 1
        return run(self, steps, model_state)

    module.LocalResume.run = one_step_longer
''', {"tests/test_batchnorm.py::test_the_sensitivity_tools_flip_buffers_and_evaluate_with_them":
      'frame[frame.bit == 0].accuracy == frame.attrs["golden_accuracy"]'}),

    Plant("sensitivity_trial_names_the_next_element", '''
TARGET = "workbench.campaigns.studies.sensitivity"


def plant(module):  # each trial records the index of the element after the one it flipped
    apply_masks = module.apply_masks

    def next_index(x, indices, masks, target=""):
        log = apply_masks(x, indices, masks, target)
        log.indices = log.indices + 1
        fired(f"{target} flipped at {log.indices[0] - 1}, recorded at {log.indices[0]}")
        return log

    module.apply_masks = next_index
''', {"tests/test_batchnorm.py::test_the_sensitivity_tools_flip_buffers_and_evaluate_with_them":
      'resume.base.model["bn1.running_var"][row.index].item() == row.old'}),

    Plant("batch_order_seeded_by_the_fault_plan", '''
TARGET = "workbench.rank.base"


def plant(module):  # a run with faults draws its global batches from seed + len(faults): not the no-fault run's
    init = module.BaseTrainer.__init__

    def seeded_by_faults(self, config, *args, **kwargs):
        init(self, config, *args, **kwargs)
        if config.faults:
            self.batches = module.BatchSequence(len(self.data.y_train), config.batch_size,
                                                config.seed + len(config.faults))
            fired(f"batches seeded {config.seed + len(config.faults)}")

    module.BaseTrainer.__init__ = seeded_by_faults
''', {f"tests/test_batchnorm.py::test_shrink_and_forward_keep_replicas_and_buffers_identical[{strategy}]":
      "assert rows[:KILL] == " for strategy in ("shrink", "forward")}, timeout=420),

    Plant("pipeline_reinit_keeps_its_weights", '''
TARGET = "workbench.rank.pipeline"


def plant(module):  # reinit's members take the snapshot's step, keep their weights (a newcomer its fresh ones)
    load = module.PipelineTrainer.load_stage_state

    def not_the_snapshot(self, state):
        if state is self.memory_snapshot:
            fired(f"snapshot of step {state['step']} not restored")
            return
        load(self, state)

    module.PipelineTrainer.load_stage_state = not_the_snapshot
''', {"tests/test_parallel_runs.py::test_hybrid_reinit_restores_the_world":
      "max_diff(final_weights(result), final_weights(hybrid_golden)) == 0.0"}),

    Plant("gossip_partitions_seeded_by_the_fault_plan", '''
TARGET = "workbench.rank.gossip"


def plant(module):  # a gossip run with faults splits the data from seed + len(faults): not the no-fault run's split
    join, Partition = module.GossipTrainer.join, module.LocalPartition

    def seeded_by_faults(self, a):
        faults = len(self.config.faults)
        if faults:
            fired(f"partition seeded {self.config.seed + faults}")
            module.LocalPartition = lambda n, position, size, batch, seed, gen: Partition(
                n, position, size, batch, seed + faults, gen)
        try:
            join(self, a)
        finally:
            module.LocalPartition = Partition

    module.GossipTrainer.join = seeded_by_faults
''', {"tests/test_parallel_runs.py::test_gossip_shrink_goes_on_with_three_and_says_how":
      "before(result, 30) == before(gossip_golden[4], 30)",
      "tests/test_parallel_runs.py::test_gossip_regrow_gives_the_replacement_a_peer_s_state":
      "before(result, 30) == before(gossip_golden[4], 30)",
      **{f"tests/test_parallel_runs.py::test_gossip_restarts[{strategy}]":
         "before(result, 30) == before(gossip_golden[2], 30)" for strategy in ("checkpoint_restart", "reinit")}},
          timeout=420),

    Plant("lab_flips_the_bit_below", '''
TARGET = "workbench.launch.lab"


def plant(module):  # the panel's Flip button sends the bit below the one its form names
    flip = module.Lab.flip

    def bit_below(self):
        run = self.run
        if run is None:
            return flip(self)
        real = run.flip

        def below(**kwargs):
            fired(f"bit {kwargs['bit'] - 1} sent for {kwargs['bit']}")
            return real(**{**kwargs, "bit": kwargs["bit"] - 1})

        run.flip = below
        try:
            return flip(self)
        finally:
            del run.flip

    module.Lab.flip = bit_below
''', {"tests/test_widgets.py::test_panel_runs_kills_and_shows_it": "linear1.weight[3] bit 22",
      "tests/test_widgets.py::test_the_panel_offers_every_model_a_dataset_box_and_buffer_flips":
      "bn1.running_var[0] bit 29"}),

    Plant("weight_flip_of_bit_0_flips_bit_30", '''
import dataclasses

TARGET = "workbench.rank.soft_errors"


def plant(module):  # a live flip asked for bit 0 flips bit 30
    flip_in = module.flip_in

    def thirty_for_zero(tensor, fault, target, step):
        if fault.bit == 0:
            fired(f"{target}: bit 30 flipped for bit 0")
            fault = dataclasses.replace(fault, bit=30)
        return flip_in(tensor, fault, target, step)

    module.flip_in = thirty_for_zero
''', {"notebooks/pipeline_soft_errors.ipynb::Cell 4":
      '(low.outcome == "masked").all() and (low.accuracy_delta == 0).all()'},
          notebook="notebooks/pipeline_soft_errors.ipynb"),

    Plant("sensitivity_trial_resumes_the_unflipped_state", '''
TARGET = "workbench.campaigns.studies.sensitivity"


def plant(module):  # each trial resumes the checkpoint as it was, without its flip
    run = module.LocalResume.run

    def unflipped(self, steps, model_state=None):
        if model_state is not None:
            fired("a trial resumed the unflipped state")
        return run(self, steps)

    module.LocalResume.run = unflipped
''', {"notebooks/soft_errors.ipynb::Cell 6": "harmful.outcome.isin(harmed).all()"},
          notebook="notebooks/soft_errors.ipynb"),

    Plant("ulfm_survivor_resumes_a_step_early", '''
TARGET = "workbench.rank.peers.ulfm_rank"  # run by mpirun as python -m: planted before its main block


def plant(module):  # the survivors of a shrink resume one step before the most advanced one's step
    recover = module.UlfmRank._recover

    def a_step_early(self, MPI, comm, exc, step):
        shrunk, resume = recover(self, MPI, comm, exc, step)
        fired(f"resumed at {resume - 1}, not {resume}")
        return shrunk, resume - 1

    module.UlfmRank._recover = a_step_early
''', {"tests/test_ulfm.py::test_fast_tier_rank_0_killed_the_survivor_shrinks_and_finishes":
      'failure["steps_redone"] == 0'}),

    Plant("torchft_heal_loads_nothing", '''
TARGET = "workbench.rank.peers.torchft_rank"


def plant(module):  # a healing replica's load_state_dict loads nothing: it keeps its fresh weights
    run = module.TorchftReplica.run

    def loading_nothing(self, lighthouse):
        import torchft

        manager = torchft.Manager

        def no_load(*args, load_state_dict, **kwargs):
            return manager(*args, load_state_dict=lambda state: fired("a peer's state not loaded"), **kwargs)

        torchft.Manager = no_load
        return run(self, lighthouse)

    module.TorchftReplica.run = loading_nothing
''', {"tests/test_peers.py::test_torchft_fast_tier_a_killed_replica_is_replaced_and_heals_from_its_peer":
      'healed_rows[0]["loss"] < fresh / 2'}),
]


def planted_run(plant: Plant, tmp_path: Path) -> dict[str, dict]:
    """The plant's tests run with it in; a notebook's every cell, in a copy of it in ``tmp_path / "notebook"``
    (its outputs there, none beside the notebook the suite checks), keyed as in the suite."""
    if plant.notebook is None:
        return run_tests_planted(list(plant.fails), sitecustomize(plant.body), tmp_path, plant.timeout)
    notebook = Path(plant.notebook)
    (tmp_path / "notebook").mkdir()
    shutil.copy(ROOT / notebook, tmp_path / "notebook" / notebook.name)
    (tmp_path / "notebook" / "pytest.ini").write_text("[pytest]\n")  # no suite plugins: the copy is no test file
    ran = run_tests_planted([notebook.name], sitecustomize(plant.body), tmp_path, plant.timeout, ("--nbval-lax",),
                            cwd=tmp_path / "notebook")
    return {f"{notebook.parent}/{node_id}": test for node_id, test in ran.items()}


@pytest.mark.parametrize("plant", PLANTS, ids=[plant.name for plant in PLANTS])
def test_the_plant_is_caught(plant, tmp_path):
    ran = planted_run(plant, tmp_path)
    assert set(plant.fails) <= set(ran), f"ran {sorted(ran)}, named {sorted(plant.fails)}"
    failed = {node_id for node_id, test in ran.items() if "failed" in (test.get("setup"), test.get("call"),
                                                                         test.get("teardown"))}
    assert failed == set(plant.fails), f"failed: {sorted(failed)}, named: {sorted(plant.fails)}"
    for node_id, says in plant.fails.items():
        test = ran[node_id]
        assert (test.get("setup"), test.get("call")) == ("passed", "failed"), (node_id, test)
        assert says in test["message"], (node_id, says, test["message"])
        # the plant changed what the code did while the test ran (a notebook: while any of its cells ran)
        unit = (lambda n: n.split("::")[0]) if plant.notebook else (lambda n: n)
        assert sum(t["fired"] for n, t in ran.items() if unit(n) == unit(node_id)) > 0, f"{node_id}: never fired"


def test_the_docs_list_every_plant_and_no_other():
    """docs/testing.md names each plant by its test here, and claims no plant that is not one."""
    rows = [line for line in (ROOT / "docs" / "testing.md").read_text().splitlines() if line.startswith("| ")]
    named = re.findall(r"tests/test_plants\.py::test_the_plant_is_caught\[(\w+)\]", "\n".join(rows))
    assert sorted(named) == sorted(plant.name for plant in PLANTS), named  # each once, in the table
    for plant in PLANTS:  # and the tests it fails, each in the plant's row
        row = next(line for line in rows if f"test_the_plant_is_caught[{plant.name}]" in line)
        for node_id in plant.fails:
            assert node_id.split("::")[1].split("[")[0] in row, (plant.name, node_id)
