"""Run a command as the child of a subreaper and list the project's processes it left behind.

``python tests/subreaper.py ARGV...`` makes itself a child subreaper (``PR_SET_CHILD_SUBREAPER``), runs ARGV, waits
for it, and then lists the project processes (:mod:`leaks`) below itself: a process the command orphaned is
re-parented here rather than to init, so it is found after the command has exited, whoever its parent was. It
kills them (nothing leaks past the check) and prints one JSON object: ``rc``, ``left``, ``stdout``, ``stderr``.
"""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
import tempfile

import leaks

PR_SET_CHILD_SUBREAPER = 36


def main(argv: list[str]) -> dict:
    """Run ``argv`` under this subreaper; what it returned and left."""
    if ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER)")
    # files, not pipes: an orphan holding the command's stdout would keep a pipe open, and the wait with it
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        rc = subprocess.run(argv, stdout=out, stderr=err, timeout=300).returncode
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    procs = leaks.all_processes()
    below = leaks.descendants(os.getpid(), procs)
    left = [p for p in leaks.project_processes(procs=procs) if p.pid in below]
    leaks.kill(left)
    return {"rc": rc, "left": [str(p) for p in left], "stdout": stdout, "stderr": stderr}


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1:])))
