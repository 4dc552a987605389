"""User code named by an import path: ``--model mypkg.models:build`` or ``dataset="mypkg.data:load"``.

:data:`IMPORT_PATH` tells such a path from a built-in name; :func:`resolve_callable` imports it, raising a
:class:`~workbench.base.errors.ConfigError` for the setting that named it.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable
from typing import Any

from workbench.base.errors import ConfigError

IMPORT_PATH = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")


def resolve_callable(field_name: str, path: str) -> Callable[..., Any]:
    """Import ``package.module:callable`` (attribute chains allowed) or raise a ConfigError saying why not."""
    module_name, _, attr = path.partition(":")
    try:
        obj: Any = importlib.import_module(module_name)
    except Exception as exc:  # noqa: BLE001 - any import failure is the user's to see, in one line
        raise ConfigError(field_name, f"cannot import module {module_name!r}: {type(exc).__name__}: {exc}") from None
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ConfigError(field_name, f"module {module_name!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise ConfigError(field_name, f"{path!r} is not callable")
    return obj

