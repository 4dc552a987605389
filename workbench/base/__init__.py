"""The floor: leaves every package may use, each importing nothing of the package outside this floor.

Errors, callables, setting types, entry points' answers and interrupts; the rank protocol and the TCPStore
wire; fallbacks, the HDF5 files and checkpoints; what the machine has, hosts files, Slurm's commands and the
start and reaping of processes. Importing this package imports none of its modules.
"""
