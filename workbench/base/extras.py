"""Optional packages by extra: :func:`need` imports a module of one, or says in one line which extra installs it
(``pip install -e .[EXTRA]``). The core runs without them; the parts that use one ask for it where they do."""

from __future__ import annotations

import importlib
from types import ModuleType

from workbench.base.errors import ConfigError


def need(module: str, extra: str, purpose: str) -> ModuleType:
    """``module`` imported, or :class:`ConfigError` naming ``purpose`` and the extra that installs its package."""
    try:
        return importlib.import_module(module)
    except ImportError:
        package = module.split(".")[0]
        raise ConfigError(extra, f"{purpose} need {package}, which is not installed: pip install -e .[{extra}]") \
            from None
