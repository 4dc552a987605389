"""Where a run's ranks live beyond one machine: hosts files and Slurm."""
