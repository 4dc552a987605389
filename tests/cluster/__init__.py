"""Tests against a real one-node Slurm (a package, so that its conftest is ``cluster.conftest``, not a second
``conftest`` beside ``tests/conftest.py``, which other tests import)."""
