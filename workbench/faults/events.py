"""The run's event kinds, declared once: :data:`REGISTRY`, one frozen :class:`EventKind` per kind, looked up by
:func:`get`. A run's events are rows ``{time, step, rank, kind, detail, **fields}`` (:data:`COLUMNS`): every kind
declares its fields, which the recorder (:meth:`workbench.supervisor.recorder.Recorder.event`) checks: an undeclared
kind, a declared field missing or an undeclared one given raises :class:`EventError` (a programming error). Readers
(the figures, the lab, the campaigns) select rows by these objects (:func:`of`, :func:`fired`) and read the fields,
never the ``detail`` prose, which is for people (:func:`text`). A kind's :class:`Marker` is how figures mark it.
The docs' table (``docs/reference/workbench.faults.events.md``) is :func:`markdown`'s; a test checks it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from workbench.base.errors import WorkbenchError
from workbench.faults import kinds as fault_kinds

COLUMNS = ("time", "step", "rank", "kind", "detail")  # every event row; ``step``/``rank`` -1: none
# where a fault that fired came from (its event's ``source``): the run's fault plan (at a step, at a time, or drawn
# by its failure process), a live command (the lab, ``Run.kill``), the whole job's notice (a signal to the run's
# process), or a notice signal that reached one rank from outside the run (SIGUSR1, SIGTERM)
PLANNED, LIVE, JOB, SIGNAL = SOURCES = ("planned", "live", "job", "signal")
VALUES = {"source": SOURCES}  # fields whose values are checked too
# why a fault did not fire (a ``fault_skipped`` event's ``reason``): its rank was gone, was no member (a notice), or
# never reached the step (said at the run's end)
NOT_ALIVE, NOT_MEMBER, NOT_REACHED = "not_alive", "not_member", "not_reached"


class EventError(WorkbenchError):
    """An event of a kind that is not declared, or without (or with more than) the fields its kind declares."""


@dataclass(frozen=True)
class Marker:
    """How figures mark a kind's events: plotly's ``symbol`` and a ``colour``; ``curve``: on
    :func:`workbench.results.plots.training_curve`, ``live``: on the lab's live figure."""

    symbol: str
    colour: str
    curve: bool = True
    live: bool = True


@dataclass(frozen=True)
class EventKind:
    """One kind of run event: its name, what it means, the fields it carries beside :data:`COLUMNS` (always) and
    those it may carry; ``quiet``: the command line's progress does not print it; ``fault``: a fault that fired (its
    events carry ``source``, one of :data:`SOURCES`); ``marker``: how figures mark it (None: not marked)."""

    name: str
    meaning: str
    fields: tuple[str, ...]
    optional: tuple[str, ...] = ()
    quiet: bool = False
    fault: bool = False
    marker: Marker | None = None

    def __post_init__(self) -> None:
        if not self.fields or set(self.fields) & {*COLUMNS, *self.optional}:
            raise EventError(f"event {self.name!r} declares no fields of its own, or a column among them")
        if self.fault and self.fields[0] != "source":
            raise EventError(f"event {self.name!r} is a fault's: its first field is its source")

    def check(self, fields: dict[str, Any]) -> None:
        """Raise :class:`EventError` unless ``fields`` are this kind's: every declared one, nothing else, and a
        checked field's value one of :data:`VALUES`."""
        missing = [f for f in self.fields if f not in fields]
        extra = sorted(set(fields) - set(self.fields) - set(self.optional))
        wrong = [f"{f}={fields[f]!r} (allowed: {', '.join(allowed)})" for f, allowed in VALUES.items()
                 if f in fields and fields[f] not in allowed]
        if missing or extra or wrong:
            raise EventError(f"event {self.name!r}: " + "; ".join(
                [f"missing field(s) {', '.join(missing)}"] * bool(missing)
                + [f"undeclared field(s) {', '.join(extra)}"] * bool(extra) + wrong)
                + f" (declared: {', '.join(self.fields + self.optional)})")


def _kinds(*declared: EventKind) -> dict[str, EventKind]:
    return {kind.name: kind for kind in declared}


def _fault(kind: fault_kinds.FaultKind, fields: tuple[str, ...], marker: Marker) -> EventKind:
    """The event of a fault of ``kind`` that fired: its ``source``, then ``fields``."""
    return EventKind(kind.name, f"fault fired: {kind.summary}", ("source", *fields), fault=True, marker=marker)


# -- a fault that fired, one kind per fault kind (workbench.faults.kinds) ----------------------------------------
KILL = _fault(fault_kinds.KILL, (), Marker("x", "crimson"))
HANG = _fault(fault_kinds.HANG, (), Marker("square", "darkorange"))
STALL = _fault(fault_kinds.STALL, (), Marker("hourglass", "goldenrod"))
PREEMPT = _fault(fault_kinds.PREEMPT, ("grace",), Marker("hexagram", "sienna"))
SLOW = _fault(fault_kinds.SLOW, ("factor",), Marker("triangle-down", "peru"))
FLIP = _fault(fault_kinds.FLIP, ("target", "tensor", "index", "bit", "old", "new"),
              Marker("bowtie", "goldenrod", curve=False))
RESIZE = _fault(fault_kinds.RESIZE, ("world", "world_before"), Marker("triangle-right", "slategray"))
DELAY = _fault(fault_kinds.DELAY, (), Marker("star-triangle-up", "steelblue"))
FAULTS = _kinds(KILL, HANG, STALL, PREEMPT, SLOW, FLIP, RESIZE, DELAY)
assert list(FAULTS) == list(fault_kinds.REGISTRY), "each fault kind's event is declared here, in its order"

# -- the run's own events ---------------------------------------------------------------------------------------
STORE = EventKind("store", "the rendezvous store a multi-host run's ranks join through (``address``), and the "
                  "``hosts`` its ranks run on", ("address", "hosts"))
TEMPLATE = EventKind("template", "a note of the rank template ranks are forked from (``shared``: another "
                     "process's, else this process's own)", ("shared",))
WAITING = EventKind("waiting", "a rank is to be started on another ``host``: the command that starts it there",
                    ("host",))
HOST = EventKind("host", "a rank joined from another ``host``", ("host",))
JOIN_REFUSED = EventKind("join_refused", "a process asked to join from ``host`` and was refused (why)", ("host",))
GENERATION = EventKind("generation", "a new generation ``gen``: its ``members`` (rank labels) start or resume "
                       "training; ``recovery``: the strategy that led here (None: a start or a regrow)",
                       ("gen", "members", "recovery"), marker=Marker("diamond", "royalblue"))
JOINED = EventKind("joined", "a member synced its state for generation ``gen`` in ``sync_s`` (``bytes_in`` "
                   "received; a GPU rank's ``gpu_wait_s``: its wait for dead ranks' GPU memory)",
                   ("gen", "sync_s", "bytes_in"), ("gpu_wait_s",), quiet=True)
GOSSIP = EventKind("gossip", "gossip ``members`` do not fill the hypercube of ``slots``: a member whose partner "
                   "slot is empty skips that round's average", ("members", "slots"))
FAILURE = EventKind("failure", "a member was lost (its ``cause``; ``world_after``: the world it leaves): a failure "
                    "record opens", ("cause", "world_after"), marker=Marker("x-thin", "crimson"))
RECOVERED = EventKind("recovered", "the recovery generation (``recovery``: its strategy; ``retried``: the failed "
                      "step finished by the survivors) or a soft error's ``action`` resumed at ``step``",
                      ("recovery", "action", "retried"), marker=Marker("triangle-up", "seagreen"))
RESTART = EventKind("restart", "the world restarts: ``world`` fresh ranks, from the checkpoint ``resume`` (None: "
                    "from step 0, or as the peer's agent restarts them)", ("world", "resume"),
                    marker=Marker("circle-open", "purple", live=False))
RESPAWN = EventKind("respawn", "a fresh process starts for a lost rank (``cause``: why the one before it was lost, "
                    "None for the first)", ("cause",))
SPARE = EventKind("spare", "a warm spare (process ``spawn_id``) takes a lost rank's place", ("spawn_id",))
SPARE_LOST = EventKind("spare_lost", "a starting or spare rank failed before it joined (``cause``; ``refilled``: "
                       "another spare starts)", ("cause", "refilled"))
REGROW = EventKind("regrow", "replacements rejoined (``ranks``): the world is back to its size", ("ranks",),
                   marker=Marker("star", "teal", live=False))
NEWCOMERS = EventKind("newcomers", "a resize starts new ``ranks``: they join at the next step boundary", ("ranks",))
RESIZED = EventKind("resized", "the world has ``world`` ranks from a step boundary on: ``joined``, ``left``",
                    ("world", "joined", "left"))
CHECKPOINT = EventKind("checkpoint", "a periodic checkpoint is complete on disk (``path``, stall and write times)",
                       ("path", "stall_s", "write_s"))
CHECKPOINT_SKIPPED = EventKind("checkpoint_skipped", "a checkpoint (``path``) that cannot be resumed from was passed "
                               "over (``reason``)", ("path", "reason"))
FAULT_SKIPPED = EventKind("fault_skipped", "a fault of kind ``fault`` that did not fire (``reason``: ``not_alive``, "
                          "its rank was gone; ``not_member``; ``not_reached``, said at the end: it never reached the "
                          "step)",
                          ("fault", "source", "reason"))
BOUNDARY_SKIPPED = EventKind("boundary_skipped", "a planned step ``boundary`` lies past the run's end", ("boundary",))
PREEMPT_FALLBACK = EventKind("preempt_fallback", "a preempted rank's ``grace`` ran out before the step ``boundary``",
                             ("grace", "boundary"), marker=Marker("x-open", "sienna", live=False))
SLOW_END = EventKind("slow_end", "a slow rank runs at full speed again (``factor``: the slow-down that ended)",
                     ("factor",))
STRAGGLER = EventKind("straggler", "the straggler detector flagged a rank: its median step time ``own_s`` against the "
                      "others' ``others_s`` (``dropped``: the run dropped it)", ("own_s", "others_s", "dropped"),
                      marker=Marker("star-diamond", "orangered"))
DETECTED = EventKind("detected", "a soft-error ``detector`` fired (what it saw) and took its ``action``",
                     ("detector", "action"), marker=Marker("circle", "black", curve=False))
APOPTOSIS = EventKind("apoptosis", "adaptive neuron apoptosis removed ``removed`` units of a ``layer`` (its width "
                      "``before`` and ``after``; the model's ``hidden_units`` and ``parameters`` then)",
                      ("layer", "removed", "before", "after", "tau", "hidden_units", "parameters"))
FALLBACK = EventKind("fallback", "the run fell back on something (``what``; workbench.base.fallbacks)", ("what",))
ERROR = EventKind("error", "a rank raised an error (its message); the run fails (``reason``: the error's own, "
                  "else None)", ("reason",))
PEER_ERROR = EventKind("peer_error", "a peer rank raised an error its peer system handles", ("reason",))
TORCHRUN = EventKind("torchrun", "the torchrun agent started ``world`` workers, up to ``restarts`` restarts",
                     ("world", "restarts"))
MPIRUN = EventKind("mpirun", "ULFM: mpirun started ``world`` MPI processes (``ft``: with fault tolerance)",
                   ("world", "ft"))
SHRINKING = EventKind("shrinking", "ULFM: the ``survivors`` revoke, shrink and go on", ("survivors",))
ULFM = EventKind("ulfm", "ULFM: the survivors revoked, shrank and agreed (timings): ``size`` ranks go on (``bytes``: "
                 "the state broadcast)", ("size", "revoke_s", "shrink_s", "agree_s", "bytes"))
ULFM_ERROR = EventKind("ulfm_error", "ULFM: a survivor's MPI call failed (``error``)", ("error",))
QUORUM = EventKind("quorum", "torchft: a replica saw a new quorum", ("quorum_id", "participants"))
DISCARDED = EventKind("discarded", "torchft: a replica's step was not committed (``error``: None when it said none)",
                      ("error",))
FINISH = EventKind("finish", "the run was asked to end at a step boundary (run.finish): every rank stops "
                   "after ``steps`` steps and reports done", ("steps",))
END = EventKind("end", "the run ended: its ``outcome`` and ``reason``", ("outcome", "reason"), quiet=True)
REQUEUED = EventKind("requeued", "a sweep point ran again, resumed from the ``checkpoint`` kept when its job was "
                     "preempted (workbench.launch.sweeps.requeue)", ("checkpoint",))

OWN = _kinds(STORE, TEMPLATE, WAITING, HOST, JOIN_REFUSED, GENERATION, JOINED, GOSSIP, FAILURE, RECOVERED, RESTART,
             RESPAWN, SPARE, SPARE_LOST, REGROW, NEWCOMERS, RESIZED, CHECKPOINT, CHECKPOINT_SKIPPED, FAULT_SKIPPED,
             BOUNDARY_SKIPPED, PREEMPT_FALLBACK, SLOW_END, STRAGGLER, DETECTED, APOPTOSIS, FALLBACK, ERROR, PEER_ERROR,
             TORCHRUN, MPIRUN, SHRINKING, ULFM, ULFM_ERROR, QUORUM, DISCARDED, FINISH, END, REQUEUED)
REGISTRY: dict[str, EventKind] = {**FAULTS, **OWN}
NAMES = tuple(REGISTRY)


def get(name: object) -> EventKind:
    """The declared kind ``name``; :class:`EventError` for any other."""
    kind = REGISTRY.get(name) if isinstance(name, str) else None
    if kind is None:
        raise EventError(f"event kind {name!r} is not declared in workbench/faults/events.py")
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


def fired(rows: Iterable[dict[str, Any]], source: str | None = None) -> list[dict[str, Any]]:
    """The rows of faults that fired, in order; of ``source`` only (one of :data:`SOURCES`) where given. The rows
    must carry their fields (a result file older than its fields: :meth:`RunResult.fielded_events
    <workbench.results.run_result.RunResult.fielded_events>` says so)."""
    if source is not None and source not in SOURCES:
        raise EventError(f"source {source!r} is not one of {', '.join(SOURCES)}")
    return [e for e in of(rows, *FAULTS) if source is None or e["source"] == source]


def marked(curve: bool = False, live: bool = False) -> tuple[EventKind, ...]:
    """The kinds whose events figures mark: on the training curve (``curve``) or on the lab's live figure
    (``live``), in declaration order."""
    return tuple(k for k in REGISTRY.values() if k.marker is not None
                 and ((curve and k.marker.curve) or (live and k.marker.live)))


def text(event: dict[str, Any], rank: bool = True) -> str:
    """An event as people read it (a hover text, a message): its ``detail``, after its rank where it has one and
    ``rank`` asks for it. The one reader of the prose: it is shown, never matched."""
    said = str(event["detail"])
    return f"rank {event['rank']}: {said}" if rank and event.get("rank", -1) >= 0 else said


def markdown() -> str:
    """The declaration as a markdown table (docs/reference/workbench.faults.events.md)."""
    lines = ["| kind | fields | may add | marker | meaning |", "|---|---|---|---|---|"]
    for kind in REGISTRY.values():
        m = kind.marker
        where = "" if m is None else " (" + ", ".join(w for w, on in (("curve", m.curve), ("lab", m.live)) if on) + ")"
        marker = "" if m is None else f"{m.symbol}, {m.colour}{where}"
        lines.append(f"| `{kind.name}` | {', '.join(kind.fields)} | {', '.join(kind.optional)} | {marker} | "
                     f"{kind.meaning.replace('``', '`')} |")
    return "\n".join(lines) + "\n"
