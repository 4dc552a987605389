"""Writing an HDF5 output whole or not at all, and a failure as one line: :func:`write_hdf5`.

HDF5 writes through a Python file object (h5py's file-object driver) opened on the hidden temporary file of
:func:`workbench.base.h5files.atomic_output`, renamed into place when complete, removed on failure. HDF5 never writes
to the disk itself: when one of its own writes fails (a full disk), h5py 3 crashes the process in ``File.close``
(SIGSEGV: a rank writing a checkpoint died of it, and the run counted it as a fault); through a file object the
failure is Python's ``OSError``. A full disk, a read-only place or a path under a file is an
:class:`~workbench.base.h5files.OutputError` naming the path, and nothing is left behind.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from workbench.base.h5files import OutputError, atomic_output

__all__ = ["OutputError", "write_hdf5"]


def write_hdf5(path: str | os.PathLike, fill: Callable[[Any], None]) -> Path:
    """Call ``fill(f)`` on a new HDF5 file ``f`` and put it at ``path`` atomically; an ``OSError`` of the write
    raises :class:`OutputError` (one line: the path and the reason)."""
    import h5py

    with atomic_output(path) as tmp, open(tmp, "w+b") as handle, h5py.File(handle, "w") as f:
        fill(f)
    return Path(path)
