"""What a sweep runs: its points (``-p`` products and grid files), their ids, the parameters a notebook declares,
the default number of jobs, and the sweep directory's record of its points (``DIR/sweep.json``).

Protocol: :mod:`workbench.launch.sweeps.run` (Points, Ids, Jobs). Nothing here starts a process.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from workbench.base.errors import SweepError
from workbench.base.fallbacks import taken
from workbench.base.h5files import FileKindError, make_directory, read_json, remove_directories
from workbench.config.files import DuplicateKeyError, load_yaml
from workbench.launch.sweeps.point import write_json
from workbench.launch.sweeps.requeue import POINT_PARAMETER

SWEEP_FILE = "sweep.json"


def read_sweep_spec(directory: str | os.PathLike) -> dict[str, Any]:
    """``DIR/sweep.json``, checked: a mapping with ``notebook`` and ``points`` (each an ``id`` and its
    ``parameters``); :class:`~workbench.base.h5files.FileKindError`, one line, when it is missing or malformed."""
    directory = Path(directory)
    if not directory.is_dir():
        raise FileKindError(directory, f"is not a sweep directory ({'a file' if directory.exists() else 'missing'})")
    path = directory / SWEEP_FILE
    if not path.exists():
        raise FileKindError(directory, f"is not a sweep directory (no {SWEEP_FILE})")
    spec = read_json(path, "sweep record")
    points = spec.get("points") if isinstance(spec, dict) else None
    if not isinstance(points, list) or not isinstance(spec.get("notebook"), str) or not all(
            isinstance(p, dict) and isinstance(p.get("id"), str) and isinstance(p.get("parameters"), dict)
            for p in points) or not isinstance(spec.get("declared", {}), dict):
        raise FileKindError(path, "is not a valid sweep record: it needs 'notebook' and 'points' (each an 'id' and "
                            "its 'parameters')")
    return spec


def parse_value(text: str) -> Any:
    """A value given on the command line, read as YAML: ``0`` -> 0, ``1e-3`` -> 0.001, ``true`` -> True,
    ``null`` -> None, ``[64, 32]`` -> [64, 32], ``shrink`` -> "shrink"."""
    import yaml

    try:
        value = load_yaml(text) if text.strip() else text
    except DuplicateKeyError as exc:
        raise SweepError(f"value {text!r} {exc}: give each key once") from None
    except yaml.YAMLError:
        return text
    if isinstance(value, str) and re.fullmatch(r"[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+", value):
        return float(value)  # YAML 1.1 reads 1e-3 (no dot) as a string
    return value


def point_id(point: Mapping[str, Any]) -> str:
    """Readable, stable and unique: ``name=value`` in name order (slugged, at most 80 characters) and 8 hex digits
    of the SHA-256 of the point's canonical JSON."""
    canonical = json.dumps(dict(sorted(point.items())), sort_keys=True, separators=(",", ":"), default=str)
    digest = hashlib.sha256(canonical.encode()).hexdigest()[:8]
    readable = ",".join(f"{k}={slug(v if isinstance(v, str) else json.dumps(v))}" for k, v in sorted(point.items()))
    return f"{readable[:80]}-{digest}" if readable else digest


def slug(text: str) -> str:
    """``text`` with every run of characters other than letters, digits and ``._+-`` made one ``_``."""
    return re.sub(r"[^A-Za-z0-9._+-]+", "_", text).strip("_") or "_"


def grid_points(parameters: Mapping[str, Iterable[Any]] | None = None,
                grid: str | os.PathLike | list[dict[str, Any]] | dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """The points of a sweep (see the module docstring), in order; raises ``SweepError`` on an empty list of
    values, a malformed grid or a duplicate point."""
    base: list[dict[str, Any]] = [{}]
    if grid is not None:
        base = _grid_file_points(grid)
    product: list[dict[str, Any]] = [{}]
    for name, values in (parameters or {}).items():
        values = list(values) if isinstance(values, (list, tuple, range)) else [values]
        if not values:
            raise SweepError(f"parameter {name!r} has no values")
        product = [{**p, name: v} for p in product for v in values]
    points = [{**b, **p} for b in base for p in product]
    seen: dict[str, dict[str, Any]] = {}
    for p in points:
        pid = point_id(p)
        if pid in seen:
            raise SweepError(f"the grid holds the point {p} twice")
        seen[pid] = p
    return points


def _grid_file_points(grid: str | os.PathLike | list[dict[str, Any]] | dict[str, Any]) -> list[dict[str, Any]]:
    import yaml

    if isinstance(grid, (str, os.PathLike)):
        path = Path(grid)
        if not path.is_file():
            raise SweepError(f"grid file {str(path)!r} does not exist")
        try:
            grid = load_yaml(path.read_text())
        except DuplicateKeyError as exc:
            raise SweepError(f"grid file {str(path)!r} {exc}: give each key once") from None
        except yaml.YAMLError as exc:
            raise SweepError(f"grid file {str(path)!r} is not valid YAML: {' '.join(str(exc).split())}") from None
    if isinstance(grid, dict) and set(grid) == {"points"}:
        grid = grid["points"]
    if isinstance(grid, list):
        if not grid or not all(isinstance(p, dict) and all(isinstance(k, str) for k in p) for p in grid):
            raise SweepError("a grid list must be a non-empty list of mappings name: value")
        return [dict(p) for p in grid]
    if isinstance(grid, dict) and grid and all(isinstance(k, str) for k in grid):
        points: list[dict[str, Any]] = [{}]
        for name, values in grid.items():
            values = values if isinstance(values, list) else [values]
            if not values:
                raise SweepError(f"grid parameter {name!r} has no values")
            points = [{**p, name: v} for p in points for v in values]
        return points
    raise SweepError("a grid must be a mapping name: [values] (cartesian product) or a list of mappings (points)")


def notebook_parameters(notebook: str | os.PathLike) -> dict[str, Any]:
    """The parameters a notebook declares in its cell tagged ``parameters``: name -> default.

    Read with Python's ``ast`` (every assigned name; a default that is not a literal is kept as its source), since
    ``papermill.inspect_notebook`` skips any line holding two ``=`` (``fault = "kill:rank=2,step=60"``); papermill's
    reading is the fall-back for a cell that is not plain Python (said: ``parameters_cell_not_python``). No cell
    tagged ``parameters``: none."""
    import ast

    path = Path(notebook)
    if not path.is_file() or path.suffix != ".ipynb":
        raise SweepError(f"notebook {str(path)!r} does not exist or is not a .ipynb file")
    try:
        cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise SweepError(f"{str(path)!r} is not a notebook: {exc}") from None
    tagged = [c for c in cells if "parameters" in c.get("metadata", {}).get("tags", [])]
    if not tagged:
        return {}
    source = tagged[0].get("source", "")
    source = "".join(source) if isinstance(source, list) else source
    try:
        tree = ast.parse(source)
    except SyntaxError as exc:
        import papermill

        taken("parameters_cell_not_python", f"{path}: the cell tagged parameters is not plain Python ({exc.msg}, "
              f"line {exc.lineno}): its parameters are read by papermill, which drops any line holding two '='")
        return {name: p.get("default") for name, p in papermill.inspect_notebook(str(path)).items()}
    declared: dict[str, Any] = {}
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
            node, ast.AnnAssign) else []
        for target in targets:
            if isinstance(target, ast.Name) and node.value is not None:
                try:
                    declared[target.id] = ast.literal_eval(node.value)
                except ValueError:
                    declared[target.id] = ast.unparse(node.value)
    return declared


def default_jobs(points: list[dict[str, Any]], declared: Mapping[str, Any]) -> int:
    """Concurrent points: ``max(1, min(cores, 2 * cores // world))``, world = the largest world size."""
    worlds = [p.get("world_size", declared.get("world_size", 1)) for p in points] or [1]
    world = max(w if isinstance(w, int) and w > 0 else 1 for w in worlds)
    cores = os.cpu_count() or 1
    return max(1, min(cores, 2 * cores // world))


def prepare(notebook: str | os.PathLike, parameters: Mapping[str, Iterable[Any]] | None,
            grid: str | os.PathLike | list[dict[str, Any]] | dict[str, Any] | None, out: str | os.PathLike,
            jobs: int | None) -> tuple[Path, Path, dict[str, Any], list[dict[str, Any]]]:
    """Check the sweep's input (SweepError before anything runs) and record its points in ``DIR/sweep.json``."""
    notebook = Path(notebook)
    declared = notebook_parameters(notebook)
    points = grid_points(parameters, grid)
    unknown = sorted({k for p in points for k in p} - set(declared))
    if unknown:
        raise SweepError(f"{notebook.name} has no parameter {', '.join(map(repr, unknown))}; it declares: "
                         f"{', '.join(declared) or 'none (no cell tagged parameters)'}")
    for name in ("out", POINT_PARAMETER):
        if any(name in p for p in points):
            raise SweepError(f"{name!r} is set by the sweep (DIR/<point id>); do not give it")
    if jobs is not None and jobs < 1:
        raise SweepError(f"jobs must be at least 1, not {jobs}")
    directory = Path(out).resolve()
    sweep_file = directory / SWEEP_FILE
    previous = read_sweep_spec(directory) if sweep_file.exists() else None
    if previous and Path(previous["notebook"]).resolve() != notebook.resolve():
        raise SweepError(f"{directory} holds a sweep of {previous['notebook']}, not {notebook}; choose another out")
    known = {p["id"]: p["parameters"] for p in (previous or {}).get("points", [])}
    known.update({point_id(p): p for p in points})
    created = make_directory(directory)  # OutputError, one line, for a read-only place or a path under a file
    try:
        write_json(sweep_file, {"notebook": str(notebook.resolve()), "declared": declared,
                                "points": [{"id": k, "parameters": v} for k, v in known.items()]})
    except BaseException:
        remove_directories(created)
        raise
    return notebook, directory, declared, points


def point_task(directory: Path, notebook: Path, declared: Mapping[str, Any], point: dict[str, Any],
               kernel_name: str | None, timeout: float | None) -> dict[str, Any]:
    """What a worker (:mod:`workbench.launch.sweeps.point`) is sent to run one point: its id, directory, notebook
    and parameters, with ``out`` and ``point`` (:data:`~workbench.launch.sweeps.requeue.POINT_PARAMETER`: the point's
    directory, which the notebook hands to its runs, ``workbench.run(..., point=point)``) when the notebook declares
    them."""
    pid = point_id(point)
    given = {"out": str(directory / pid), POINT_PARAMETER: str((directory / pid).resolve())}
    params = {**point, **{name: value for name, value in given.items() if name in declared}}
    return {"id": pid, "dir": str(directory / pid), "notebook": str(notebook.resolve()), "parameters": params,
            "kernel_name": kernel_name, "timeout": timeout}
