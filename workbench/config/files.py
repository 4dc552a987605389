"""Run settings that come from files: the one YAML reader of the package (:func:`load_yaml`: a key given twice in
a mapping, block or flow style, is an error, not the last value taken silently), a YAML file of settings
(:func:`read_settings`) and the one line for a ``resume`` path that is no checkpoint file
(:func:`missing_checkpoint`: a directory is named as one, with the newest checkpoint it holds)."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

from workbench.base.errors import ConfigError, WorkbenchError


class DuplicateKeyError(WorkbenchError, ValueError):
    """A mapping of a YAML document names a key twice; ``key`` and ``lines`` (1-based) say which and where."""

    def __init__(self, key: Any, lines: tuple[int, int]) -> None:
        self.key, self.lines = key, lines
        where = f"both on line {lines[0]}" if lines[0] == lines[1] else f"lines {lines[0]} and {lines[1]}"
        super().__init__(f"names {key!r} twice ({where})")


def load_yaml(text: str) -> Any:
    """The YAML document ``text``, read as ``yaml.safe_load`` reads it except that a mapping naming a key twice
    raises :class:`DuplicateKeyError`; invalid YAML raises ``yaml.YAMLError``."""
    import yaml

    return yaml.load(text, Loader=_strict_loader())  # a SafeLoader


def read_settings(path: str | Path) -> dict[str, Any]:
    """The mapping of run settings in the YAML file ``path``; a ConfigError in one line for a missing or unreadable
    file, invalid YAML, a key given twice in one mapping, or a document that is no mapping."""
    import yaml

    path = Path(path)
    try:
        values = load_yaml(path.read_text())
    except FileNotFoundError:
        raise ConfigError("config", f"file {str(path)!r} does not exist") from None
    except DuplicateKeyError as exc:
        raise ConfigError("config", f"{str(path)!r} {exc}: give each setting once") from None
    except (OSError, UnicodeDecodeError) as exc:  # a directory, unreadable, not text
        raise ConfigError("config", f"cannot read {str(path)!r}: {getattr(exc, 'strerror', None) or exc}") from None
    except yaml.YAMLError as exc:
        raise ConfigError("config", f"{str(path)!r} is not valid YAML: {str(exc).splitlines()[0]}") from None
    if values is None:
        return {}
    if not isinstance(values, dict):
        raise ConfigError("config", f"{str(path)!r} must hold a mapping of run settings")
    return values


@functools.cache
def _strict_loader() -> type:
    """A SafeLoader whose mappings, block or flow style, refuse a key they already hold (PyYAML keeps the last one
    silently)."""
    import yaml

    class StrictLoader(yaml.SafeLoader):
        pass

    def mapping(loader: yaml.SafeLoader, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        lines: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue  # '<<: *anchor': explicit keys override merged ones, as YAML means
            key = loader.construct_object(key_node, deep=True)
            line = key_node.start_mark.line + 1
            try:
                if key in lines:
                    raise DuplicateKeyError(key, (lines[key], line))
                lines[key] = line
            except TypeError:
                continue  # an unhashable key: SafeLoader's own error names it
        return yaml.SafeLoader.construct_mapping(loader, node, deep)

    StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, mapping)
    return StrictLoader


def missing_checkpoint(resume: str) -> str:
    """Why ``resume`` is no checkpoint file, in a phrase: empty, a directory (and the newest checkpoint in it), a
    dangling link, or nothing there."""
    path = Path(resume)
    if not str(resume).strip():
        return "an empty path is not allowed: give a checkpoint file"
    if path.is_dir():
        found = [p for folder in (path / "checkpoints", path) for p in
                 (*sorted(folder.glob("step_*.h5")), folder / "final.h5") if p.is_file()][-1:]
        return (f"{resume!r} is a directory, not a checkpoint file: give one of the HDF5 checkpoints a run wrote, "
                + (f"e.g. {found[0]} (its newest)" if found else "e.g. OUT/checkpoints/step_000050.h5"))
    if path.is_symlink():
        return f"checkpoint {resume!r} is a dangling symbolic link"
    return f"checkpoint {resume!r} does not exist"
