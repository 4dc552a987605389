"""Typed errors of the workbench, one clear message each.

Every error a user can cause is raised before any rank process starts and says what was wrong and what is
allowed; the CLI prints ``str(error)`` as one line and exits 2. Every exception class of the workbench derives
from :class:`WorkbenchError`: these, those of the rooms (``TemplateError``, ``JoinError``, ``CommError``,
``ProtocolError``, ...) and the signals a rank's loop raises to itself (``GenerationChanged``, ``Detected``).
"""

from __future__ import annotations


class WorkbenchError(Exception):
    """Base class of every error the workbench raises on purpose."""


class ConfigError(WorkbenchError, ValueError):
    """A run configuration (field, fault plan, YAML file) is invalid."""

    def __init__(self, field: str, message: str) -> None:
        self.field = field
        self.message = message
        super().__init__(f"{field}: {message}")


class RunStartError(WorkbenchError):
    """The rank processes could not be started or did not report in time."""


class ResultsError(WorkbenchError):
    """A result file or directory cannot be read."""


class ProtocolError(WorkbenchError):
    """A message of a kind its protocol does not declare, or without a field its kind requires."""


class SweepError(WorkbenchError):
    """A sweep's notebook, parameters, grid or output directory is invalid (raised before any point runs)."""
