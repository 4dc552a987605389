"""The floor under every detection figure: how long a SIGKILLed process takes to close its sockets.

A rank's death is seen by the supervisor and by its peers when its sockets close (EOF on the control connection,
a reset on gloo's pairs). Linux closes a dying process's files only after it has torn down its address space
(``do_exit``: ``exit_mm`` before ``exit_files``), so the larger the rank's private memory, the later anyone can
know. Per size: a forked child touches that many MiB of private pages, is SIGKILLed, and the parent times the EOF
on a socket the child held (median of ``--repeats``). The peer figure is the same child with 10 MiB.

A rank of the 19.2M-parameter model holds ~460 MiB of anonymous memory (parameters, gradients, momentum, the
gradients kept for a retry, bucket buffers, the torch heap: measured with /proc/PID/status at world 2).

Each size is measured twice: in 4 KiB pages, and in 2 MiB transparent huge pages (``madvise(MADV_HUGEPAGE)``, what
torch does for tensors of 2 MiB or more under ``THP_MEM_ALLOC_ENABLE=1``, which the workbench sets for its ranks):
the kernel frees a huge page in one step instead of 512.

The last stdout line is one JSON object: {"benchmark": "death", "rows": [{"mib": M, "eof_ms": T,
"eof_ms_huge": H}, ...], "vs_10_mib": {...}, "small_vs_huge": {...}}.
Usage: python benchmarks/bench_death.py [--sizes 10,300,500,1200,2400] [--repeats 5]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import mmap
import os
import signal
import socket
import statistics
import sys
import time


def eof_after_kill(mib: int, huge: bool = False) -> float:
    """Seconds from SIGKILL to EOF on the dead child's socket, the child holding ``mib`` MiB of touched pages
    (``huge``: in transparent huge pages)."""
    ours, theirs = socket.socketpair()
    pid = os.fork()
    if pid == 0:
        ours.close()
        memory = mmap.mmap(-1, mib * 2**20, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        if huge:
            memory.madvise(mmap.MADV_HUGEPAGE)
        for i in range(0, len(memory), 4096):
            memory[i] = 1  # private pages, as a rank's tensors are
        theirs.send(b"r")
        time.sleep(600)
        os._exit(0)
    theirs.close()
    try:
        ours.settimeout(120)
        ours.recv(1)
        began = time.perf_counter()
        os.kill(pid, signal.SIGKILL)
        ours.recv(1)  # EOF: the child's end closed
        return time.perf_counter() - began
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)  # a timeout above: the child must not outlive the benchmark
        os.waitpid(pid, 0)
        ours.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="10,300,500,1200,2400", help="MiB of private memory per child")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    rows = []
    for mib in (int(s) for s in args.sizes.split(",")):
        ms = statistics.median(1000 * eof_after_kill(mib) for _ in range(args.repeats))
        huge = statistics.median(1000 * eof_after_kill(mib, huge=True) for _ in range(args.repeats))
        rows.append({"mib": mib, "eof_ms": round(ms, 2), "eof_ms_huge": round(huge, 2)})
        print(f"{mib} MiB: EOF {ms:.1f} ms after SIGKILL, {huge:.1f} ms in huge pages", flush=True, file=sys.stderr)
    base = next((r["eof_ms"] for r in rows if r["mib"] == 10), None)
    ratios = {str(r["mib"]): round(r["eof_ms"] / base, 1) for r in rows} if base else {}
    huge_gain = {str(r["mib"]): round(r["eof_ms"] / r["eof_ms_huge"], 1) for r in rows}
    print(json.dumps({"benchmark": "death", "repeats": args.repeats, "loadavg": os.getloadavg()[0], "rows": rows,
                      "vs_10_mib": ratios, "small_vs_huge": huge_gain}))


if __name__ == "__main__":
    main()
