"""The doors into a run: the Python session (:mod:`.session`: ``workbench.run``, ``workbench.start``), the command
line (:mod:`.cli`, :mod:`.cli_files`), the Lab panel (:mod:`.lab`, :mod:`.live_ranks`), a Slurm allocation read as
hosts (:mod:`.slurm_allocation`), and :mod:`.sweeps` (a notebook at every point of a grid, and its report).

The top floor below the campaigns: the doors prepare a ``config``, start the ``supervisor``, which forks the ranks
from its rank template, and read the ``results``. Importing this package imports none of its modules.
"""
