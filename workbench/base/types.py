"""The types of :class:`~workbench.config.run.RunConfig`'s fields, checked before their values: a wrong type is named as
a type (``world_size: must be an integer, got str '4'``), not reported as a value out of range.

Checked by the field's annotation: ``int`` (a bool is not one), ``float`` (an int is one: :func:`as_floats`),
``bool``, their ``| None`` forms (numpy's numbers are taken, as Python's), ``list[int]`` (a tuple is one) and
``list[str]`` (a comma-separated string is one); the fault plan and the hosts must be lists, whose entries
:mod:`workbench.config.run` checks, as it checks the strings.
"""

from __future__ import annotations

import dataclasses
import numbers
from typing import Any

from workbench.base.errors import ConfigError

_KINDS = {"int": "an integer", "float": "a number", "bool": "true or false", "list[int]": "a list of integers",
          "list[str]": "a list of names"}


def _is(kind: str, value: Any) -> bool:
    if kind == "int":  # numpy's integers too (a sweep's grid); never a bool
        return isinstance(value, numbers.Integral) and not isinstance(value, bool)
    if kind == "float":
        return isinstance(value, numbers.Real) and not isinstance(value, bool)
    if kind == "bool":
        return isinstance(value, bool)
    return isinstance(value, (list, tuple)) or (kind == "list[str]" and isinstance(value, str))


def _got(value: Any) -> str:
    return f"got {type(value).__name__} {value!r}"


def coerce_types(config: Any) -> None:
    """Raise a ConfigError for the first field of ``config`` whose value has the wrong type; numpy's numbers
    become Python's."""
    for f in dataclasses.fields(config):
        annotation = str(f.type).replace(" ", "")
        optional = annotation.endswith("|None")
        kind = annotation.removesuffix("|None")
        value = getattr(config, f.name)
        if optional and value is None:
            continue
        if kind not in _KINDS:  # the fault plan, the hosts: a list, whose entries config.py checks
            if kind.startswith("list[") and value is not None and not isinstance(value, (list, tuple)):
                raise ConfigError(f.name, f"must be a list{' or None' if optional else ''}, {_got(value)}")
            continue
        if not _is(kind, value):
            raise ConfigError(f.name, f"must be {_KINDS[kind]}{' or None' if optional else ''}, {_got(value)}")
        if kind in ("int", "float") and type(value) not in (int, float):  # numpy's: as Python's
            try:
                setattr(config, f.name, int(value) if kind == "int" else float(value))
            except OverflowError:
                raise ConfigError(f.name, f"{value!r} is too large for a float") from None
        elif kind.startswith("list[") and not isinstance(value, str):
            element = kind[5:-1]
            for i, item in enumerate(value):
                if not (_is("int", item) if element == "int" else isinstance(item, str)):
                    raise ConfigError(f.name, f"must be {_KINDS[kind]}, got {type(item).__name__} {item!r} at "
                                      f"index {i} of {value!r}")
            if element == "int":
                setattr(config, f.name, [int(item) for item in value])


def as_floats(cls: Any, values: dict[str, Any]) -> dict[str, Any]:
    """``values`` with the ints of ``cls``'s float fields as floats (``lr=1`` is recorded as ``1.0``)."""
    floats = {f.name for f in dataclasses.fields(cls) if str(f.type) == "float"}
    values = dict(values)
    for name in floats & {k for k, v in values.items() if type(v) is int}:
        try:
            values[name] = float(values[name])
        except OverflowError:
            raise ConfigError(name, f"{values[name]} is too large for a float") from None
    return values
