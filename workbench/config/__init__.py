"""What a run is asked to do, checked before anything starts: the first step of the flow.

:mod:`.run` holds :class:`RunConfig` (its fields: :mod:`.fields`; read from files: :mod:`.files`), the checks
before a run (:mod:`.preflight`), the device setting (:mod:`.devices`), the learning-rate schedule and the resizing
rules (:mod:`.resizing`: which world sizes; :mod:`.resize_rule`: the learning rate of a resize). The settings'
types, errors and parallel modes are on the floor, :mod:`workbench.base`. Then ``launch`` starts the run.
Importing this package imports none of its modules.
"""
