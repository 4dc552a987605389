"""Where a run's ranks live beyond one machine.

- :mod:`.hosts_file` — parsing a hosts file (``--hosts FILE``) and placing rank numbers on its hosts;
- :mod:`.slurm_allocation` — reading the Slurm allocation a run is in (``--slurm``) as hosts;
- :mod:`.slurm_commands` — Slurm's client commands (``sbatch``, ``squeue``, ``scancel``, ``scontrol``) and node
  lists. Emitting a sweep's ``sbatch`` array is :mod:`workbench.sweeps.slurm_array`.
"""
