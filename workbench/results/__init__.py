"""What a run leaves behind and how it is read: the last step of the flow, after ``supervisor`` and ``rank``.

:mod:`.run_result` holds :class:`RunResult`; the run's output folder (:mod:`.outdir`), its summary, provenance,
clocks, tracking, and the figures built from them. The HDF5 files, checkpoints and fallbacks are on the floor,
:mod:`workbench.base`. Importing this package imports none of its modules.
"""
