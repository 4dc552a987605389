"""The control channel between the supervisor and its ranks: JSON lines over one TCP connection per rank.

Rank -> supervisor
    ``hello {id, pid, rank_hint}`` first message after connecting (``id``: the spawn id the supervisor gave it;
                                   None for a rank started elsewhere that joins through the store, which asks
                                   for rank ``rank_hint`` or, None, any free slot of a host whose ranks join)
    ``ready {}``                   data and model built: it may be put in a generation (a warm spare waits here)
    ``hb {}``                      heartbeat, every ``HEARTBEAT_PERIOD`` s from a thread of its own
    ``joined {gen, step, sync_s}`` the rank is in generation ``gen`` and holds the state of ``step``; rank 0 of a
                                   recovery generation adds ``recovery``, ``resume_step``, ``retried``
    ``step {step, gen, ...}``      a step was committed (generation rank 0 adds loss, accuracy, samples, eval)
    ``fault {kind, step, t}``      a planned kill/hang is about to fire in this rank (sent just before it does)
    ``flip {step, target, tensor, index, bit, old, new}``   a bit flip was injected
    ``detected {step, detector, detail, action, to_step}``  a soft-error detector fired (generation rank 0)
    ``checkpoint {step, path, stall_s, write_s}``           an HDF5 checkpoint is complete on disk
    ``done {step, fingerprint}``   the rank finished all steps
    ``error {message, reason}``    the rank failed on its own (an exception, not a fault); it exits next.
                                   ``reason`` (else None): the run's reason to fail, e.g. "checkpoint not
                                   written: cannot write PATH: No space left on device" (no rank fault)
Supervisor -> rank
    ``start {config, store, checkpoint_dir, provenance}``  once, in answer to ``hello`` (``provenance``: the
                                                   run's, workbench.provenance; its checkpoints keep it)
    ``generation {gen, members, rank, size, source, recovery, resume, faults}``
                                                   join generation ``gen``; ``source`` None: the members pick
                                                   the most advanced one; ``faults``: this rank's pending faults
    ``faults_add {faults}``                        live faults (``run.flip``), due at the rank's next step
    ``stop {reason}``                              leave now (exit code 2 with ``refused``: a join was refused)
    ``signal {name}``                              send yourself this signal (SIGKILL, SIGSTOP): faults injected
                                                   into ranks that are not the supervisor's own children

The supervisor notices a dead rank by the end of its connection (and by its exit status), a frozen one by
missing heartbeats. A rank that loses its connection exits at once: ranks never outlive their supervisor.
"""

from __future__ import annotations

import json
from typing import Any

HEARTBEAT_PERIOD = 0.25
CONTROL_KEY = "workbench/control"  # store key holding the control server's HOST:PORT (for ranks that join)


def encode(message: dict[str, Any]) -> bytes:
    return (json.dumps(message, separators=(",", ":")) + "\n").encode()


class LineDecoder:
    """Turns the bytes of a stream into messages, whatever the chunking."""

    def __init__(self) -> None:
        self._buffer = b""

    def feed(self, data: bytes) -> list[dict[str, Any]]:
        self._buffer += data
        *lines, self._buffer = self._buffer.split(b"\n")
        return [json.loads(line) for line in lines if line.strip()]
