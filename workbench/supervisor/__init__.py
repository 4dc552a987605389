"""Parent side of a run, as rooms with one role each:

* :mod:`.membership` — who is in the run and what each strategy decides when that changes (pure state machine);
* :mod:`.launcher` — every process the run owns, how it starts and how it is stopped;
* :mod:`.control` — the control channel's sockets and framing;
* :mod:`.faultplan` — planned faults until they fire; :mod:`.watchdog` — a rank alive that commits no step;
* :mod:`.recorder` — metrics, events, failure figures, and the :class:`~workbench.results.run_result.RunResult`;
* :mod:`.core` — :class:`~.core.Supervisor`, which wires them together on a run's monitor thread.
Imports nothing: a module that needs one room loads that room.
"""
