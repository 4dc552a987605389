"""Slow ranks and stragglers, the settings' side: the responses a run may choose when the supervisor's straggler
detector (:mod:`workbench.supervisor.stragglers`) flags a rank, and their checks (docs/permanent-faults.md,
"Slow ranks and stragglers").
"""

from __future__ import annotations

from typing import Any

from workbench import strategies
from workbench.base.errors import ConfigError

# off: no detector; flag: an event, the run goes on with the straggler (tolerate); drop: the straggler is killed
# and recovered from like a failed rank (the strategy's own reaction: shrink goes on smaller, regrow / reinit /
# checkpoint_restart bring a replacement)
STRAGGLER_RESPONSES = ("off", "flag", "drop")
MAX_WINDOW = 10_000


def check_straggler_settings(config: Any) -> None:
    """One-line ConfigErrors for ``straggler_response``, ``straggler_factor`` and ``straggler_window``."""
    response, factor, window = config.straggler_response, config.straggler_factor, config.straggler_window
    if response not in STRAGGLER_RESPONSES:
        raise ConfigError("straggler_response", f"{response!r} is not known: allowed {', '.join(STRAGGLER_RESPONSES)}")
    if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not 1 < factor < float("inf"):
        raise ConfigError("straggler_factor", f"{factor!r} must be a number > 1 (a rank is a straggler when its step "
                          "time is this many times the others' median)")
    if isinstance(window, bool) or not isinstance(window, int) or not 3 <= window <= MAX_WINDOW:
        raise ConfigError("straggler_window", f"{window!r} is out of range: allowed integers 3..{MAX_WINDOW} (steps "
                          "the detector compares over)")
    peer = strategies.get(config.strategy).peer is not None  # a slow fault on a peer: faults.kinds.refuse_on_peer
    if response == "drop" and peer:
        raise ConfigError("straggler_response", f"drop is ours: {config.strategy!r} runs the peer system as its users "
                          "do (allowed: off, flag)")


def check_live_slow(factor: Any, seconds: Any) -> tuple[float, float | None]:
    """``run.slow``'s arguments as (factor, seconds), or a one-line ConfigError."""
    if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not 1 <= factor < float("inf"):
        raise ConfigError("factor", f"{factor!r} must be a number >= 1 (how many times as long each step takes; "
                          "1: full speed again)")
    if seconds is not None and (isinstance(seconds, bool) or not isinstance(seconds, (int, float))
                                or not 0 < seconds < float("inf")):
        raise ConfigError("seconds", f"{seconds!r} must be a number of seconds > 0, or None (until changed)")
    return float(factor), None if seconds is None else float(seconds)
