"""Parent side of a run, as rooms with one role each:

* :mod:`.membership` — who is in the run and what each strategy decides when that changes (pure state machine);
* :mod:`.launcher` — every process the run owns, ranks forked from the rank template (:mod:`.template`,
  :mod:`.template_server`); :mod:`.control` — the control channel; :mod:`.faultplan` — planned faults;
  :mod:`.watchdog` — a rank that commits no step; :mod:`.stragglers` — a rank slower than others;
* :mod:`.recorder` — metrics, events, failures, the ``RunResult``; :mod:`.peers` — the peers' services and messages;
* :mod:`.core` — :class:`~.core.Supervisor`, wiring them on a run's monitor thread; :mod:`.boundary` its step boundary
  under way. Imports nothing: a module that needs one room loads that room.
"""
