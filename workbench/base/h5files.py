"""One validation layer for the workbench's files: what an HDF5 path holds, checked before anything reads it, and
outputs that are written whole or not at all.

:func:`inspect` tells what a path holds — a checkpoint, a run result, a sweep table or another table — or raises
:class:`FileKindError` with one line (missing, empty, not HDF5, truncated, no workbench layout, a newer
``format``, or, with :func:`require`, another kind). Every reader of those files goes through it; :func:`read_json`
does the same for JSON records. :func:`atomic_output` writes to a hidden temporary file and renames it into place;
an ``OSError`` becomes :class:`OutputError`. The layouts it recognises: docs/internals.md.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from workbench.base.errors import ResultsError, WorkbenchError

CHECKPOINT, RESULT, SWEEP_TABLE, TABLE = "checkpoint", "result", "sweep table", "table"
# the newest layout ``format`` of each kind this code reads (and writes); a run result's format 2: every event row
# carries its kind's declared fields (workbench.faults.events), format 1 holds the rows without them
FORMATS = {CHECKPOINT: 1, RESULT: 2, SWEEP_TABLE: 1, TABLE: 1}
DESCRIPTIONS = {CHECKPOINT: "a workbench checkpoint", RESULT: "a run result (result.h5)",
                SWEEP_TABLE: "a sweep table (results.h5)", TABLE: "a workbench table (e.g. sensitivity.h5)"}


class FileKindError(ResultsError):
    """A file to read is missing, unreadable, damaged, or not the workbench file it should be (one line)."""

    def __init__(self, path: str | os.PathLike, message: str) -> None:
        self.path = str(path)
        super().__init__(one_line(f"{self.path} {message}"))


class OutputError(WorkbenchError):
    """An output cannot be written: a read-only or full place, a path under a file, a directory in the way."""

    def __init__(self, path: str | os.PathLike, reason: str) -> None:
        self.path = str(path)
        super().__init__(one_line(f"cannot write {self.path}: {reason}"))


@dataclass
class H5Info:
    """What :func:`inspect` found: the kind, its layout ``format``, and every dataset's shape and dtype."""

    path: Path
    kind: str
    format: int
    datasets: dict[str, tuple[tuple[int, ...], str]] = field(default_factory=dict)
    config: dict[str, Any] | None = None  # checkpoints and results: the run configuration they record

    @property
    def description(self) -> str:
        return DESCRIPTIONS[self.kind]


def one_line(text: str) -> str:
    return " ".join(str(text).split())


def reason(exc: BaseException) -> str:
    """An exception as a short phrase: an ``OSError``'s ``strerror`` (HDF5's own messages span several lines)."""
    if isinstance(exc, OSError) and exc.errno and (exc.strerror or os.strerror(exc.errno)):
        return exc.strerror or os.strerror(exc.errno)
    text = one_line(str(exc)) or type(exc).__name__
    return text.removeprefix("Unable to synchronously open file ").removeprefix("Unable to open file ")


def inspect(path: str | os.PathLike) -> H5Info:
    """Open ``path`` and tell which workbench file it is (see the module docstring); :class:`FileKindError`
    with one line when it is none."""
    import h5py

    path = Path(path)
    try:
        _check_plain_file(path)
        with path.open("rb") as handle:
            head = handle.read(8)
    except OSError as exc:  # FileKindError is none
        raise FileKindError(path, f"cannot be read: {reason(exc)}") from None
    if not h5py.is_hdf5(str(path)):
        text = head and all(32 <= b < 127 or b in b"\t\r\n" for b in head)
        raise FileKindError(path, "is not an HDF5 file" + (" (it holds text)" if text else ""))
    try:
        with h5py.File(path, "r") as f:
            return _classify(path, f)
    except FileKindError:
        raise
    except (OSError, RuntimeError, KeyError, ValueError, TypeError) as exc:
        if "unable to lock file" in str(exc):
            raise FileKindError(path, "is locked: another process is writing it") from None
        truncated = "truncated" in str(exc)
        raise FileKindError(path, f"is a damaged HDF5 file ({'truncated' if truncated else reason(exc)})") from None


def require(path: str | os.PathLike, *kinds: str, purpose: str = "") -> H5Info:
    """:func:`inspect`, and a :class:`FileKindError` unless the file is one of ``kinds``; ``purpose`` ends the
    message (e.g. ``"verify checks checkpoints"``)."""
    info = inspect(path)
    if info.kind not in kinds:
        wanted = " or ".join(DESCRIPTIONS[k].split(" (")[0] for k in kinds)
        raise FileKindError(path, f"is {info.description}, not {wanted}" + (f": {purpose}" if purpose else ""))
    return info


def _check_plain_file(path: Path) -> None:
    if not path.exists():
        parent = next((p for p in path.parents if p.exists()), None)
        if parent is not None and not parent.is_dir():
            raise FileKindError(path, f"does not exist ({parent} is a file, not a directory)")
        raise FileKindError(path, "does not exist")
    if path.is_dir():
        raise FileKindError(path, "is a directory, not a file")
    if not path.is_file():
        raise FileKindError(path, "is not a regular file")
    if path.stat().st_size == 0:
        raise FileKindError(path, "is empty (0 bytes), not an HDF5 file")


def _classify(path: Path, f: Any) -> H5Info:
    import h5py

    attrs = f.attrs
    datasets: dict[str, tuple[tuple[int, ...], str]] = {}
    f.visititems(lambda name, obj: datasets.__setitem__(name, (tuple(obj.shape), obj.dtype.name))
                 if isinstance(obj, h5py.Dataset) else None)
    if "step" in attrs and isinstance(f.get("model"), h5py.Group):
        kind = CHECKPOINT
    elif "summary" in attrs and isinstance(f.get("metrics"), h5py.Group):
        kind = RESULT
    elif "columns" in attrs and isinstance(f.get("columns"), h5py.Group):
        kind = SWEEP_TABLE if "signature" in attrs and "notebook" in attrs else TABLE
    else:
        raise FileKindError(path, "is an HDF5 file but no workbench checkpoint, result or table")
    info = H5Info(path, kind, _format(path, kind, attrs), datasets)
    {CHECKPOINT: _check_checkpoint, RESULT: _check_result}.get(kind, _check_table)(info, f)
    return info


def _format(path: Path, kind: str, attrs: Any) -> int:
    value = attrs.get("format")
    try:
        number = int(value)
    except (TypeError, ValueError):
        raise FileKindError(path, f"is {DESCRIPTIONS[kind]} without a layout format number") from None
    if number > FORMATS[kind]:
        raise FileKindError(path, f"is {DESCRIPTIONS[kind]} of layout format {number}; this workbench reads format "
                            f"{FORMATS[kind]} and older: update the workbench")
    if number < 1:
        raise FileKindError(path, f"is {DESCRIPTIONS[kind]} with an invalid layout format {number}")
    return number


def _json_attr(info: H5Info, attrs: Any, name: str, default: Any = None) -> Any:
    if name not in attrs:
        if default is not None:
            return default
        raise FileKindError(info.path, f"is {info.description} without its {name!r} attribute")
    try:
        value = json.loads(attrs[name])
    except (TypeError, ValueError):
        raise FileKindError(info.path, f"is {info.description} whose {name!r} attribute is not JSON") from None
    if not isinstance(value, type(default) if default is not None else dict):
        raise FileKindError(info.path, f"is {info.description} whose {name!r} attribute has the wrong type")
    return value


def _check_checkpoint(info: H5Info, f: Any) -> None:
    try:
        step = int(f.attrs["step"])
    except (TypeError, ValueError):
        raise FileKindError(info.path, "is a workbench checkpoint whose step is not a number") from None
    if step < 0:
        raise FileKindError(info.path, f"is a workbench checkpoint with a negative step ({step})")
    info.config = _json_attr(info, f.attrs, "config", {})
    if not any(name.startswith("model/") for name in info.datasets):
        raise FileKindError(info.path, "is a workbench checkpoint without model parameters (empty group 'model')")
    nested = [n for n in info.datasets if n.startswith("model/") and n.count("/") > 1]
    if nested:
        raise FileKindError(info.path, f"is a workbench checkpoint with a nested model dataset {nested[0]!r}")


def _check_result(info: H5Info, f: Any) -> None:
    _json_attr(info, f.attrs, "summary")
    info.config = _json_attr(info, f.attrs, "config")
    columns = {n: shape for n, (shape, _) in info.datasets.items() if n.startswith("metrics/")}
    if "metrics/step" not in columns:
        raise FileKindError(info.path, "is a run result without its metrics/step column")
    lengths = {shape for shape in columns.values()}
    if len(lengths) != 1 or len(next(iter(lengths))) != 1:
        raise FileKindError(info.path, "is a run result whose metrics columns are not 1-D columns of one length")
    for name in ("events", "failures"):
        if name not in info.datasets or len(info.datasets[name][0]) != 1:
            raise FileKindError(info.path, f"is a run result without its 1-D {name!r} dataset")


def _check_table(info: H5Info, f: Any) -> None:
    names = _json_attr(info, f.attrs, "columns", [])
    shapes = [info.datasets.get(f"columns/{i:04d}", (None, ""))[0] for i in range(len(names))]
    if any(s is None for s in shapes):
        raise FileKindError(info.path, f"is {info.description} with a column missing ({len(names)} named)")
    if len({s for s in shapes}) > 1 or any(len(s) != 1 for s in shapes):
        raise FileKindError(info.path, f"is {info.description} whose columns are not 1-D columns of one length")


def read_json(path: str | os.PathLike, what: str) -> Any:
    """A JSON file the workbench wrote (``what`` names it, e.g. ``"sweep record"``); :class:`FileKindError`, one
    line, when it is missing, unreadable or malformed."""
    path = Path(path)
    if path.is_dir():
        raise FileKindError(path, f"is a directory, not a {what}")
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise FileKindError(path, f"does not exist (no {what})") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise FileKindError(path, f"cannot be read as a {what}: {reason(exc)}") from None
    try:
        return json.loads(text)
    except ValueError as exc:
        raise FileKindError(path, f"is not a valid {what}: malformed JSON ({reason(exc)})") from None


def output_error(path: str | os.PathLike, exc: OSError) -> OutputError:
    """An ``OSError`` met writing ``path`` as one line; a path under a file says which file is in the way."""
    path = Path(path)
    if isinstance(exc, (NotADirectoryError, FileExistsError, FileNotFoundError)):
        blocking = next((p for p in path.parents if p.exists() and not p.is_dir()), None)
        if blocking is not None:
            return OutputError(path, f"{blocking} is a file, not a directory")
    if path.is_dir():
        return OutputError(path, "it is a directory")
    return OutputError(path, reason(exc))


def check_output_place(path: str | os.PathLike) -> Path:
    """Refuse, before anything is written, an output path that cannot be one: a directory, or a path below a
    file; :class:`OutputError`. (A read-only or full place shows when the output is written.)"""
    path = Path(path)
    if path.is_dir():
        raise OutputError(path, "it is a directory")
    blocking = next((p for p in path.parents if p.exists() and not p.is_dir()), None)
    if blocking is not None:
        raise OutputError(path, f"{blocking} is a file, not a directory")
    return path


def make_directory(directory: str | os.PathLike) -> list[Path]:
    """Create ``directory`` with its parents; the directories created, outermost first (to remove them again
    when what they were made for fails); :class:`OutputError` when it cannot be."""
    directory = Path(directory)
    if directory.exists() and not directory.is_dir():
        raise OutputError(directory, "it is a file, not a directory")
    missing = [p for p in (directory, *directory.parents) if not p.exists()][::-1]
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise output_error(directory, exc) from None
    return missing


def remove_directories(created: list[Path]) -> None:
    """Remove the directories :func:`make_directory` created, innermost first, where they are still empty."""
    for directory in reversed(created):
        try:
            directory.rmdir()
        except OSError:
            return


@contextmanager
def atomic_output(path: str | os.PathLike, *, mkdir: bool = True) -> Iterator[Path]:
    """Yield a hidden temporary path beside ``path`` (``.<name>.<pid>.tmp``); when the block ends, rename it onto
    ``path``. On any failure the temporary file (and any directory made for it) is removed and an ``OSError``
    raises :class:`OutputError` naming ``path``."""
    path = Path(path)
    if path.is_dir():
        raise OutputError(path, "it is a directory")
    created = make_directory(path.parent) if mkdir else []
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        yield tmp
        os.replace(tmp, path)
    except BaseException as exc:
        try:
            tmp.unlink(missing_ok=True)
        except OSError:
            pass  # never made: the place is not writable
        remove_directories(created)
        if isinstance(exc, OSError) and not isinstance(exc, WorkbenchError):
            raise output_error(path, exc) from None
        raise


def write_text(path: str | os.PathLike, text: str) -> Path:
    """Write ``text`` to ``path`` through :func:`atomic_output`."""
    with atomic_output(path) as tmp:
        tmp.write_text(text, encoding="utf-8")
    return Path(path)
