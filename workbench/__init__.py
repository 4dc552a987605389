"""Workbench for studying fault tolerance in distributed deep-learning training."""

from workbench.config import FaultSpec, RunConfig
from workbench.errors import ConfigError, WorkbenchError
from workbench.results import RunResult, load_results
from workbench.session import Run, run, start
from workbench.sweep import load_sweep, sweep

__all__ = ["ConfigError", "FaultSpec", "Run", "RunConfig", "RunResult", "WorkbenchError",
           "load_results", "load_sweep", "run", "start", "sweep"]
__version__ = "0.1.0"
