"""Workbench for studying fault tolerance in distributed deep-learning training.

The public names are imported on first use (PEP 562): a rank process or the rank template, which import
``workbench.rank``, do not pay for the session, the sweeps and papermill.
"""

from __future__ import annotations

import importlib
from typing import Any

_PUBLIC = {
    "ConfigError": "workbench.base.errors", "WorkbenchError": "workbench.base.errors",
    "FaultSpec": "workbench.config.run", "RunConfig": "workbench.config.run",
    "RunResult": "workbench.results.run_result", "load_results": "workbench.results.run_result",
    "Run": "workbench.launch.session", "run": "workbench.launch.session", "start": "workbench.launch.session",
    "load_sweep": "workbench.launch.sweeps.run", "sweep": "workbench.launch.sweeps.run",
    "Lab": "workbench.launch.lab",  # the lab panel (ipywidgets): loaded only when asked for
}

__all__ = sorted(_PUBLIC)
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    if name not in _PUBLIC:
        raise AttributeError(f"module 'workbench' has no attribute {name!r}")
    value = getattr(importlib.import_module(_PUBLIC[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_PUBLIC])
