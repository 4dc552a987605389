#!/usr/bin/env python3
"""A one-node Slurm cluster on this machine, to try and test the cluster path (``make setup-cluster``,
``make cluster-up``, ``make cluster-down``, ``tests/cluster/``). Standard library only: it runs before the
virtualenv exists, as root.

A cluster is a directory (``ROOT``) holding everything it writes: ``slurm.conf``, munged's socket and pid file,
slurmctld's state, slurmd's spool, the daemons' logs and pid files, and the job-completion log that ``sacct -c``
reads. Commands reach it through ``SLURM_CONF=ROOT/slurm.conf`` — or without any setting for the machine's
cluster, whose ``slurm.conf`` ``configure`` also writes to ``/etc/slurm/slurm.conf`` (never over a file it did not
write). Protocol:

- ``configure`` writes ``slurm.conf`` for this machine as ``slurmd -C`` reads it at that moment (CPUs, sockets,
  cores, threads, memory); one node, one partition ``debug``, ``NodeAddr=127.0.0.1``; processes tracked by
  their parentage (``proctrack/linuxproc``: no cgroup set-up needed); ``KillWait=5`` (a cancelled task gets
  SIGTERM, then SIGKILL 5 s later). Accounting without a database: ``JobCompType=jobcomp/filetxt``, one line per
  finished job (each array task is one), read by ``sacct --completion``; Slurm 22.05's ``sacct`` without ``-c``
  needs slurmdbd and a MySQL/MariaDB server, which is more than a laptop should run for this.
- ``up`` starts munged (its own socket under ``ROOT``, the machine's key ``/etc/munge/munge.key``), slurmctld and
  slurmd, each a daemon with a pid file under ``ROOT``, and waits (bounded) until the node takes jobs; a daemon
  that does not come up stops the others and raises ``ClusterError`` with the tail of its log.
- ``down`` cancels every job of the cluster and waits (bounded) until they are gone, stops the three daemons
  (SIGTERM, bounded wait, SIGKILL), then SIGKILLs whatever they left, found in /proc (``Cluster.leftovers``): a
  daemon carries ``WORKBENCH_SLURM_CLUSTER=ROOT`` in its environment, a ``slurmstepd`` runs in ``ROOT/log``, a job's
  process carries the cluster's name (``SLURM_CLUSTER_NAME``) even after it left its step's process tree (which
  ``proctrack/linuxproc`` follows: a process that ignores SIGTERM and outlives its parent escapes Slurm's own
  clean-up); the processes below a leftover go with it. Afterwards no process of the cluster runs; ``down`` on a
  cluster that is not up is a no-op.

Usage: ``python3 tools/slurm_cluster.py configure|up|down|status [--root ROOT]`` (default root
``/var/lib/workbench-slurm``).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

DEFAULT_ROOT = Path("/var/lib/workbench-slurm")
SYSTEM_CONF = Path("/etc/slurm/slurm.conf")
MARK = "# written by workbench (tools/slurm_cluster.py)"
TAG_VAR = "WORKBENCH_SLURM_CLUSTER"
DAEMONS = ("munged", "slurmctld", "slurmd")
UP_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 15.0
CANCEL_TIMEOUT_S = 30.0


class ClusterError(RuntimeError):
    """The cluster could not be configured, started or stopped; the message is one line (plus a log tail)."""


def missing() -> str | None:
    """Why a cluster cannot run here (not root, a program missing), or None."""
    if os.geteuid() != 0:
        return "needs root (slurmd starts jobs as their users)"
    absent = [p for p in ("munged", "slurmctld", "slurmd", "sbatch", "srun", "squeue", "scancel", "sacct")
              if shutil.which(p, path=os.environ.get("PATH", "") + ":/usr/sbin:/sbin") is None]
    if absent:
        return f"Slurm is not installed ({', '.join(absent)} missing): make setup-cluster (root, apt)"
    if not Path("/etc/munge/munge.key").is_file():
        return "munge has no key (/etc/munge/munge.key): make setup-cluster"
    return None


def _which(name: str) -> str:
    found = shutil.which(name, path=os.environ.get("PATH", "") + ":/usr/sbin:/sbin")
    if found is None:
        raise ClusterError(f"{name} is not installed: make setup-cluster (root, apt)")
    return found


def node_line() -> str:
    """This machine as ``slurmd -C`` sees it now: ``NodeName=... CPUs=... RealMemory=...`` (one line)."""
    done = subprocess.run([_which("slurmd"), "-C"], capture_output=True, text=True, timeout=30)
    line = next((x for x in done.stdout.splitlines() if x.startswith("NodeName=")), None)
    if done.returncode != 0 or line is None:
        raise ClusterError(f"slurmd -C did not describe this machine: {done.stderr.strip() or done.stdout.strip()}")
    return line.strip()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Cluster:
    """The one-node cluster whose files live under ``root``."""

    def __init__(self, root: Path = DEFAULT_ROOT) -> None:
        self.root = Path(root).resolve()
        self.conf = self.root / "slurm.conf"
        self.munge_socket = self.root / "munge" / "munge.socket"
        self.jobcomp = self.root / "jobcomp.log"

    @property
    def env(self) -> dict[str, str]:
        """The environment a Slurm command of this cluster needs (``SLURM_CONF``)."""
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def pid_file(self, daemon: str) -> Path:
        return self.root / "run" / f"{daemon}.pid"

    def log_file(self, daemon: str) -> Path:
        return self.root / "log" / f"{daemon}.log"

    # -- configuration ------------------------------------------------------------------------------------------
    @property
    def name(self) -> str:
        """The cluster's name: ``workbench`` for the machine's cluster, else one made from ``ROOT`` (so that the
        jobs of two clusters on one machine, whose environments carry ``SLURM_CLUSTER_NAME``, are told apart)."""
        if self.root == DEFAULT_ROOT:
            return "workbench"
        return "wb" + hashlib.sha1(str(self.root).encode()).hexdigest()[:10]

    def configure(self, ctld_port: int = 6817, slurmd_port: int = 6818) -> Path:
        """Write ``ROOT/slurm.conf`` for this machine (see the module's docstring); returns its path."""
        name = self.name
        node = node_line()
        for sub in ("state", "spool", "log", "run", "munge"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        (self.root / "munge").chmod(0o700)
        lines = [
            MARK, f"# for {socket.gethostname()} as `slurmd -C` described it on {time.strftime('%Y-%m-%d %H:%M')}",
            f"ClusterName={name}", f"SlurmctldHost={node.split()[0].split('=', 1)[1]}(127.0.0.1)",
            f"SlurmctldPort={ctld_port}", f"SlurmdPort={slurmd_port}",
            "AuthType=auth/munge", "CredType=cred/munge", f"AuthInfo=socket={self.munge_socket}",
            "SlurmUser=root", "SlurmdUser=root",
            f"StateSaveLocation={self.root / 'state'}", f"SlurmdSpoolDir={self.root / 'spool'}",
            f"SlurmctldPidFile={self.pid_file('slurmctld')}", f"SlurmdPidFile={self.pid_file('slurmd')}",
            f"SlurmctldLogFile={self.log_file('slurmctld')}", f"SlurmdLogFile={self.log_file('slurmd')}",
            "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none", "MpiDefault=none",
            "SelectType=select/cons_tres", "SelectTypeParameters=CR_CPU", "SchedulerType=sched/backfill",
            "ReturnToService=2", "KillWait=5", "MinJobAge=300", "SlurmdTimeout=60", "SlurmctldTimeout=60",
            "JobAcctGatherType=jobacct_gather/none", "AccountingStorageType=accounting_storage/none",
            "JobCompType=jobcomp/filetxt", f"JobCompLoc={self.jobcomp}",
            f"{node} NodeAddr=127.0.0.1 State=UNKNOWN",
            f"PartitionName=debug Nodes={node.split()[0].split('=', 1)[1]} Default=YES MaxTime=INFINITE State=UP",
            "",
        ]
        tmp = self.conf.with_name(f".{self.conf.name}.tmp")
        tmp.write_text("\n".join(lines))
        tmp.chmod(0o644)
        os.replace(tmp, self.conf)
        return self.conf

    # -- start ----------------------------------------------------------------------------------------------------
    def up(self, timeout: float = UP_TIMEOUT_S) -> None:
        """Start munged, slurmctld and slurmd (each unless already running) and wait until the node is idle."""
        if not self.conf.is_file():
            raise ClusterError(f"{self.conf} does not exist: make setup-cluster (or configure first)")
        env = {**os.environ, TAG_VAR: str(self.root)}
        env.pop("SLURM_CONF", None)
        try:
            if self._pid("munged") is None:
                self._start("munged", [_which("munged"), "--force", f"--socket={self.munge_socket}",
                                       f"--pid-file={self.pid_file('munged')}", f"--log-file={self.log_file('munged')}",
                                       f"--seed-file={self.root / 'munge' / 'seed'}"], env)
                self._wait(lambda: self.munge_socket.exists(), 10, "munged")
            if self._pid("slurmctld") is None:
                self._start("slurmctld", [_which("slurmctld"), "-f", str(self.conf)], env)
            if self._pid("slurmd") is None:
                self._start("slurmd", [_which("slurmd"), "-f", str(self.conf)], env)
            self._wait(self._idle, timeout, "the node to take jobs (slurmctld and slurmd)")
        except ClusterError:
            self.down()
            raise

    def _start(self, daemon: str, argv: list[str], env: dict[str, str]) -> None:
        self.pid_file(daemon).unlink(missing_ok=True)
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=30,
                              stdin=subprocess.DEVNULL)
        if done.returncode != 0:
            raise ClusterError(f"{daemon} did not start ({done.returncode}): "
                               f"{(done.stderr or done.stdout).strip()}{self._tail(daemon)}")
        self._wait(lambda: self._pid(daemon) is not None, 10, daemon)

    def _idle(self) -> bool:
        done = subprocess.run(["sinfo", "-h", "-N", "-o", "%t"], env=self.env, capture_output=True, text=True,
                              timeout=10)
        return done.returncode == 0 and done.stdout.strip() in ("idle", "mix", "alloc")

    def _wait(self, ready, timeout: float, what: str) -> None:  # noqa: ANN001
        deadline = time.monotonic() + timeout
        while not ready():
            if time.monotonic() > deadline:
                daemon = next((d for d in DAEMONS if d in what), "slurmctld")
                raise ClusterError(f"waited {timeout:g} s for {what}{self._tail(daemon)}")
            time.sleep(0.2)

    def _tail(self, daemon: str, lines: int = 5) -> str:
        try:
            text = self.log_file(daemon).read_text(errors="replace").splitlines()[-lines:]
        except OSError:
            return ""
        return f"; {self.log_file(daemon)} ends:\n  " + "\n  ".join(text) if text else ""

    # -- state ----------------------------------------------------------------------------------------------------
    def _pid(self, daemon: str) -> int | None:
        """The daemon's pid from its pid file, if that process is alive and is the daemon."""
        try:
            pid = int(self.pid_file(daemon).read_text().split()[0])
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except (OSError, ValueError, IndexError):
            return None
        return pid if daemon.encode() in cmdline else None

    def running(self) -> dict[str, int]:
        """daemon -> pid, for the daemons of this cluster that run."""
        return {d: pid for d in DAEMONS if (pid := self._pid(d)) is not None}

    # -- stop -----------------------------------------------------------------------------------------------------
    def down(self) -> None:
        """Cancel every job, stop the daemons, kill what they left (see the module's docstring)."""
        if self._pid("slurmctld") is not None:
            self._cancel_all()
        for daemon in ("slurmd", "slurmctld", "munged"):
            pid = self._pid(daemon)
            if pid is not None:
                _stop(pid)
        deadline = time.monotonic() + STOP_TIMEOUT_S
        while (left := self.leftovers()) and time.monotonic() < deadline:
            below = {c for pid in left for c in _descendants(pid)}
            for pid in [*below, *left]:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            time.sleep(0.1)
        if left:
            raise ClusterError(f"processes of the cluster survived SIGKILL for {STOP_TIMEOUT_S:g} s: {left}")

    def leftovers(self) -> list[int]:
        """Processes of this cluster, found in /proc: its daemons (their environment carries ``TAG_VAR=ROOT``), its
        ``slurmstepd`` processes (slurmd starts them with an environment of their own, in the directory of its log
        file, under ``ROOT``) and its jobs' processes, even those that left their step's process tree (their
        environment carries ``SLURM_CLUSTER_NAME``)."""
        return _leftovers(self.root, self.name)

    def _cancel_all(self) -> None:
        def jobs() -> str | None:
            try:
                done = subprocess.run(["squeue", "-h", "-o", "%A"], env=self.env, capture_output=True, text=True,
                                      timeout=10)
            except subprocess.TimeoutExpired:
                return None
            return done.stdout.strip() if done.returncode == 0 else None

        if not jobs():
            return
        subprocess.run(["scancel", "--full", "--user", str(os.geteuid())], env=self.env, capture_output=True,
                       timeout=10)
        deadline = time.monotonic() + CANCEL_TIMEOUT_S
        while jobs() and time.monotonic() < deadline:
            time.sleep(0.2)


def _stop(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGTERM)
    except OSError:
        return
    deadline = time.monotonic() + STOP_TIMEOUT_S
    while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    try:
        os.kill(pid, signal.SIGKILL)
    except OSError:
        pass


def _leftovers(root: Path, name: str) -> list[int]:
    found = []
    daemon = f"{TAG_VAR}={root}".encode()
    job = f"SLURM_CLUSTER_NAME={name}".encode()
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            try:
                environ = Path(f"/proc/{entry}/environ").read_bytes().split(b"\0")
                if daemon in environ or job in environ:
                    found.append(int(entry))
                elif (Path(f"/proc/{entry}/cmdline").read_bytes().startswith(b"slurmstepd")
                      and Path(os.readlink(f"/proc/{entry}/cwd")).is_relative_to(root)):
                    found.append(int(entry))
            except OSError:
                continue
    return found


def _descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            children.setdefault(int(stat.rsplit(")", 1)[1].split()[1]), []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def configure_system(root: Path = DEFAULT_ROOT) -> Path:
    """The machine's cluster: ``ROOT/slurm.conf``, copied to ``/etc/slurm/slurm.conf`` (never over a file this tool
    did not write) so that ``sbatch`` and friends find it without ``SLURM_CONF``."""
    if SYSTEM_CONF.is_file() and MARK not in SYSTEM_CONF.read_text(errors="replace"):
        raise ClusterError(f"{SYSTEM_CONF} exists and was not written by workbench: this machine has a Slurm "
                           "configuration already; left alone")
    conf = Cluster(root).configure()
    SYSTEM_CONF.parent.mkdir(parents=True, exist_ok=True)
    tmp = SYSTEM_CONF.with_name(f".{SYSTEM_CONF.name}.tmp")
    shutil.copyfile(conf, tmp)
    tmp.chmod(0o644)
    os.replace(tmp, SYSTEM_CONF)
    return SYSTEM_CONF


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="a one-node Slurm cluster on this machine")
    parser.add_argument("action", choices=["configure", "up", "down", "status"])
    parser.add_argument("--root", type=Path, default=DEFAULT_ROOT)
    args = parser.parse_args(argv)
    cluster = Cluster(args.root)
    try:
        if args.action != "status" and (why := missing()) is not None:
            raise ClusterError(why)
        if args.action == "configure":
            where = configure_system(args.root) if args.root == DEFAULT_ROOT else cluster.configure()
            print(f"slurm-cluster: {where}: {node_line()}")
        elif args.action == "up":
            cluster.up()
            print(f"slurm-cluster: up ({', '.join(f'{d} {p}' for d, p in cluster.running().items())}); "
                  f"try: sinfo, sbatch, workbench sweep ... --executor slurm")
        elif args.action == "down":
            cluster.down()
            print("slurm-cluster: down (no daemon or job of the cluster left)")
        else:
            running = cluster.running()
            print("slurm-cluster: " + (", ".join(f"{d} {p}" for d, p in running.items()) or "down"))
    except (ClusterError, subprocess.TimeoutExpired) as exc:
        print(f"slurm-cluster: error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
