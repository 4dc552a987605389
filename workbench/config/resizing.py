"""Membership changes at a step boundary: which world sizes a run may be resized to (per parallel mode), the ranks
that leave a shrink, and the outside signals a rank takes as a preemption notice. The
boundary protocol: docs/permanent-faults.md ("Preemption with notice", "Resizing on request")."""

from __future__ import annotations

from typing import Any

from workbench import strategies
from workbench.base import modes
from workbench.base.errors import ConfigError
from workbench.base.modes import MAX_WORLD_SIZE  # the most ranks a run may have, at its start and after any resize

NOTICE_SIGNALS = ("SIGUSR1", "SIGUSR2", "SIGTERM")


def check_world(config: Any, n: Any, what: str) -> int:
    """``n`` if ``config``'s run may be resized to ``n`` ranks, else a ConfigError naming ``what`` and what is
    allowed: 1..64 ranks (at most ``batch_size``) and what the mode's own check allows (gossip a power of two,
    hybrid whole lanes, each able to hold the micro-batches); a pipeline keeps its one lane, and the peers their own
    membership. Under ``resize_rule`` linear each rank (lane) keeps its batch: the bounds on the batch are the
    training set's (:func:`workbench.config.resize_rule.check_sizes`)."""
    mode = config.mode
    if strategies.get(config.strategy).peer is not None:
        raise ConfigError("fault", f"{what}: {config.strategy!r} runs the peer system as its users do; resizing is "
                          "ours and does not apply to it")
    if not mode.resizes:
        raise ConfigError("fault", f"{what}: {mode.no_resize}; resizing applies to parallelism "
                          f"{modes.said(lambda m: m.resizes, 'and', lanes=' (whole lanes)')}")
    if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= MAX_WORLD_SIZE:
        raise ConfigError("fault", f"{what}: the world size must be an integer 1..{MAX_WORLD_SIZE}, got {n!r}")
    if mode.check_resize is not None:
        mode.check_resize(config, n, what)
    if n > config.batch_size and config.resize_rule == "keep":  # linear: each rank keeps its batch
        raise ConfigError("fault", f"{what}: {n} ranks cannot split a global batch of {config.batch_size}")
    return n


def check_notice(config: Any) -> None:
    """``preempt_grace`` (seconds >= 0) and ``notice_signals`` (a list, or comma-separated, of NOTICE_SIGNALS)."""
    grace = config.preempt_grace
    if isinstance(grace, bool) or not isinstance(grace, (int, float)) or not 0 <= grace < float("inf"):
        raise ConfigError("preempt_grace", f"{grace!r} is not allowed: a number of seconds >= 0")
    if isinstance(config.notice_signals, str):
        config.notice_signals = [s.strip() for s in config.notice_signals.split(",") if s.strip()]
    if not isinstance(config.notice_signals, list):
        raise ConfigError("notice_signals", f"{config.notice_signals!r} is not a list of signal names")
    for name in config.notice_signals:
        if name not in NOTICE_SIGNALS:
            raise ConfigError("notice_signals", f"{name!r} is not allowed: {', '.join(NOTICE_SIGNALS)}")


def leaving(config: Any, members: list[int], n: int) -> list[int]:
    """The members that leave a shrink to ``n`` ranks: the highest labels (the newest ranks) first; in a hybrid run
    the newest of each stage, so that every stage keeps n / stages replicas."""
    if not config.mode.lanes:
        return sorted(members)[n:]
    keep = n // config.pipeline_stages
    by_stage: dict[int, list[int]] = {}
    for label in sorted(members):
        by_stage.setdefault(config.stage_of(label), []).append(label)
    return sorted(label for labels in by_stage.values() for label in labels[keep:])
