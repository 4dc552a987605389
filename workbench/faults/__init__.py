"""The fault primitives: planned faults (:mod:`.spec`), exact IEEE-754 bit flips in tensors and arrays
(:mod:`.bitflip`) and in HDF5 checkpoints (:mod:`.hdf5`), the outcome classes of an injection (:mod:`.outcomes`),
the check of a flip's target against the model (:mod:`.targets`), and every event kind of a run, declared once
with its fields (:mod:`.events`).

Imports nothing: a rank process that flips a bit loads only what it uses. Campaigns and sensitivity studies built
on these are in :mod:`workbench.campaigns.studies`.
"""
