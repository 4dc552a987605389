"""Fault kinds: one frozen :class:`FaultKind` per kind, looked up once (:func:`get`, :func:`of`).

A kind says everything the rest of the code asks of it: the keys it takes beside rank and step|time, where it
fires (:class:`Fires`), the signal it sends, whether the lab fires it live, its button, its help line and whether
the peer systems accept it; its own checks and behaviour are functions held by the object. Parsing validates by
lookup, the supervisor and the ranks dispatch on the fields. Adding a kind is one object here, its event (fields
and plot marker) in :mod:`workbench.faults.events`, and its tests (docs/concepts.md, "Fault kinds", shows
``delay``).
"""

from __future__ import annotations

import enum
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from workbench.base.errors import ConfigError

RANDOM = "random"  # the failure process's form (random:mtbf_steps=M,...): not a kind, it draws kinds (``random``)
FLIP_TARGETS = ("weight", "buffer", "grad", "grad_local", "activation", "optimizer")


class Fires(enum.Enum):
    """Where a fault of the kind takes effect."""

    RANK = "rank"  # the rank itself, at its step's fault point (mid-exchange); at a time: the supervisor sends it
    INJECTOR = "injector"  # the rank's bit-flip injector (workbench.rank.soft_errors)
    THROTTLE = "throttle"  # the rank's throttle, every step of a span (workbench.rank.throttle)
    BOUNDARY = "boundary"  # the supervisor, at a step boundary every member stops before


@dataclass(frozen=True)
class FaultKind:
    """One fault kind."""

    name: str
    summary: str  # one line: the docs, the settings table
    grammar: tuple[str, ...]  # its --fault forms (the settings table, the CLI's help)
    keys: tuple[str, ...] = ()  # the keys it takes beside rank and step|time
    fires: Fires = Fires.RANK
    signal: str | None = None  # the signal its rank gets (sent by itself at a step, by the supervisor at a time)
    blocks: bool = False  # the rank's training thread blocks for good (its heartbeat goes on)
    notice: bool = False  # a notice: the rank leaves at a step boundary (grace= seconds)
    names_rank: bool = True  # rank=R (or a flip's stage=S); False: the whole world (resize)
    next_step: bool = False  # step=-1: at the rank's next step (a live one, or one sent at a time)
    random: bool = False  # a random failure process may draw it (random:...,kind=NAME)
    peers: bool = False  # the peer systems' ranks fire it too (torchft, torchrun, ulfm)
    peer_refusal: str = "{fault} is ours and does not apply to it"  # said when a peer strategy is given it
    live: bool = False  # run.NAME(rank) fires it live (the supervisor's command NAME)
    button: str | None = None  # the lab's per-rank button style ("" plain); None: no button
    check: Callable[[Any], None] | None = None  # its own keys' checks (a ConfigError)
    hold: Callable[[Any], None] | None = None  # behaviour at the rank's fault point; then the step goes on

    @property
    def kills(self) -> bool:
        """The rank dies by its own kill (its teardown is measured: workbench.results.clock)."""
        return self.signal == "SIGKILL"

    @property
    def ends_rank(self) -> bool:
        """Once fired the rank is gone or frozen: its death (if any) is this fault's."""
        return self.signal is not None or self.blocks

    def accepts(self, peer: bool) -> bool:
        """A strategy takes it: every strategy of ours; a peer system's only when ``peers``."""
        return self.peers or not peer


def number(value: Any, low: float) -> bool:
    """A real number >= ``low`` (no bool, no NaN)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value >= low


def _check_flip(f: Any) -> None:
    if f.target not in FLIP_TARGETS:
        raise ConfigError("fault", f"flip target={f.target!r} is not known: allowed {', '.join(FLIP_TARGETS)}")
    if not f.tensor and not (f.target == "activation" and f.stage is not None):
        raise ConfigError("fault", "flip needs tensor=NAME (a parameter name from named_parameters(), "
                          "or a module name for target=activation; with stage=S an activation flip "
                          "defaults to the activation stage S sends to the next stage)")
    for key in ("index", "bit", "seed", "stage"):
        value = getattr(f, key)
        if value is not None and (not isinstance(value, int) or value < 0):
            raise ConfigError("fault", f"flip {key}={value!r} must be an integer >= 0")


def _check_slow(f: Any) -> None:
    if not number(f.factor, 1) or f.factor == 1:
        raise ConfigError("fault", f"slow needs factor=F, a number > 1 (how many times as long a step takes; "
                          f"got {f.factor!r})")
    start = f.step if f.step is not None else f.time
    if f.until is not None and not (number(f.until, 0) and start is not None and f.until > start):
        raise ConfigError("fault", f"slow until={f.until!r} must come after its start ({start}), in the "
                          "same unit (steps with step=, seconds with time=)")


def _check_preempt(f: Any) -> None:
    if f.grace is not None and not number(f.grace, 0):
        raise ConfigError("fault", f"preempt grace={f.grace!r} must be a number of seconds >= 0")


def _check_resize(f: Any) -> None:
    if f.rank is not None:
        raise ConfigError("fault", "resize names no rank: resize:world=N,step=S (or time=T)")
    if not isinstance(f.world, int) or isinstance(f.world, bool) or f.world < 1:
        raise ConfigError("fault", f"resize needs world=N, an integer >= 1 (got {f.world!r})")


def _check_delay(f: Any) -> None:
    if not isinstance(f.ms, int) or isinstance(f.ms, bool) or not 1 <= f.ms <= 600_000:
        raise ConfigError("fault", f"delay needs ms=M, an integer 1..600000 (milliseconds its messages are held "
                          f"back; got {f.ms!r})")


def _hold_delay(f: Any) -> None:
    """The rank's messages of this step are held back: it sleeps before handing its last contribution on (the
    others wait in the exchange), then the step goes on as without the fault."""
    time.sleep(f.ms / 1000)


KILL = FaultKind("kill", "SIGKILL: the rank dies at once", ("kill:rank=R,step=S", "kill:rank=R,time=T"),
                 signal="SIGKILL", random=True, peers=True, live=True, button="danger")
HANG = FaultKind("hang", "SIGSTOP: the rank freezes; only its missing heartbeats tell", ("hang:rank=R,step=S",),
                 signal="SIGSTOP", peers=True, live=True, button="warning")
STALL = FaultKind("stall", "the training thread blocks while the heartbeat goes on (the progress watchdog finds it)",
                  ("stall:rank=R,step=S",), blocks=True, next_step=True, peer_refusal="stall faults is ours and "
                  "does not apply to it", live=True, button="info")
PREEMPT = FaultKind("preempt", "notice: grace=G seconds to leave at a step boundary",
                    ("preempt:rank=R,step=S,grace=G",), keys=("grace",), notice=True, live=True, button="",
                    check=_check_preempt)
SLOW = FaultKind("slow", "the rank's steps take factor=F times as long, from step (or time) until until=U",
                 ("slow:rank=R,factor=F,step=S,until=U",), keys=("factor", "until"), fires=Fires.THROTTLE,
                 random=True, peer_refusal="slow faults are ours and do not apply to it", live=True, button="",
                 check=_check_slow)
FLIP = FaultKind("flip", "a bit flip in a weight, buffer, gradient, activation or optimizer state",
                 (f"flip:target={'|'.join(FLIP_TARGETS)},rank=R,step=S,tensor=NAME,index=I,bit=B",),
                 keys=("target", "tensor", "index", "bit", "seed", "stage"), fires=Fires.INJECTOR, next_step=True,
                 peer_refusal="flip faults is ours and does not apply to it", live=True, check=_check_flip)
RESIZE = FaultKind("resize", "the world becomes world=N ranks at a step boundary", ("resize:world=N,step=S",),
                   keys=("world",), fires=Fires.BOUNDARY, names_rank=False, live=True, check=_check_resize)
DELAY = FaultKind("delay", "at step S the rank's messages are held back ms=M milliseconds; nothing else changes",
                  ("delay:rank=R,step=S,ms=M",), keys=("ms",), next_step=True,
                  peer_refusal="delay faults are ours and do not apply to it", check=_check_delay, hold=_hold_delay)

REGISTRY: dict[str, FaultKind] = {k.name: k for k in (KILL, HANG, STALL, PREEMPT, SLOW, FLIP, RESIZE, DELAY)}
NAMES = tuple(REGISTRY)
KEYS = tuple(dict.fromkeys(key for kind in REGISTRY.values() for key in kind.keys))  # every kind-specific key
RANDOM_NAMES = tuple(k.name for k in REGISTRY.values() if k.random)
BUTTONS = {k.name: k.button for k in REGISTRY.values() if k.button is not None}  # lab method name -> style
GRAMMAR = tuple(form for k in REGISTRY.values() for form in k.grammar)


def find(name: Any) -> FaultKind | None:
    return REGISTRY.get(name) if isinstance(name, str) else None


def get(name: str) -> FaultKind:
    """The kind named ``name``, or a one-line ConfigError."""
    kind = find(name)
    if kind is None:
        raise ConfigError("fault", f"kind {name!r} is not known: allowed {', '.join(NAMES)}, {RANDOM}")
    return kind


def of(fault: Any) -> FaultKind:
    """The kind of a planned fault (a FaultSpec, or a random failure process: the kind it draws)."""
    return get(fault.kind)


def names_rank(name: Any) -> bool:
    """A fault of this kind names a rank (an unknown kind is said by the FaultSpec check)."""
    kind = find(name)
    return kind is None or kind.names_rank


def refuse_on_peer(strategy: str, faults: list[Any]) -> None:
    """The one place that decides which kinds a peer system takes: a ConfigError for the first that it does not."""
    for fault in faults:
        kind = find(getattr(fault, "kind", None))
        if kind is not None and not kind.accepts(peer=True):
            raise ConfigError("strategy", f"{strategy!r} runs the peer system as its users do; "
                              + kind.peer_refusal.format(fault=fault))
