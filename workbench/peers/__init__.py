"""The systems our users would otherwise use, run as strategies on our harness (same model, data, faults and
figures), so a comparison is measured in one run: ``torchft`` (torchft 0.2: lighthouse, Manager, its DDP and
optimizer wrappers; per-step fault tolerance) and ``torchrun`` (torch.distributed.run with ``--max-restarts``:
restart the world from the last checkpoint, plain torch DDP).

Each peer's rank processes speak our control protocol (hello, ready, step, fault, done) so the supervisor watches,
injects and records them exactly as it does ours; inside, they train the way that peer's users do.
"""

from __future__ import annotations

import importlib.util

from workbench.errors import ConfigError

PEER_STRATEGIES = ("torchft", "torchrun")
INSTALL_HINT = "pip install -e .[peers]"


def require_torchft() -> None:
    """A one-line ConfigError (the CLI exits 2) when torchft is not installed; imports nothing."""
    if importlib.util.find_spec("torchft") is None:
        raise ConfigError("strategy", f"'torchft' needs the torchft package (0.2), which is not installed: "
                          f"{INSTALL_HINT}")
