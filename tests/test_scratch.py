"""A run without ``out`` keeps its checkpoints in a scratch directory named for its process; one left behind by a
process that was killed is removed when the next run makes its own, and one whose process lives is never touched."""

import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

from workbench.results import outdir


def made_for(pid: int, host: str | None = None) -> Path:
    host = host or socket.gethostname()
    return Path(tempfile.mkdtemp(prefix=f"{outdir.SCRATCH_PREFIX}{pid}-{host}-"))


def test_a_dead_process_scratch_is_swept_and_a_living_ones_kept():
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    left = made_for(int(dead.stdout))
    (left / "step_000010.h5").write_bytes(b"x" * 1024)  # a killed run's checkpoint
    living = made_for(os.getppid())
    elsewhere = made_for(int(dead.stdout), host="another-host")  # a shared /tmp: not ours to judge
    try:
        mine = outdir.scratch()
        assert not left.exists()
        assert living.is_dir() and elsewhere.is_dir()
        assert Path(mine.name).name.startswith(f"{outdir.SCRATCH_PREFIX}{os.getpid()}-{socket.gethostname()}-")
        mine.cleanup()
        assert not Path(mine.name).exists()
    finally:
        for path in (living, elsewhere):
            path.rmdir()
