"""Resizing a run while it trains: which world sizes a run may be resized to (per parallel mode), the ranks that
leave a shrink, and the learning-rate rule a resize applies. The boundary protocol itself: docs/permanent-faults.md
("Preemption and resizing")."""

from __future__ import annotations

from typing import Any

from workbench import strategies
from workbench.errors import ConfigError

MAX_WORLD_SIZE = 64  # as workbench.config's (this module is imported by it)
LR_RULES = ("keep", "linear")  # keep the learning rate; scale it with the world size (the per-rank batch kept)


def check_world(config: Any, n: Any, what: str) -> int:
    """``n`` if ``config``'s run may be resized to ``n`` ranks, else a ConfigError naming ``what`` and what is
    allowed: data parallel 1..64 ranks (at most ``batch_size``), gossip a power of two >= 2; pipeline and hybrid
    runs keep their stages, and the peers their own membership."""
    mode = config.parallelism
    if strategies.get(config.strategy).peer is not None:
        raise ConfigError("fault", f"{what}: {config.strategy!r} runs the peer system as its users do; resizing is "
                          "ours and does not apply to it")
    if mode in ("pipeline", "hybrid"):
        raise ConfigError("fault", f"{what}: a {mode} run keeps its stages; resizing applies to parallelism 'data' "
                          "and 'gossip'")
    if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= MAX_WORLD_SIZE:
        raise ConfigError("fault", f"{what}: the world size must be an integer 1..{MAX_WORLD_SIZE}, got {n!r}")
    if mode == "gossip" and (n < 2 or n & (n - 1)):
        raise ConfigError("fault", f"{what}: {n} is not a power of two; parallelism 'gossip' pairs rank r with "
                          "r XOR 2^h: allowed 2, 4, 8, 16, 32 or 64")
    if n > config.batch_size:
        raise ConfigError("fault", f"{what}: {n} ranks cannot split a global batch of {config.batch_size}")
    return n


def leaving(members: list[int], n: int) -> list[int]:
    """The members that leave a shrink to ``n`` ranks: the highest labels (the newest ranks) first."""
    return sorted(members)[n:]


def resized_lr(rule: str, lr: float, initial_world: int, world: int) -> float:
    """The learning rate after a resize to ``world`` ranks under ``rule`` (``LR_RULES``)."""
    return lr if rule == "keep" else lr * world / initial_world
