"""The run's event kinds, declared once: :data:`REGISTRY`, one frozen :class:`EventKind` per kind, looked up by
:func:`get`. A run's events are rows ``{time, step, rank, kind, detail, **fields}`` (:data:`COLUMNS`); the
recorder (:meth:`workbench.supervisor.recorder.Recorder.event`) writes them and checks each against its kind
here: an undeclared kind, a declared field missing or an undeclared one given raises :class:`EventError` (a
programming error). Readers (the figures, the lab, the command line, the campaigns) select rows by these
objects (:func:`of`) and read the structured fields, never the ``detail`` prose, which is for people.
Declared beside the recorder, their one writer, not beside the protocol (what ranks and the supervisor say);
the fault kinds' events are declared by their :mod:`workbench.faults.kinds` objects. The docs' table
(``docs/reference/workbench.supervisor.events.md``) is :func:`markdown`'s; a test checks it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from workbench.config.errors import WorkbenchError
from workbench.faults import kinds as fault_kinds

COLUMNS = ("time", "step", "rank", "kind", "detail")  # every event row; ``step``/``rank`` -1: none


class EventError(WorkbenchError):
    """An event of a kind that is not declared, or without (or with more than) the fields its kind declares."""


@dataclass(frozen=True)
class EventKind:
    """One kind of run event: its name, the fields it carries beside :data:`COLUMNS` (always) and those it may
    carry, what it means; ``quiet``: the command line's progress does not print it."""

    name: str
    meaning: str
    fields: tuple[str, ...] = ()
    optional: tuple[str, ...] = ()
    quiet: bool = False

    def check(self, fields: Iterable[str]) -> None:
        """Raise :class:`EventError` unless ``fields`` are this kind's: every declared one, nothing else."""
        given = set(fields)
        missing = [f for f in self.fields if f not in given]
        extra = sorted(given - set(self.fields) - set(self.optional))
        if missing or extra:
            raise EventError(f"event {self.name!r}: " + "; ".join(
                [f"missing field(s) {', '.join(missing)}"] * bool(missing)
                + [f"undeclared field(s) {', '.join(extra)}"] * bool(extra))
                + f" (declared: {', '.join(self.fields + self.optional) or 'none'})")


def _kinds(*declared: EventKind) -> dict[str, EventKind]:
    return {kind.name: kind for kind in declared}


# -- the run's own events ---------------------------------------------------------------------------------------
STORE = EventKind("store", "the rendezvous store a multi-host run's ranks join through, and where its ranks run")
TEMPLATE = EventKind("template", "a note of the rank template (the forked process ranks start from)")
WAITING = EventKind("waiting", "a rank is to be started on another host: the command that starts it there")
HOST = EventKind("host", "a rank joined from another host")
JOIN_REFUSED = EventKind("join_refused", "a process asked to join and was refused (why)")
GENERATION = EventKind("generation", "a new generation: its members (rank labels) start or resume training",
                       ("gen", "members"))
JOINED = EventKind("joined", "a member synced its state for generation ``gen`` (``bytes_in`` received; a GPU "
                   "rank's ``gpu_wait_s``: its wait for dead ranks' GPU memory)", ("gen", "bytes_in"),
                   ("gpu_wait_s",), quiet=True)
GOSSIP = EventKind("gossip", "gossip members do not fill the hypercube: a member whose partner slot is empty skips "
                   "that round's average")
FAILURE = EventKind("failure", "a member was lost (its cause): a failure record opens")
RECOVERED = EventKind("recovered", "the recovery generation (or a soft-error rollback) resumed at ``step``")
RESTART = EventKind("restart", "the world restarts (from a checkpoint, or by the peer's agent)")
RESPAWN = EventKind("respawn", "a fresh process starts for a lost rank")
SPARE = EventKind("spare", "a warm spare takes a lost rank's place")
SPARE_LOST = EventKind("spare_lost", "a starting or spare rank failed before it joined")
REGROW = EventKind("regrow", "replacements rejoined: the world is back to its size")
CHECKPOINT = EventKind("checkpoint", "a periodic checkpoint is complete on disk (path, stall and write times)")
CHECKPOINT_SKIPPED = EventKind("checkpoint_skipped", "a checkpoint that cannot be resumed from was passed over")
FAULT_SKIPPED = EventKind("fault_skipped", "a planned or live fault that did not fire: its rank was gone, or (said at "
                          "the end) it never reached the step")
BOUNDARY_SKIPPED = EventKind("boundary_skipped", "a planned step boundary lies past the run's end")
PREEMPT_FALLBACK = EventKind("preempt_fallback", "a preempted rank's grace ran out before the step boundary")
SLOW_END = EventKind("slow_end", "a slow rank runs at full speed again")
STRAGGLER = EventKind("straggler", "the straggler detector flagged a rank (``; dropped``: the run dropped it)")
DETECTED = EventKind("detected", "a soft-error detector fired (which, and what it saw)")
APOPTOSIS = EventKind("apoptosis", "adaptive neuron apoptosis removed units of a layer")
FALLBACK = EventKind("fallback", "the run fell back on something (``what``; workbench.results.fallbacks)", ("what",))
ERROR = EventKind("error", "a rank raised an error (its message); the run fails")
PEER_ERROR = EventKind("peer_error", "a peer rank raised an error its peer system handles")
TORCHRUN = EventKind("torchrun", "the torchrun agent started")
ULFM = EventKind("ulfm", "ULFM: mpirun started, the survivors revoked and shrank (timings)")
ULFM_ERROR = EventKind("ulfm_error", "ULFM: a survivor's MPI call failed")
QUORUM = EventKind("quorum", "torchft: a replica saw a new quorum")
DISCARDED = EventKind("discarded", "torchft: a replica's step was not committed")
FINISH = EventKind("finish", "the run was asked to end at a step boundary (run.finish): every rank stops "
                    "after ``steps`` steps and reports done", ("steps",))
END = EventKind("end", "the run ended: its outcome and reason", quiet=True)
REQUEUED = EventKind("requeued", "a sweep point ran again, resumed from the checkpoint kept when its job was "
                     "preempted (workbench.sweeps.requeue)")

OWN = _kinds(STORE, TEMPLATE, WAITING, HOST, JOIN_REFUSED, GENERATION, JOINED, GOSSIP, FAILURE, RECOVERED, RESTART,
             RESPAWN, SPARE, SPARE_LOST, REGROW, CHECKPOINT, CHECKPOINT_SKIPPED, FAULT_SKIPPED, BOUNDARY_SKIPPED,
             PREEMPT_FALLBACK, SLOW_END, STRAGGLER, DETECTED, APOPTOSIS, FALLBACK, ERROR, PEER_ERROR, TORCHRUN, ULFM,
             ULFM_ERROR, QUORUM, DISCARDED, FINISH, END, REQUEUED)
# a fault that fired (planned or live; a slow rank's start, a preemption's notice, a resize's note): its kind's name
FAULTS = _kinds(*(EventKind(k.name, f"fault fired: {k.summary}") for k in fault_kinds.REGISTRY.values()))
assert not set(FAULTS) & set(OWN), "a fault kind's event is declared by its fault kind"
REGISTRY: dict[str, EventKind] = {**FAULTS, **OWN}
NAMES = tuple(REGISTRY)


def get(name: object) -> EventKind:
    """The declared kind ``name``; :class:`EventError` for any other."""
    kind = REGISTRY.get(name) if isinstance(name, str) else None
    if kind is None:
        raise EventError(f"event kind {name!r} is not declared in workbench/supervisor/events.py")
    return kind


def row(t: float, kind: str | EventKind, step: int, detail: str, rank: int = -1, **fields: Any) -> dict[str, Any]:
    """An event row of a declared kind with its declared fields (checked)."""
    declared = kind if isinstance(kind, EventKind) else get(kind)
    declared.check(fields)
    return {"time": t, "step": step, "rank": rank, "kind": declared.name, "detail": detail, **fields}


def name(kind: str | EventKind) -> str:
    """A declared kind's name (a name is checked)."""
    return kind.name if isinstance(kind, EventKind) else get(kind).name


def of(rows: Iterable[dict[str, Any]], *wanted: str | EventKind) -> list[dict[str, Any]]:
    """The rows of the kinds ``wanted`` (declared kinds or their names), in order."""
    names = {name(kind) for kind in wanted}
    return [e for e in rows if e.get("kind") in names]


def kind_is(event: dict[str, Any], kind: str | EventKind) -> bool:
    """Whether the row ``event`` is of the declared ``kind``."""
    return event.get("kind") == name(kind)


def count(rows: Iterable[dict[str, Any]], *wanted: str | EventKind) -> int:
    return len(of(rows, *wanted))


def markdown() -> str:
    """The declaration as a markdown table (docs/reference/workbench.supervisor.events.md)."""
    lines = ["| kind | fields | may add | meaning |", "|---|---|---|---|"]
    for kind in REGISTRY.values():
        lines.append(f"| `{kind.name}` | {', '.join(kind.fields)} | {', '.join(kind.optional)} | "
                     f"{kind.meaning.replace('``', '`')} |")
    return "\n".join(lines) + "\n"
