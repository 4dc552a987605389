"""Papermill sweeps: a grid of parameter points, each executed as its own notebook run; resumable, isolated,
aggregated into one table.

Protocol of ``sweep(notebook, parameters, grid, out, jobs)``:
- **Points.** ``parameters`` (name -> list of values) gives the cartesian product; ``grid`` (a YAML file, a list
  of dicts or a dict of lists) gives a list of points (a list) or another product (a dict); with both, every grid
  point is combined with every product point. Names are checked against the parameters the notebook declares
  (``papermill.inspect_notebook``) and every value list must be non-empty — a bad input raises ``SweepError``
  before anything runs. The notebook's ``out`` parameter, if it declares one, is set by the sweep.
- **Ids.** Each point's id is its parameters in name order, slugged, plus 8 hex digits of the SHA-256 of their
  canonical JSON (``seed=0,strategy=shrink-1a2b3c4d``): stable across invocations and orderings of ``-p``.
  The point runs with ``out=DIR/<id>`` and leaves there the executed notebook, ``result.h5``, ``point.json``
  (its status) and ``point.log``.
- **Resume.** A point is complete when its ``point.json`` says ``completed``, which :mod:`workbench.sweep_point`
  writes only after the notebook ran to its end and its ``result.h5`` (written atomically by
  ``RunResult.save``) is there — ``DIR/<id>/result.h5``, or for a notebook that saves several runs under
  ``out`` (``gossip_vs_allreduce``), one below it; such a point's row has no run summary.
  Every other point — never run, interrupted, or failed — runs on the next
  invocation (failed points are retried since a failure may have been an interruption; ``retry_failed=False``
  skips them). A point whose notebook fails is recorded as ``failed`` with a one-line error; the others go on.
- **Processes.** Points run in worker processes (``python -m workbench.sweep_point``), each in a session of its
  own, at most ``jobs`` at a time. On KeyboardInterrupt (Ctrl-C, or SIGTERM through the CLI) every worker is sent
  SIGTERM, kills its kernel and the kernel's rank processes and exits; anything still alive after a bounded wait
  is SIGKILLed (the workers' process trees are read from /proc). Then ``DIR/results.h5`` is written and the
  KeyboardInterrupt propagates. Executed notebooks and results are renamed into place, never half-written.
- **Jobs.** Default: ``max(1, min(cores, 2 * cores // world))`` where ``world`` is the largest ``world_size`` of
  the points (the point's value, else the notebook's default; 1 if the notebook has none): the points' ranks may
  oversubscribe the cores twice, and no more points than cores run at once — on 2 cores, 2 points at a time for
  1- or 2-rank points, 1 for 4-rank points. Measured here (8 points of ``permanent_faults``, 2 ranks): 1 job 116 s,
  2 jobs 86 s, 3 jobs 94 s; 4-rank points already keep both cores busy on their own.
- **Aggregation.** After every invocation (also an interrupted one) ``DIR/results.h5`` holds one row per point
  (:func:`load_sweep`).
"""

from __future__ import annotations

import hashlib
import json
import os
import queue
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from workbench.errors import ResultsError, SweepError
from workbench.results import RESULT_FILE, RunResult, load_table, save_table
from workbench.sweep_point import LOG_FILE, POINT_FILE, descendants, has_result, kill_all, write_json

if TYPE_CHECKING:
    import pandas as pd

SWEEP_FILE = "sweep.json"
ARRAY_FILE = "array.json"  # the points of a Slurm job array, in task order
SLURM_FILE = "sweep.slurm"
TABLE_FILE = "results.h5"
STOP_WAIT_S = 10.0


def parse_value(text: str) -> Any:
    """A value given on the command line, read as YAML: ``0`` -> 0, ``1e-3`` -> 0.001, ``true`` -> True,
    ``null`` -> None, ``[64, 32]`` -> [64, 32], ``shrink`` -> "shrink"."""
    import yaml

    try:
        value = yaml.safe_load(text) if text.strip() else text
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
    readable = ",".join(f"{k}={_slug(v if isinstance(v, str) else json.dumps(v))}" for k, v in sorted(point.items()))
    return f"{readable[:80]}-{digest}" if readable else digest


def _slug(text: str) -> str:
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
            grid = yaml.safe_load(path.read_text())
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
    reading is the fall-back for a cell that is not plain Python. No cell tagged ``parameters``: none."""
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
    except SyntaxError:
        import papermill

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


def point_status(directory: str | os.PathLike) -> dict[str, Any] | None:
    """A point directory's ``point.json``, or None if the point never started."""
    try:
        return json.loads((Path(directory) / POINT_FILE).read_text())
    except (OSError, ValueError):
        return None


def is_complete(directory: str | os.PathLike) -> bool:
    status = point_status(directory)
    if not status or status.get("status") != "completed" or not Path(status.get("notebook", "")).is_file():
        return False
    return "out" not in status.get("parameters", {}) or has_result(Path(directory))


def _prepare(notebook: str | os.PathLike, parameters: Mapping[str, Iterable[Any]] | None,
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
    if any("out" in p for p in points):
        raise SweepError("'out' is set by the sweep (DIR/<point id>); do not give it")
    if jobs is not None and jobs < 1:
        raise SweepError(f"jobs must be at least 1, not {jobs}")
    directory = Path(out).resolve()
    sweep_file = directory / SWEEP_FILE
    previous = json.loads(sweep_file.read_text()) if sweep_file.is_file() else None
    if previous and Path(previous["notebook"]).resolve() != notebook.resolve():
        raise SweepError(f"{directory} holds a sweep of {previous['notebook']}, not {notebook}; choose another out")
    known = {p["id"]: p["parameters"] for p in (previous or {}).get("points", [])}
    known.update({point_id(p): p for p in points})
    directory.mkdir(parents=True, exist_ok=True)
    write_json(sweep_file, {"notebook": str(notebook.resolve()), "declared": declared,
                            "points": [{"id": k, "parameters": v} for k, v in known.items()]})
    return notebook, directory, declared, points


def _task(directory: Path, notebook: Path, declared: Mapping[str, Any], point: dict[str, Any],
          kernel_name: str | None, timeout: float | None) -> dict[str, Any]:
    pid = point_id(point)
    params = {**point, "out": str(directory / pid)} if "out" in declared else dict(point)
    return {"id": pid, "dir": str(directory / pid), "notebook": str(notebook.resolve()), "parameters": params,
            "kernel_name": kernel_name, "timeout": timeout}


def sweep(notebook: str | os.PathLike, parameters: Mapping[str, Iterable[Any]] | None = None, *,
          out: str | os.PathLike, grid: str | os.PathLike | list[dict[str, Any]] | dict[str, Any] | None = None,
          jobs: int | None = None, retry_failed: bool = True, progress: bool | None = None,
          kernel_name: str | None = None, timeout: float | None = None) -> pd.DataFrame:
    """Run ``notebook`` at every point of the grid that is not complete under ``out``; return :func:`load_sweep`.

    ``progress``: a tqdm bar (``tqdm.auto``: a widget in Jupyter) of points, with the cells of the running points;
    default on in a terminal or a Jupyter kernel. ``timeout``: seconds per cell. The frame's ``attrs`` hold
    ``executed``, ``completed``, ``failed`` (ids) and ``skipped`` (already complete) of this invocation.
    Raises ``SweepError`` on bad input before running anything; KeyboardInterrupt after stopping every point.
    """
    notebook, directory, declared, points = _prepare(notebook, parameters, grid, out, jobs)
    tasks, skipped = [], []
    for p in points:
        pid = point_id(p)
        status = point_status(directory / pid)
        if is_complete(directory / pid) or (not retry_failed and status and status.get("status") == "failed"):
            skipped.append(pid)
            continue
        tasks.append(_task(directory, notebook, declared, p, kernel_name, timeout))
    jobs = min(jobs or default_jobs(points, declared), max(len(tasks), 1))
    done: dict[str, dict[str, Any]] = {}
    try:
        if tasks:
            _Scheduler(tasks, jobs, _progress_enabled(progress)).run(done)
    finally:
        frame = aggregate(directory)
    frame.attrs.update(executed=list(done), completed=[k for k, v in done.items() if v["status"] == "completed"],
                       failed=[k for k, v in done.items() if v["status"] != "completed"], skipped=skipped)
    return frame


# ---- beyond one machine: Slurm job arrays ----------------------------------------------------------------------

def emit_slurm(notebook: str | os.PathLike, parameters: Mapping[str, Iterable[Any]] | None = None, *,
               out: str | os.PathLike, grid: str | os.PathLike | list[dict[str, Any]] | dict[str, Any] | None = None,
               kernel_name: str | None = None, timeout: float | None = None,
               sbatch: Iterable[str] = ()) -> Path:
    """Write ``DIR/sweep.slurm``: a Slurm job array with one task per point of the grid (``sbatch DIR/sweep.slurm``).

    Task ``i`` runs ``workbench sweep NOTEBOOK --out DIR --point i``: point ``i`` of ``DIR/array.json``, executed
    exactly as a local sweep executes it (its own worker process and kernel; skipped if already complete), into
    ``DIR/<point id>``; the directory must be on a file system every node sees. The table is not written by the
    tasks (N tasks would rewrite it N times): ``load_sweep(DIR)`` or ``workbench report DIR`` builds it from the
    points afterwards. Each task asks for as many CPUs as the largest ``world_size`` of the points (a point's
    ranks run on its node); ``sbatch`` adds lines (``--partition=cpu``, ``--time=00:30:00``).
    """
    notebook, directory, declared, points = _prepare(notebook, parameters, grid, out, None)
    if not points:
        raise SweepError("the grid has no points")
    write_json(directory / ARRAY_FILE, {"points": [point_id(p) for p in points]})
    worlds = [p.get("world_size", declared.get("world_size", 1)) for p in points]
    cpus = max(w if isinstance(w, int) and w > 0 else 1 for w in worlds)
    options = [f"--job-name=wb-{_slug(notebook.stem)}", f"--array=0-{len(points) - 1}", "--ntasks=1",
               f"--cpus-per-task={cpus}", f"--output={directory}/slurm-%A_%a.log", *sbatch]
    command = [sys.executable, "-m", "workbench", "sweep", str(notebook.resolve()), "--out", str(directory),
               "--point", "${SLURM_ARRAY_TASK_ID:?run me with sbatch (or set SLURM_ARRAY_TASK_ID)}"]
    if kernel_name:
        command += ["--kernel", kernel_name]
    if timeout:
        command += ["--timeout", str(timeout)]
    quoted = " ".join(f'"{c}"' if c.startswith("${") else shlex.quote(c) for c in command)
    script = "\n".join([
        "#!/bin/bash",
        *(f"#SBATCH {option}" for option in options),
        f"# {len(points)} points of {notebook.name}, written by `workbench sweep --emit slurm`. Task i runs point i",
        f"# of {ARRAY_FILE} (resumable: a complete point is skipped). Afterwards: workbench report {directory}",
        "set -euo pipefail",
        f"cd {shlex.quote(os.getcwd())}",
        f"exec {quoted}",
        "",
    ])
    path = directory / SLURM_FILE
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(script)
    tmp.chmod(0o755)
    os.replace(tmp, path)
    return path


def run_array_task(out: str | os.PathLike, index: int, *, kernel_name: str | None = None,
                   timeout: float | None = None) -> dict[str, Any]:
    """Run point ``index`` of ``DIR/array.json`` (one task of :func:`emit_slurm`'s job array); its status."""
    directory = Path(out).resolve()
    try:
        ids = json.loads((directory / ARRAY_FILE).read_text())["points"]
        spec = json.loads((directory / SWEEP_FILE).read_text())
    except (OSError, ValueError, KeyError):
        raise SweepError(f"{directory} holds no job array ({ARRAY_FILE}): write one with --emit slurm") from None
    if not 0 <= index < len(ids):
        raise SweepError(f"point {index} is out of range: the array has points 0..{len(ids) - 1}")
    pid = ids[index]
    point = next(p["parameters"] for p in spec["points"] if p["id"] == pid)
    if is_complete(directory / pid):
        return {"id": pid, "status": "completed", "skipped": True}
    task = _task(directory, Path(spec["notebook"]), spec["declared"], point, kernel_name, timeout)
    done: dict[str, dict[str, Any]] = {}
    _Scheduler([task], 1, progress=False).run(done)
    return {"id": pid, **done.get(pid, {"status": "failed", "error": "the point did not report"}), "skipped": False}


def _progress_enabled(progress: bool | None) -> bool:
    if progress is not None:
        return progress
    in_kernel = "ipykernel" in sys.modules and getattr(sys.modules.get("IPython"), "get_ipython", lambda: None)()
    return bool(in_kernel) or sys.stderr.isatty()


class _WorkerProc:
    """One ``python -m workbench.sweep_point`` process and the thread reading its events."""

    def __init__(self, events: queue.Queue) -> None:
        read, write = os.pipe()
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        self.proc = subprocess.Popen([sys.executable, "-m", "workbench.sweep_point", "--events", str(write),
                                      "--parent", str(os.getpid())],
                                     stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                     pass_fds=(write,), start_new_session=True, env=env, text=True)
        os.close(write)
        self.task: dict[str, Any] | None = None
        self.thread = threading.Thread(target=self._read, args=(read, events), daemon=True)
        self.thread.start()

    def _read(self, fd: int, events: queue.Queue) -> None:
        with os.fdopen(fd) as stream:
            for line in stream:
                try:
                    events.put((self, json.loads(line)))
                except ValueError:
                    continue
        events.put((self, {"event": "exit"}))

    def submit(self, task: dict[str, Any]) -> None:
        self.task = task
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(json.dumps(task) + "\n")
            self.proc.stdin.flush()
        except OSError:  # the worker died: its reader reports the exit, and the point is recorded as failed
            pass

    def close(self) -> None:
        try:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
        except OSError:
            pass

    def stop(self) -> None:
        """SIGTERM: the worker kills its kernel and the kernel's ranks, and exits."""
        if self.proc.poll() is None:
            try:
                os.kill(self.proc.pid, signal.SIGTERM)
            except OSError:
                pass


class _Scheduler:
    def __init__(self, tasks: list[dict[str, Any]], jobs: int, progress: bool) -> None:
        self.tasks = list(tasks)
        self.jobs = jobs
        self.progress = progress
        self.events: queue.Queue = queue.Queue()
        self.workers: list[_WorkerProc] = []
        self.cells: dict[str, str] = {}

    def run(self, done: dict[str, dict[str, Any]]) -> None:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(self.tasks), unit="point", desc="sweep", disable=not self.progress, dynamic_ncols=True)
        pending = list(self.tasks)
        try:
            self.workers = [_WorkerProc(self.events) for _ in range(min(self.jobs, len(pending)))]
            for w in self.workers:
                w.submit(pending.pop(0))
            while len(done) < len(self.tasks):
                try:
                    worker, event = self.events.get(timeout=0.5)
                except queue.Empty:
                    continue
                kind = event["event"]
                if kind == "cell":
                    self.cells[event["id"]] = f"{event['index'] + 1}/{event['total']}"
                elif kind in ("done", "exit") and worker.task is not None:
                    task, worker.task = worker.task, None
                    self.cells.pop(task["id"], None)
                    if kind == "exit":  # the worker died under a point: record it, replace the worker
                        event = {"status": "failed", "error": f"worker exited with {worker.proc.wait()}"}
                        _record_failure(task, event["error"])
                        self.workers.remove(worker)
                        if pending:
                            worker = _WorkerProc(self.events)
                            self.workers.append(worker)
                    done[task["id"]] = {"status": event["status"], "error": event.get("error")}
                    bar.update(1)
                    if event["status"] != "completed":
                        bar.write(f"point {task['id']} failed: {event.get('error')}")
                    if pending:
                        worker.submit(pending.pop(0))
                    else:
                        worker.close()
                elif kind == "exit":
                    if worker in self.workers:
                        self.workers.remove(worker)
                bar.set_postfix_str("  ".join(f"{k[:40]}: cell {v}" for k, v in self.cells.items()), refresh=False)
                bar.refresh()
        finally:
            bar.close()
            self.shutdown()

    def shutdown(self) -> None:
        """Close every worker; a worker still busy (interrupted sweep) is stopped: SIGTERM, bounded wait, SIGKILL
        of its remaining process tree."""
        main = threading.current_thread() is threading.main_thread()
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN) if main else None  # a 2nd Ctrl-C waits for us
        try:
            self._shutdown()
        finally:
            if main and previous is not None:
                signal.signal(signal.SIGINT, previous)

    def _shutdown(self) -> None:
        busy = [w for w in self.workers if w.proc.poll() is None]
        trees = {w: descendants(w.proc.pid) for w in busy}
        for w in busy:
            w.close()
            if w.task is not None:
                w.stop()
        deadline = time.monotonic() + STOP_WAIT_S
        for w in busy:
            try:
                w.proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                trees[w] += descendants(w.proc.pid)
                try:
                    os.killpg(w.proc.pid, signal.SIGKILL)
                except OSError:
                    pass
                w.proc.wait()
            kill_all(trees[w])
        for w in self.workers:
            w.thread.join(timeout=2)


def _record_failure(task: dict[str, Any], error: str) -> None:
    directory = Path(task["dir"])
    status = point_status(directory) or {"id": task["id"], "parameters": task["parameters"],
                                         "notebook": str(directory / Path(task["notebook"]).name)}
    status.update(status="failed", error=error, finished=time.time())
    directory.mkdir(parents=True, exist_ok=True)
    write_json(directory / POINT_FILE, status)


# ---- aggregation ---------------------------------------------------------------------------------------------

def _row(directory: Path, pid: str, params: dict[str, Any]) -> dict[str, Any]:
    status = point_status(directory / pid)
    row: dict[str, Any] = {"point": pid, **params}
    state = "pending" if status is None or status.get("status") == "running" else status["status"]
    complete = is_complete(directory / pid)
    notebook = status.get("notebook") if status else None
    row.update(status="completed" if complete else ("failed" if state == "completed" else state),
               outcome="completed" if complete else ("pending" if state == "pending" else "error"),
               error=status.get("error") if status else None,
               point_wall_s=status.get("wall_s") if status else None,
               notebook=notebook if notebook and Path(notebook).is_file() else None, path=None)
    result_path = directory / pid / RESULT_FILE
    if complete and result_path.is_file():
        try:
            result = RunResult.load(result_path)
        except ResultsError as exc:
            row.update(status="failed", error=str(exc))
            return row
        for key, value in result.summary_row().items():
            row[f"result.{key}" if key in params or key in ("point", "status", "error", "path") else key] = value
        row["path"] = str(result_path)
    return row


def aggregate(directory: str | os.PathLike) -> pd.DataFrame:
    """Build the sweep's table from its point directories and write ``DIR/results.h5`` (atomically)."""
    import pandas as pd

    directory = Path(directory)
    sweep_file = directory / SWEEP_FILE
    if not sweep_file.is_file():
        raise ResultsError(f"{directory} is not a sweep directory (no {SWEEP_FILE})")
    spec = json.loads(sweep_file.read_text())
    rows = [_row(directory, p["id"], p["parameters"]) for p in spec["points"]]
    frame = pd.DataFrame(rows)
    save_table(frame, directory / TABLE_FILE, notebook=spec["notebook"], signature=_signature(directory),
               parameters=sorted({k for p in spec["points"] for k in p["parameters"]}))
    return frame


def _signature(directory: Path) -> list[list[Any]]:
    """(name, size, mtime) of the files the table is built from: a table with another signature is stale."""
    files = [directory / SWEEP_FILE, *directory.glob(f"*/{POINT_FILE}"), *directory.glob(f"*/{RESULT_FILE}")]
    found = []
    for path in sorted(files):
        try:
            stat = path.stat()
        except OSError:
            continue
        found.append([str(path.relative_to(directory)), stat.st_size, stat.st_mtime_ns])
    return found


def load_sweep(directory: str | os.PathLike) -> pd.DataFrame:
    """The sweep's table, one row per point: ``point`` (id), the parameters as columns, ``status`` (completed /
    failed / pending), ``outcome`` (the run's outcome; ``error`` for a failed notebook, ``pending`` for a point
    not run yet), ``error``, ``point_wall_s``, ``notebook`` and ``path`` (executed notebook and ``result.h5``),
    and the run's summary (``final_test_accuracy``, ``steps_redone_total``, ``samples_lost_total``,
    ``n_failures``, ``overhead_s``, ``config.*`` ...; a summary key equal to a parameter name gets a ``result.``
    prefix). Read from ``DIR/results.h5``; rebuilt from the points (and rewritten) when it is missing or stale —
    when any ``point.json`` or ``result.h5`` was added, removed or changed since it was written.
    """
    directory = Path(directory)
    table = directory / TABLE_FILE
    if not (directory / SWEEP_FILE).is_file():
        raise ResultsError(f"{directory} is not a sweep directory (no {SWEEP_FILE})")
    if table.is_file():
        try:
            frame, attrs = load_table(table)
            if attrs.get("signature") == _signature(directory):
                return frame
        except ResultsError:
            pass
    return aggregate(directory)


__all__ = ["LOG_FILE", "aggregate", "default_jobs", "emit_slurm", "grid_points", "load_sweep",
           "notebook_parameters", "parse_value", "point_id", "run_array_task", "sweep"]
