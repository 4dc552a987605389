"""The doors into a run and the start of its rank processes: the second step of the flow, after ``config``.

The doors: the Python session (:mod:`.session`: ``workbench.run``, ``workbench.start``), the command line
(:mod:`.cli`) and the Lab panel (:mod:`.lab`). The start: the machine and its devices, the output folder, the
rank template and its fork server, the rank processes, and :mod:`.cluster` (hosts files, Slurm) for ranks beyond
one machine. The ``supervisor`` then watches the ranks. Importing this package imports none of its modules.
"""
