"""The systems our users would otherwise use, run as strategies on our harness (same model, data, faults and
figures), so a comparison is measured in one run: ``torchft`` (torchft 0.2: lighthouse, Manager, its DDP and
optimizer wrappers; per-step fault tolerance), ``torchrun`` (torch.distributed.run with ``--max-restarts``:
restart the world from the last checkpoint, plain torch DDP) and ``ulfm`` (Open MPI 5's User-Level Failure
Mitigation through mpi4py: the survivors revoke, shrink, agree and go on; ``.[mpi]``).

Each peer's rank processes speak our control protocol (hello, ready, step, fault, done) so the supervisor watches,
injects and records them exactly as it does ours; inside, they train the way that peer's users do.
"""

from __future__ import annotations

from workbench.strategies import MPI_INSTALL_HINT, mpirun_path
from workbench.strategies import PEER_INSTALL_HINT as INSTALL_HINT
from workbench.strategies import registry as strategies

__all__ = ["AGENT_PEERS", "INSTALL_HINT", "MPI_INSTALL_HINT", "PEER_STRATEGIES", "mpirun_path", "require_peer"]

PEER_STRATEGIES = strategies.peers()
AGENT_PEERS = tuple(n for n in PEER_STRATEGIES if strategies.get(n).peer.agent)  # ranks join slots of ours


def require_peer(strategy: str) -> None:
    """A one-line ConfigError (the CLI exits 2) when a peer's packages are not installed; imports nothing."""
    peer = strategies.get(strategy).peer
    if peer is not None:
        peer.require(strategy)
