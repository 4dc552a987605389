"""Sweeps beyond one machine: a Slurm job array with one task per point (``workbench sweep --emit slurm``), and
the task's side: run point ``i`` of the array (``workbench sweep --point i``).
"""

from __future__ import annotations

import os
import shlex
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from workbench.base import slurm_commands as slurm
from workbench.base.errors import SweepError
from workbench.base.h5files import FileKindError, atomic_output, read_json
from workbench.launch.sweeps.plan import SWEEP_FILE, point_id, point_task, prepare, read_sweep_spec, slug
from workbench.launch.sweeps.point import write_json
from workbench.launch.sweeps.table import is_complete
from workbench.launch.sweeps.workers import Scheduler

ARRAY_FILE = "array.json"  # the points of a Slurm job array, in task order
SLURM_FILE = "sweep.slurm"


def emit_slurm(notebook: str | os.PathLike, parameters: Mapping[str, Iterable[Any]] | None = None, *,
               out: str | os.PathLike, grid: str | os.PathLike | list[dict[str, Any]] | dict[str, Any] | None = None,
               kernel_name: str | None = None, timeout: float | None = None,
               sbatch: Iterable[str] = (), cpus: int | None = None) -> Path:
    """Write ``DIR/sweep.slurm``: a Slurm job array with one task per point of the grid (``sbatch DIR/sweep.slurm``).

    Task ``i`` runs ``workbench sweep NOTEBOOK --out DIR --point i``: point ``i`` of ``DIR/array.json``, executed
    exactly as a local sweep executes it (its own worker process and kernel; skipped if already complete), into
    ``DIR/<point id>``; the directory must be on a file system every node sees. The table is not written by the
    tasks (N tasks would rewrite it N times): ``load_sweep(DIR)`` or ``workbench report DIR`` builds it from the
    points afterwards. Each task asks for as many CPUs as the largest ``world_size`` of the points (a point's
    ranks run on its node) — or ``cpus`` when given (``--executor slurm`` caps it at the partition's largest node);
    ``sbatch`` adds lines (``--partition=cpu``, ``--time=00:30:00``).
    """
    notebook, directory, declared, points = prepare(notebook, parameters, grid, out, None)
    if not points:
        raise SweepError("the grid has no points")
    write_json(directory / ARRAY_FILE, {"points": [point_id(p) for p in points]})
    worlds = [p.get("world_size", declared.get("world_size", 1)) for p in points]
    cpus = cpus or max(w if isinstance(w, int) and w > 0 else 1 for w in worlds)
    options = [f"--job-name=wb-{slug(notebook.stem)}", f"--array=0-{len(points) - 1}", "--ntasks=1",
               f"--cpus-per-task={cpus}", f"--output={directory}/slurm-%A_%a.log", "--open-mode=append",
               *(o for item in sbatch for o in shlex.split(item))]
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
    with atomic_output(path) as tmp:
        tmp.write_text(script)
        tmp.chmod(0o755)
    return path


def run_array_task(out: str | os.PathLike, index: int, *, kernel_name: str | None = None,
                   timeout: float | None = None) -> dict[str, Any]:
    """Run point ``index`` of ``DIR/array.json`` (one task of :func:`emit_slurm`'s job array); its status."""
    directory = Path(out).resolve()
    if not (directory / ARRAY_FILE).exists():
        raise SweepError(f"{directory} holds no job array ({ARRAY_FILE}): write one with --emit slurm")
    array = read_json(directory / ARRAY_FILE, "job array record")  # FileKindError, one line, when malformed
    ids = array.get("points") if isinstance(array, dict) else None
    if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
        raise FileKindError(directory / ARRAY_FILE, "is not a valid job array record: it needs 'points' (ids)")
    spec = read_sweep_spec(directory)
    known = {p["id"] for p in spec["points"]}
    if not set(ids) <= known:
        raise FileKindError(directory / ARRAY_FILE, f"names points that {directory / SWEEP_FILE} does not hold")
    if not 0 <= index < len(ids):
        raise SweepError(f"point {index} is out of range: the array has points 0..{len(ids) - 1}")
    pid = ids[index]
    point = next(p["parameters"] for p in spec["points"] if p["id"] == pid)
    if is_complete(directory / pid):
        return {"id": pid, "status": "completed", "skipped": True}
    task = point_task(directory, Path(spec["notebook"]), spec.get("declared", {}), point, kernel_name, timeout)
    done: dict[str, dict[str, Any]] = {}
    Scheduler([task], 1, progress=False).run(done)
    status = {"id": pid, **done.get(pid, {"status": "failed", "error": "the point did not report"}), "skipped": False}
    job = os.environ.get("SLURM_JOB_ID")
    if status["status"] == "preempted" and job:  # preempted with notice: queued again, it resumes where it stopped
        refused = slurm.requeue(job)
        status["requeued"] = refused is None
        status["error"] += f"; Slurm refused to requeue job {job}: {refused}" if refused else f"; job {job} requeued"
    return status
