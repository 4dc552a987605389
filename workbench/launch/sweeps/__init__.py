"""Sweeps: a notebook run at every point of a grid of parameters, resumable, aggregated into one table.
- :mod:`.run` — :func:`~.run.sweep`, the entry point (``workbench.sweep``), run on this machine;
- :mod:`.plan` — the points, their ids, the notebook's parameters, ``sweep.json``;
- :mod:`.workers` — worker processes at most ``jobs`` at a time, progress, stopping;
- :mod:`.point` — the worker process itself (``python -m workbench.launch.sweeps.point``): one point's notebook run;
- :mod:`.table` — each point's status and the table ``results.h5``; :mod:`.report` — the sweep's HTML report;
- :mod:`.slurm_array`, :mod:`.slurm_run` — Slurm: the job array file and a task's side; submit, wait, gather;
- :mod:`.tracking` — MLflow tracking of a sweep: a parent run, a child run per point;
- :mod:`.requeue` — a point preempted with notice: its runs kept at a checkpoint, resumed when it runs again.
"""
