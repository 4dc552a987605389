"""How long the project's processes take to go once a run ends: the measurement behind the leak checks' window
(``LEAK_WAIT_S`` in tests/conftest.py and tests/ci_guard.py; docs/testing.md).

Three kinds, ``--runs`` each: a 4-rank run that completes, a 4-rank run whose rank is killed (shrink), and a
Jupyter kernel that starts a 2-rank run and is shut down. For each, the time from the run's end (``wait()``
returning; the kernel's shutdown returning) until every project process it started is gone — this process's own
idle rank template aside, as the checks allow. Prints one JSON line: per kind the times (s) and their maximum.

    PYTHONPATH=. python tools/teardown_times.py --runs 20
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
import leaks  # noqa: E402 - the tests' own process finder, so the window is measured as the checks see it

import workbench  # noqa: E402

POLL_S = 0.005


def gone_after(before: set[tuple[int, int]], tag: str, limit: float = 30.0) -> float:
    """Seconds until no project process outside ``before`` is left (``limit`` if some still are)."""
    start = time.monotonic()
    while leaks.new_processes(before, tag) and time.monotonic() - start < limit:
        time.sleep(POLL_S)
    return time.monotonic() - start


def a_run(faults: list[str]) -> Callable[[Path], None]:
    def go(out: Path) -> None:
        result = workbench.run(world_size=4, steps=60, eval_interval=60, strategy="shrink", faults=faults, out=out)
        assert result.completed, result.summary["reason"]
    return go


def a_kernel(out: Path) -> None:
    from jupyter_client.manager import start_new_kernel

    manager, client = start_new_kernel(kernel_name="python3")
    try:
        reply = client.execute_interactive(
            f"import workbench\nr = workbench.run(world_size=2, steps=30, eval_interval=30, out={str(out)!r})\n"
            "assert r.completed", timeout=120)
        assert reply["content"]["status"] == "ok", reply["content"]
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args()
    tag = leaks.tag_this_process()
    kinds = {"4-rank run": a_run([]), "4-rank run, rank 2 killed": a_run(["kill:rank=2,step=30"]),
             "notebook kernel (2-rank run, then shutdown)": a_kernel}
    found: dict[str, dict[str, object]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, go in kinds.items():
            times = []
            for i in range(args.runs):
                before = {p.key for p in leaks.project_processes(tag)}
                go(Path(tmp) / f"{len(found)}-{i}")
                times.append(round(gone_after(before, tag), 3))
            found[name] = {"max_s": max(times), "times_s": times}
    print(json.dumps({"runs": args.runs, "poll_s": POLL_S, "kinds": found}))


if __name__ == "__main__":
    main()
