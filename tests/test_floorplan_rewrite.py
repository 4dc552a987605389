"""tools/floorplan_rewrite.py: old module names rewritten to the floor plan's, idempotently, on small samples."""

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("floorplan_rewrite", ROOT / "tools" / "floorplan_rewrite.py")
fp = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fp)

SAMPLE = '''"""Uses :mod:`workbench.sweep_point` and :func:`~workbench.faults.targets.stage_cuts`."""
from workbench import slurm, config
from workbench import apoptosis as apo
from workbench.apoptosis import ApoptosisConfig
from workbench.faults import bitflip, campaign, flip
from workbench.faults.targets import (
    check_flip_targets,  # the flips
    check_model,
)
from workbench.sweep import sweep
import workbench.data as data

cmd = [sys.executable, "-m", "workbench.sweep_point"]
frame = workbench.sweep("nb.ipynb", out=out)  # the public function, not the module
path = "workbench/sweep_executor.py"
'''

EXPECTED = '''"""Uses :mod:`workbench.sweeps.point` and :func:`~workbench.workloads.stages.stage_cuts`."""
from workbench.cluster import slurm_commands as slurm
from workbench import config
from workbench.apoptosis import rule as apo
from workbench.apoptosis.rule import ApoptosisConfig
from workbench.faults import bitflip
from workbench.studies.campaign import campaign
from workbench.faults.bitflip import flip
from workbench.faults.targets import check_flip_targets
from workbench.workloads.stages import check_model
from workbench.sweeps.run import sweep
import workbench.workloads.data as data

cmd = [sys.executable, "-m", "workbench.sweeps.point"]
frame = workbench.sweep("nb.ipynb", out=out)  # the public function, not the module
path = "workbench/sweeps/workers.py"
'''


def test_imports_names_and_paths_are_rewritten():
    assert fp.rewrite(SAMPLE) == EXPECTED


def test_the_rewrite_is_idempotent():
    assert fp.rewrite(EXPECTED) == EXPECTED
    assert fp.rewrite("from workbench.apoptosis import surgery\n") == "from workbench.apoptosis import surgery\n"
    page = "# `workbench.sweep`\n\n::: workbench.sweep\n"  # a reference page names the module
    assert fp.rewrite(page) == "# `workbench.sweeps.run`\n\n::: workbench.sweeps.run\n"


def test_private_names_made_public_are_renamed_in_their_scope():
    assert fp.rename("from workbench.rank.main import _join_from_store\n", "x.py") == \
        "from workbench.rank.main import join_from_store\n"
    assert fp.rename("_ms(t)\n", "workbench/other.py") == "_ms(t)\n"
    assert fp.rename("_ms(t)\n", "workbench/tracking.py") == "epoch_ms(t)\n"


def test_a_notebook_keeps_its_json_form():
    notebook = {"cells": [{"cell_type": "code", "execution_count": None, "id": "a", "metadata": {}, "outputs": [],
                           "source": ["from workbench.faults import save_trials\n", "x = 1"]}],
                "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    text = json.dumps(notebook, indent=1, ensure_ascii=False) + "\n"
    new = fp.rewrite_notebook(text)
    assert json.loads(new)["cells"][0]["source"] == ["from workbench.studies.sensitivity import save_trials\n",
                                                     "x = 1"]
    assert fp.rewrite_notebook(new) == new
