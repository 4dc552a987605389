"""Soft errors: exact IEEE-754 bit flips (:mod:`.bitflip`) in tensors, arrays and HDF5 checkpoints."""

from workbench.faults.bitflip import Flip, bit_field, flip, inject, replay
from workbench.faults.hdf5 import alter_checkpoint, compare_checkpoints

__all__ = ["Flip", "alter_checkpoint", "bit_field", "compare_checkpoints", "flip", "inject", "replay"]
