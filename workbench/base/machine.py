"""What this machine is and how fast, for the rank-time clock (:mod:`workbench.results.clock`): the cores a run may use,
the CPU its hypervisor steals, and the speeds charged on the rank clock (disk, network bandwidth, a message's
latency), each given in the environment or measured once per machine and cached in
``~/.cache/workbench/speeds.json``.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

from workbench.base.errors import WorkbenchError
from workbench.base.fallbacks import taken

DISK_MIB_VAR = "WORKBENCH_DISK_MIBS"
NET_MIB_VAR = "WORKBENCH_NET_MIBS"
LATENCY_VAR = "WORKBENCH_LATENCY_US"
PROBE_VAR = "WORKBENCH_PROBE_US"
SPEEDS = {DISK_MIB_VAR: "MiB/s of checkpoint reads", NET_MIB_VAR: "MiB/s of the network",
          LATENCY_VAR: "microseconds per message", PROBE_VAR: "microseconds of the speed probe on an idle core"}


def usable_cores() -> int:
    """Cores this process may run on (its affinity: taskset, cgroups' cpusets), not the machine's count; where the
    affinity cannot be read, the machine's count, said (``usable_cores_unknown``)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError) as exc:
        count = os.cpu_count() or 1
        taken("usable_cores_unknown", f"this process's CPU affinity cannot be read ({type(exc).__name__}): the "
              f"machine's {count} cores are taken as usable (a taskset or cpuset may allow fewer)")
        return count


def cpu_ticks() -> tuple[int, int] | None:
    """(steal, total) jiffies of the whole host from ``/proc/stat``; None where there is none."""
    try:
        with open("/proc/stat", encoding="ascii") as f:
            fields = [int(v) for v in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    steal = fields[7] if len(fields) > 7 else 0
    return steal, sum(fields[:8])


def steal_pct(start: tuple[int, int] | None, end: tuple[int, int] | None) -> float | None:
    """Share of the host's CPU time the hypervisor stole between two :func:`cpu_ticks` readings, in %."""
    if start is None or end is None or end[1] <= start[1]:
        return None
    return round(100.0 * (end[0] - start[0]) / (end[1] - start[1]), 2)


def disk_mibs(place: str | os.PathLike | None = None) -> tuple[float, str]:
    """(MiB/s, where it came from) at which checkpoint reads are charged on the rank clock:
    ``$WORKBENCH_DISK_MIBS``, else measured once per machine (64 MiB written and fsync'd in ``place``)."""
    return _speed("disk", DISK_MIB_VAR, lambda: _measure_disk(place))


def net_mibs() -> tuple[float, str]:
    """(MiB/s, where it came from) at which the bytes a rank sends are charged on the rank clock:
    ``$WORKBENCH_NET_MIBS`` (a cluster's network), else measured once per machine (64 MiB over a loopback TCP
    connection: the ranks' own transport here)."""
    return _speed("net", NET_MIB_VAR, _measure_net)


def latency_us() -> tuple[float, str]:
    """(µs, where it came from) charged for each message a rank sends: ``$WORKBENCH_LATENCY_US`` (a cluster's
    network), else measured once per machine: a hop of gloo's ring allreduce between two processes on two cores
    (the lower-quartile allreduce of one float, over its 2 messages), which is what a message costs the ranks' waits
    here: the sender's and the receiver's transport threads, loopback TCP, and the waiting thread's wake-up."""
    return _speed("gloo_hop_us", LATENCY_VAR, _measure_latency)


def probe_us() -> tuple[float, str]:
    """(µs, where it came from) of the rank clock's speed probe (:mod:`workbench.rank.speed`) at this machine's
    reference speed: ``$WORKBENCH_PROBE_US``, else measured once per machine (the lower quartile of 300 probes in a
    started process pinned to one core). RuntimeError (one line) where the probe cannot run."""
    return _speed("probe_us", PROBE_VAR, measure_probe)


def given(variable: str) -> float:
    """The positive number in environment variable ``variable``; ValueError (one line) for anything else."""
    text = os.environ[variable]
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not value > 0 or value == float("inf"):
        raise ValueError(f"${variable}={text!r}: a positive number is allowed ({SPEEDS[variable]}), or unset it "
                         "to have it measured once on this machine")
    return value


def check_given() -> None:
    """Each speed variable that is set holds a positive number (checked before a run starts)."""
    for variable in SPEEDS:
        if os.environ.get(variable):
            given(variable)


class Substitute(WorkbenchError):
    """A speed could not be measured as documented; ``value`` was measured another way, ``why`` says how (the
    speed's source), ``what`` names the fallback."""

    def __init__(self, value: float, what: str, why: str) -> None:
        super().__init__(why)
        self.value, self.what, self.why = value, what, why


def cache_path() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "workbench" / "speeds.json"


def _speed(kind: str, variable: str, measure: Callable[[], float]) -> tuple[float, str]:
    """A speed given in ``variable`` (source: the variable's name), cached for this host in
    ``~/.cache/workbench/speeds.json`` (``cached``), or measured (``measured now``). A cache that cannot be read or
    written, or a measurement that had to be done another way (:class:`Substitute`, then not cached: the source
    says how), is a fallback, said (:func:`workbench.base.fallbacks.taken`)."""
    if os.environ.get(variable):
        return given(variable), variable
    cache, host = cache_path(), socket.gethostname()
    known = _read_cache(cache)
    mine = known.get(host) if known and isinstance(known.get(host), dict) else {}
    if isinstance(mine.get(kind), (int, float)) and mine[kind] > 0:
        return float(mine[kind]), "cached"
    try:
        speed = measure()
    except Substitute as exc:
        taken(exc.what, f"the {kind} speed could not be measured as documented ({exc.why}): "
              f"{exc.value:g} used this run, not cached")
        return exc.value, exc.why
    known = _read_cache(cache, quiet=True) if known is not None else None  # another process may have written
    if known is not None:  # an unreadable cache is not replaced: other hosts' figures are in it
        _write_cache(cache, {**known, host: {**(known.get(host) if isinstance(known.get(host), dict) else {}),
                                             kind: speed}}, f"the {kind} speed ({speed:g})")
    return speed, "measured now"


def _read_cache(cache: Path, quiet: bool = False) -> dict | None:
    """The speeds cache's hosts (empty where there is none yet; None where it cannot be read, said unless
    ``quiet``). A damaged one is said and moved aside to ``speeds.json.damaged`` (other hosts' figures are kept
    there), not overwritten."""
    try:
        known = json.loads(cache.read_text())
        if isinstance(known, dict):
            return known
        raise ValueError("not a JSON object")
    except (FileNotFoundError, NotADirectoryError):  # none yet (where it cannot be written, that is said)
        return {}
    except OSError as exc:
        if not quiet:
            taken("speed_cache_unreadable", f"cannot read {cache} ({exc.strerror or exc}): speeds are measured "
                  "now, by every run, and not cached")
        return None
    except ValueError as exc:
        aside = cache.with_name(cache.name + ".damaged")
        try:
            os.replace(cache, aside)
            kept = f"moved to {aside}"
        except OSError as moved:
            kept = f"left as it is ({moved.strerror or moved})"
        taken("speed_cache_damaged", f"{cache} is damaged ({str(exc).splitlines()[0][:80]}): {kept}; speeds are "
              "measured now and cached anew")
        return {}


def _write_cache(cache: Path, known: dict, what: str) -> None:
    tmp = cache.with_suffix(f".{os.getpid()}.tmp")
    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps(known))
        os.replace(tmp, cache)
    except OSError as exc:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)  # a write cut short
        taken("speed_cache_unwritable", f"cannot write {cache} ({exc.strerror or exc}): {what} was measured now "
              "and is measured again by every run until it can be written")


def _measure_disk(place: str | os.PathLike | None, mib: int = 64) -> float:
    block = os.urandom(1 << 20)
    with tempfile.NamedTemporaryFile(dir=place, prefix=".wb-disk-") as f:
        began = time.perf_counter()
        for _ in range(mib):
            f.write(block)
        f.flush()
        os.fsync(f.fileno())
        spent = time.perf_counter() - began
    return round(mib / max(spent, 1e-6), 1)


def _measure_net(mib: int = 64) -> float:
    block = bytes(1 << 20)
    with socket.create_server(("127.0.0.1", 0)) as server:
        sender = socket.create_connection(server.getsockname(), timeout=30)
        receiver, _ = server.accept()
        receiver.settimeout(30)

        def send() -> None:
            for _ in range(mib):
                sender.sendall(block)
            sender.close()

        began = time.perf_counter()
        thread = threading.Thread(target=send, daemon=True)
        thread.start()
        got = 0
        while got < mib << 20:
            chunk = receiver.recv(1 << 20)
            if not chunk:
                break
            got += len(chunk)
        spent = time.perf_counter() - began
        thread.join(timeout=30)
        receiver.close()
    return round(got / 2**20 / max(spent, 1e-6), 1)


_HOPS = """
import os, sys, time
from datetime import timedelta
import torch, torch.distributed as dist
rank, path, rounds, core = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
if core >= 0:
    os.sched_setaffinity(0, {core})
torch.set_num_threads(1)
options = dist.ProcessGroupGloo._Options()
options._devices = [dist.ProcessGroupGloo.create_device(hostname="127.0.0.1")]
options._timeout = timedelta(seconds=60)
group = dist.ProcessGroupGloo(dist.FileStore(path, 2), rank, 2, options)
one, spent = torch.zeros(1), []
for i in range(rounds + 30):
    began = time.perf_counter()
    work = group.allreduce([one])
    while True:  # waited as a rank waits (workbench.rank.comm: short timed waits)
        try:
            work.wait(timedelta(milliseconds=5))
            break
        except RuntimeError:
            pass
    if i >= 30:
        spent.append(time.perf_counter() - began)
spent.sort()
print(spent[len(spent) // 4])  # the lower quartile: a loaded machine still shows the idle hop in part
"""


def _measure_latency(rounds: int = 200) -> float:
    """Half the lower-quartile time of a one-float gloo allreduce between two started processes (a ring of 2: two
    messages), each pinned to a core of its own where there are two. Where gloo cannot, :class:`Substitute`: a
    bare loopback echo, which leaves out the transport threads and the wake-up (a lower figure), said and not cached.
    With fewer than two usable cores the hop is measured unpinned (the two processes share what there is: switches,
    not a hop between two cores): :class:`Substitute` too, ``latency_unpinned``."""
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    pins = cores[:2] if len(cores) >= 2 else [-1, -1]
    hop = _gloo_hop(rounds, pins)
    if isinstance(hop, str):
        raise Substitute(_measure_echo(), "latency_echo", f"echo (gloo hop failed: {hop})")
    if len(cores) < 2:
        cores_said = "one usable core" if cores else "usable cores unknown"
        raise Substitute(hop, "latency_unpinned", f"gloo hop unpinned ({cores_said})")
    return hop


def _gloo_hop(rounds: int, pins: list[int]) -> float | str:
    """Half the lower-quartile gloo allreduce of one float between two processes pinned to ``pins`` (-1: unpinned),
    in µs; or why there is no figure."""
    with tempfile.TemporaryDirectory(prefix="wb-hop-") as scratch:
        store = os.path.join(scratch, "store")
        procs = [subprocess.Popen([sys.executable, "-c", _HOPS, str(rank), store, str(rounds), str(pins[rank])],
                                  stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                  text=True) for rank in (0, 1)]
        try:
            outputs = [proc.communicate(timeout=120)[0] for proc in procs]
            return round(float(outputs[0].split()[-1]) / 2 * 1e6, 1)
        except subprocess.TimeoutExpired:
            return "no answer within 120 s"
        except (ValueError, IndexError):
            return f"no figure from its processes, exit codes {[proc.returncode for proc in procs]}"
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()


def measure_probe(core: int | None = None, rounds: int = 300) -> float:
    """The speed probe's microseconds now, in a process of its own pinned to ``core`` (default: this process's last
    core); RuntimeError where it cannot be measured."""
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    core = cores[-1] if core is None and cores else core
    pin = (lambda: os.sched_setaffinity(0, {core})) if core is not None else None
    try:
        done = subprocess.run([sys.executable, "-m", "workbench.rank.speed", str(rounds)], capture_output=True,
                              text=True, timeout=120, preexec_fn=pin, stdin=subprocess.DEVNULL,
                              cwd=Path(__file__).resolve().parents[2])
        return float(done.stdout.split()[-1])
    except (subprocess.TimeoutExpired, OSError, ValueError, IndexError) as exc:
        raise RuntimeError(f"the speed probe could not be measured ({type(exc).__name__})") from None


_ECHO = ("import socket, sys\ns = socket.socket(fileno=int(sys.argv[1]))\n"
         "while data := s.recv(1):\n    s.sendall(data)\n")


def _measure_echo(rounds: int = 200) -> float:
    """Median half round trip of one byte to an echo process (started, not forked: the caller may have threads)."""
    left, right = socket.socketpair()
    echo = subprocess.Popen([sys.executable, "-c", _ECHO, str(right.fileno())], pass_fds=(right.fileno(),),
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    right.close()
    trips = []
    try:
        left.settimeout(10)
        left.sendall(b"x")
        left.recv(1)  # the echo is up
        for _ in range(rounds):
            began = time.perf_counter()
            left.sendall(b"x")
            left.recv(1)
            trips.append(time.perf_counter() - began)
    finally:
        left.close()  # the echo reads end of file and exits
        try:
            echo.wait(5)
        except subprocess.TimeoutExpired:
            echo.kill()
            echo.wait()
    trips.sort()
    return round(trips[len(trips) // 2] / 2 * 1e6, 1)
