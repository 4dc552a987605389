"""The workbench's two line protocols, each one table of message kinds: :data:`CONTROL` (supervisor <-> ranks, one
TCP connection per rank) and :data:`TEMPLATE` (a rank template and its owners). A message is a JSON object whose
``type`` is its kind. Senders build messages with :meth:`Protocol.message` (an undeclared kind or field raises
:class:`ProtocolError`), receivers dispatch on :meth:`Protocol.received`. The run configuration travels in
``start`` and is rebuilt by :func:`workbench.config.run.config_from_wire`, without the user-facing checks the
supervisor already ran.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from workbench.base.errors import ProtocolError

HEARTBEAT_PERIOD = 0.25
CONTROL_KEY = "workbench/control"  # store key holding the control server's HOST:PORT (for ranks that join)
RANK, SUPERVISOR, OWNER, TEMPLATE_PROCESS = "rank", "supervisor", "owner", "template"
Message = dict[str, Any]  # a decoded message: its JSON object's fields


@dataclass(frozen=True)
class Kind:
    """One kind of message: who sends it, the fields it always carries and those it may carry, what it means."""

    sender: str
    fields: tuple[str, ...]
    meaning: str
    optional: tuple[str, ...] = ()


_STEP_FIGURES = ("loss", "train_acc", "samples", "sample_checksum", "step_time", "t", "messages", "bytes_sent",
                 "test_loss", "test_acc", "val_acc", "consensus_distance", "parameters", "hidden_units", "participants",
                 "world_size", "lr", "global_batch")
_FAILED = "the rank failed on its own (an exception, not a fault) and exits next; ``reason``: the run's reason to fail"

CONTROL_KINDS: dict[str, Kind] = {
    "hello": Kind(RANK, ("id", "pid", "rank_hint"), "first message after connecting; ``id`` None: a rank started "
                  "elsewhere, joining through the store, asks for rank ``rank_hint`` (None: any free slot)"),
    "ready": Kind(RANK, (), "data and model built: it may be put in a generation (a warm spare waits here)",
                  ("cpu",)),
    "hb": Kind(RANK, (), f"heartbeat, every {HEARTBEAT_PERIOD} s from a thread of its own; ``waiting``: the "
               "training thread waits in a collective, ``ops``: collectives it waited for (the watchdog's clues)",
               ("waiting", "ops")),
    "joined": Kind(RANK, ("gen", "step", "sync_s"), "the rank is in generation ``gen`` and holds the state of "
                   "``step``; rank 0 of a recovery generation adds ``recovery``, ``resume_step``, ``retried``; a "
                   "GPU rank's first adds ``gpu_wait_s`` (its wait for dead ranks' GPU memory)",
                   ("cpu", "sync_cpu", "bytes_in", "recovery", "resume_step", "retried", "gpu_wait_s")),
    "step": Kind(RANK, ("step", "gen"), "a step was committed (generation rank 0 adds its figures); ``slow``: the "
                 "factor a slow rank ran it at", ("cpu", "sent", "msgs", "slow", *_STEP_FIGURES)),
    "fault": Kind(RANK, ("kind", "step", "t"), "a planned kill/hang/stall is about to fire in this rank "
                  "(preempt: its notice; the rank goes on); ``process_cpu``: its process's CPU seconds, every "
                  "thread (what it spends after, to its end, is its teardown)", ("random", "process_cpu")),
    "flip": Kind(RANK, ("step", "target", "tensor", "index", "bit", "old", "new", "planned", "t"),
                 "a bit flip was injected"),
    "detected": Kind(RANK, ("step", "detector", "detail", "action", "to_step"),
                     "a soft-error detector fired (generation rank 0)"),
    "apoptosis": Kind(RANK, ("step", "tau", "removed", "widths", "parameters", "hidden_units"),
                      "adaptive neuron apoptosis removed units (generation rank 0)"),
    "checkpoint": Kind(RANK, ("step", "path", "stall_s", "write_s"), "an HDF5 checkpoint is complete on disk"),
    "fallback": Kind(RANK, ("what", "detail"), "the rank took a fallback (``workbench.base.fallbacks.taken`` in its "
                     "process): the run's ``fallback`` event"),
    "quorum": Kind(RANK, ("step", "participants", "quorum_id", "t"), "torchft: a replica saw a new quorum"),
    "discarded": Kind(RANK, ("step", "t", "error"), "torchft: a replica's step was not committed"),
    "ulfm": Kind(RANK, ("event", "step", "t"), "ULFM: a failed MPI call (``failure``) or the shrunk communicator "
                 "(``shrunk``)", ("error", "size", "revoke_s", "shrink_s", "agree_s", "bytes")),
    "notice": Kind(RANK, ("grace", "signal", "t"), "an outside preemption notice reached the rank (``signal``: "
                   "SIGUSR1, or SIGTERM when ``notice_signals`` names it): it has ``grace`` seconds"),
    "paused": Kind(RANK, ("step", "gen"), "the rank stopped before ``step`` at a step boundary and waits for the next "
                   "generation (after the boundary's checkpoint, if one was asked for)"),
    "done": Kind(RANK, ("step", "fingerprint", "group"), "the rank finished all steps (in generation ``gen``); "
                 "``diffusion``: gossip's replica spread before and after ceil(log2 p) rounds without updates",
                 ("detector_s", "diffusion", "gen")),
    "error": Kind(RANK, ("message", "reason"), _FAILED + " (else None)", ("traceback",)),
    "peer_error": Kind(RANK, ("message", "reason"), "as ``error``, but only an event: the peer handles it",
                       ("traceback",)),
    "start": Kind(SUPERVISOR, ("config", "store", "checkpoint_dir", "provenance", "lighthouse"),
                  "once, in answer to ``hello``: the run configuration (checked by the supervisor), the store, where "
                  "checkpoints go, the run's provenance, torchft's lighthouse (else None)"),
    "generation": Kind(SUPERVISOR, ("gen", "members", "rank", "size", "source", "resume", "recovery", "faults",
                                    "random_steps"),
                       "join generation ``gen``; ``source`` None: the members pick the most advanced one; ``resume``: "
                       "a checkpoint the source reads; ``faults``: this rank's pending faults; ``pause``: the step "
                       "boundary to stop at (a planned resize or preemption: ``step``, ``checkpoint``); ``lanes``: "
                       "a resized hybrid run's lanes per stage; ``rule``: resize_rule linear's history of resizes "
                       "(``base``, ``history``: [step, units] pairs); ``dead_pids``: a GPU run's dead ranks, whose "
                       "memory a rank taking its GPU waits for", ("pause", "lanes", "rule", "dead_pids")),
    "pause": Kind(SUPERVISOR, ("gen", "step", "checkpoint"), "stop before ``step`` (or at once if past it) and say "
                  "``paused``; ``checkpoint``: write one there first (a preemption's boundary: a "
                  "restart or the whole job's end resumes from it)"),
    "finish": Kind(SUPERVISOR, ("steps",), "end the run after ``steps`` steps (``run.finish``): stop at that step "
                   "boundary, or at once if past it, and say ``done`` with the fingerprint"),
    "faults_add": Kind(SUPERVISOR, ("faults",), "live faults (``run.flip``), due at the rank's next step"),
    "throttle": Kind(SUPERVISOR, ("factor",), "slow down by ``factor`` from the next step (1: no more) for "
                     "``seconds`` (None: until the next ``throttle``): ``run.slow``, a slow fault at a time",
                     ("seconds",)),
    "stop": Kind(SUPERVISOR, ("reason",), "leave now (exit code 2 with ``refused``: a join was refused)",
                 ("refused",)),
    "signal": Kind(SUPERVISOR, ("name",), "send yourself this signal (SIGKILL, SIGSTOP): faults injected into ranks "
                   "that are not the supervisor's own children"),
}

TEMPLATE_KINDS: dict[str, Kind] = {
    "fork": Kind(OWNER, ("token", "argv", "env", "cwd", "path", "log", "title"), "fork a rank running "
                 "``workbench.rank.main.main(argv)`` (:mod:`workbench.supervisor.template`)"),
    "kill": Kind(OWNER, ("pid",), "SIGKILL that rank's session"),
    "usage": Kind(OWNER, ("token",), "(stdin only) the CPU seconds of the ranks reaped so far"),
    "ready": Kind(TEMPLATE_PROCESS, ("pid",), "imports done (on a connection: with its Python and workbench)",
                  ("prefix", "executable", "workbench", "code")),
    "forked": Kind(TEMPLATE_PROCESS, ("token", "pid"), "the rank asked for by ``token`` runs"),
    "fork_failed": Kind(TEMPLATE_PROCESS, ("token", "message"), "the fork asked for by ``token`` failed"),
    "exit": Kind(TEMPLATE_PROCESS, ("pid", "code"), "a forked rank ended (``code`` as ``Popen.returncode``); "
                 "``cpu_s``: the CPU seconds its process spent in all, from its reaped usage", ("cpu_s",)),
    "usage_answer": Kind(TEMPLATE_PROCESS, ("token", "cpu_s"), "the answer to ``usage``"),
}


class Protocol:
    """One table of kinds: builds the messages senders send and checks those receivers get."""

    def __init__(self, name: str, kinds: dict[str, Kind]) -> None:
        self.name = name
        self.kinds = kinds

    def message(self, kind: str, /, **fields: Any) -> dict[str, Any]:
        """The message of ``kind`` with ``fields``: every required field, no undeclared one."""
        declared = self.kinds.get(kind)
        if declared is None:
            raise ProtocolError(f"{self.name} protocol: kind {kind!r} is not declared in workbench.base.protocol")
        missing = [f for f in declared.fields if f not in fields]
        unknown = sorted(set(fields) - set(declared.fields) - set(declared.optional))
        if missing or unknown:
            raise ProtocolError(f"{self.name} protocol: {kind!r} " + "; ".join(
                part for part in (missing and f"lacks {', '.join(missing)}", unknown and f"has no {', '.join(unknown)}")
                if part))
        return {"type": kind, **fields}

    def received(self, message: dict[str, Any], sender: str) -> str:
        """The kind of a message that came from ``sender``; ProtocolError if that sender sends no such kind."""
        kind = message.get("type")
        declared = self.kinds.get(kind) if isinstance(kind, str) else None
        if declared is None or declared.sender != sender:
            raise ProtocolError(f"{self.name} protocol: a {sender} sent {kind!r}, which it does not send")
        return kind

    def markdown(self) -> str:
        """The table as Markdown (docs/reference/workbench.base.protocol.md holds it)."""
        rows = ["| kind | from | fields | may add | meaning |", "|---|---|---|---|---|"]
        for kind, k in self.kinds.items():
            rows.append(f"| `{kind}` | {k.sender} | {', '.join(k.fields)} | {', '.join(k.optional)} | "
                        f"{k.meaning.replace('``', '`')} |")
        return "\n".join(rows)


CONTROL = Protocol("control", CONTROL_KINDS)
TEMPLATE = Protocol("template", TEMPLATE_KINDS)
message = CONTROL.message


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
