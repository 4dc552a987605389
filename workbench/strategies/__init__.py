"""The recovery strategies, used along the flow by ``config`` (validation), the ``supervisor`` (its reaction to a
death) and ``rank`` (what ranks keep and do): one object per name in :mod:`.registry`, re-exported here
(``strategies.get(name)``), and :mod:`.peers`, the peer systems (torchft, torchrun, ULFM) run as strategies.

The name ``peers`` here is the subpackage; the function listing the peer strategies is ``registry.peers``.
"""

from workbench.strategies.registry import (
    CHECKPOINT_RESTART,
    FORWARD,
    MPI_INSTALL_HINT,
    NAMES,
    NONE,
    PEER_INSTALL_HINT,
    REGISTRY,
    REINIT,
    ROLLBACK,
    ROLLBACK_THEN_RESTART,
    SHRINK,
    TORCHFT,
    TORCHRUN,
    ULFM,
    PeerRuntime,
    Reaction,
    Strategy,
    get,
    mpirun_path,
    recovered_by,
    regrowing,
    replacing,
)

__all__ = ["CHECKPOINT_RESTART", "FORWARD", "MPI_INSTALL_HINT", "NAMES", "NONE", "PEER_INSTALL_HINT", "REGISTRY",
           "REINIT", "ROLLBACK", "ROLLBACK_THEN_RESTART", "SHRINK", "TORCHFT", "TORCHRUN", "ULFM", "PeerRuntime",
           "Reaction", "Strategy", "get", "mpirun_path", "recovered_by", "regrowing", "replacing"]
