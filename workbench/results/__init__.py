"""What a run leaves behind and how it is read: the last step of the flow, after ``supervisor`` and ``rank``.

:mod:`.run_result` holds :class:`RunResult`; the HDF5 files (:mod:`.h5files`, :mod:`.h5write`), checkpoints,
provenance, clocks, the fallbacks a run took, tracking, and the figures and report built from them. Importing
this package imports none of its modules.
"""
