"""What a run is asked to do, checked before anything starts: the first step of the flow.

:mod:`.run` holds :class:`RunConfig` (its fields: :mod:`.fields`, :mod:`.types`; read from files: :mod:`.files`),
the checks before a run (:mod:`.preflight`, :mod:`.errors`), the parallel modes (:mod:`.modes`, one object each),
user callables, the learning-rate schedule and the resizing rules (:mod:`.resizing`: which world sizes;
:mod:`.resize_rule`: the learning rate of a resize). Then ``launch`` starts the run. Importing this package
imports none of its modules.
"""
