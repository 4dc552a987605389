"""Soft errors: exact IEEE-754 bit flips (:mod:`.bitflip`) in tensors, arrays and HDF5 checkpoints."""

from workbench.faults.bitflip import Flip, bit_field, flip, inject, replay
from workbench.faults.hdf5 import alter_checkpoint, compare_checkpoints, replay_checkpoint
from workbench.faults.outcomes import classify, possible_outcomes
from workbench.studies.campaign import campaign, flip_plan
from workbench.studies.sensitivity import bit_sensitivity, load_trials, outcome_shares, save_trials

__all__ = ["Flip", "alter_checkpoint", "bit_field", "bit_sensitivity", "campaign", "classify", "compare_checkpoints",
           "flip", "flip_plan", "inject", "load_trials", "outcome_shares", "possible_outcomes", "replay",
           "replay_checkpoint", "save_trials"]
