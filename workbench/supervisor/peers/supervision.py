"""The supervisor's side of the peers: the services they run beside their ranks (torchft's lighthouse, torchrun's
elastic agent, ``mpirun --with-ft ulfm``), and how their own detection and recovery become our figures
(detection, settle, resume, regrow, samples lost, steps redone). Each peer's mapping: docs/internals.md and
docs/permanent-faults.md.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from workbench.base.errors import RunStartError
from workbench.base.protocol import Message
from workbench.config.run import RunConfig
from workbench.strategies import mpirun_path
from workbench.supervisor.launcher import Launcher
from workbench.supervisor.recorder import Recorder


def free_port(host: str) -> int:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
        probe.bind((host, 0))
        return probe.getsockname()[1]


def start_lighthouse(launcher: Launcher, host: str, heartbeat_timeout: float) -> str:
    """Start torchft's lighthouse on ``host``; returns its address once it listens (bounded: 10 s)."""
    binary = Path(sys.executable).with_name("torchft_lighthouse")
    if not binary.is_file():
        binary = Path(shutil.which("torchft_lighthouse") or binary)
    port = free_port(host)
    proc = launcher.launch(
        [str(binary), "--bind", f"{host}:{port}", "--min_replicas", "1", "--quorum_tick_ms", "100",
         "--join_timeout_ms", "10000", "--heartbeat_timeout_ms", str(int(heartbeat_timeout * 1000))],
        "lighthouse.log", what="torchft's lighthouse", env={"RUST_LOG": "warn"})
    deadline = time.monotonic() + 10
    while True:
        try:
            socket.create_connection((host, port), timeout=1).close()
            return f"http://{host}:{port}"
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RunStartError("torchft's lighthouse did not start listening within 10 s") from None
            time.sleep(0.02)


def start_torchrun(launcher: Launcher, config: RunConfig, store_address: str, planned: int,
                   recorder: Recorder) -> subprocess.Popen:
    """torchrun's elastic agent for the whole world; its workers join our slots through the store by ``$RANK``."""
    host, world = config.bind, config.world_size
    restarts = planned + 3  # every planned kill/hang and random failure, plus 3 for restarts failing on their own
    recorder.event("torchrun", -1, f"torchrun agent started: {world} workers, up to {restarts} restarts of the world",
                   world=world, restarts=restarts)
    return launcher.launch(
        [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--master-addr", host,
         "--master-port", str(free_port(host)), "--nproc-per-node", str(world),
         "--max-restarts", str(restarts), "--monitor-interval", "0.1",
         "-m", "workbench.rank.peers.torchrun_rank", "--store", store_address],
        "torchrun.log", what="the torchrun agent", env={"LOGLEVEL": "WARNING"})


def start_mpirun(launcher: Launcher, config: RunConfig, store_address: str,
                 recorder: Recorder) -> subprocess.Popen:
    """Open MPI's mpirun for the whole world; its processes join our slots through the store by MPI rank."""
    world = config.world_size
    argv, env = mpirun_command(world, ft=os.environ.get("WORKBENCH_ULFM_FT", "1") != "0")
    # Open MPI's session files (killed at the run's end, mpirun cannot remove them) go where the run removes them
    env["TMPDIR"] = tempfile.mkdtemp(prefix="workbench-mpi-")
    launcher.scratch.append(env["TMPDIR"])
    ft = "--with-ft" in argv
    recorder.event("mpirun", -1, f"mpirun started {world} MPI processes" + (" with ULFM" if ft else
                                                                           " WITHOUT fault tolerance (benchmark)"),
                   world=world, ft=ft)
    return launcher.launch([*argv, sys.executable, "-m", "workbench.rank.peers.ulfm_rank", "--store",
                            store_address], "mpirun.log", what="Open MPI's mpirun", env=env)


def mpirun_command(world_size: int, ft: bool = True) -> tuple[list[str], dict[str, str]]:
    """mpirun for ``world_size`` processes on this machine. ULFM's failure notification needs the TCP transport
    (Open MPI 5.0's shared-memory transport left survivors blocked in a collective with a dead peer: measured,
    docs/permanent-faults.md), bound to the loopback; no core binding (ranks share 2 cores with the supervisor)."""
    argv = [mpirun_path() or "mpirun", "--oversubscribe", "--bind-to", "none", "--mca", "btl", "tcp,self",
            "--mca", "btl_tcp_if_include", "127.0.0.0/8", "-np", str(world_size)]
    if ft:
        argv[1:1] = ["--with-ft", "ulfm"]
    if os.geteuid() == 0:
        argv.insert(1, "--allow-run-as-root")  # containers run as root; Open MPI refuses it otherwise
    return argv, {"OMPI_MCA_mpi_ft_verbose": "0", "PRTE_MCA_prte_silence_shared_fs": "1"}


def torchrun_ended(code: int, started: bool, log_hint: Callable[[str], str]) -> tuple[str, str]:
    """The outcome when torchrun's agent exits before every member finished."""
    if not started:
        return "failed", f"the torchrun agent exited during start-up with code {code}" + log_hint("torchrun.log")
    return "failed", (f"the torchrun agent gave up (exit code {code}): a worker failed more often than "
                      "--max-restarts allows")


def mpirun_ended(code: int, started: bool, log_hint: Callable[[str], str]) -> tuple[str, str]:
    """The outcome when mpirun exits before every surviving member finished."""
    when = "during start-up" if not started else "before every surviving rank finished"
    return "failed", f"mpirun exited {when} (code {code})" + log_hint("mpirun.log")


def ulfm_message(recorder: Recorder, label: int | None, m: Message) -> None:
    """What the ULFM survivors report: a failed MPI call (detection), the shrunk communicator (settled)."""
    if m["event"] == "failure":
        recorder.event("ulfm_error", m["step"], f"MPI call failed at step {m['step']}: {m['error']}", rank=label,
                       error=m["error"])
        recorder.peer_mark("detect", m["t"])
    elif m["event"] == "shrunk":
        moved = f", state broadcast from the survivor at step {m['step']} ({m['bytes']} bytes)" if m["bytes"] else ""
        recorder.event("ulfm", m["step"], f"revoke {m['revoke_s'] * 1e3:.1f} ms, shrink {m['shrink_s'] * 1e3:.1f} ms, "
                       f"agree {m['agree_s'] * 1e3:.1f} ms: {m['size']} ranks go on{moved}; step {m['step']} retried",
                       rank=label, size=m["size"], revoke_s=m["revoke_s"], shrink_s=m["shrink_s"], agree_s=m["agree_s"],
                       bytes=m["bytes"])
        recorder.world_size = m["size"]
        recorder.status.update(world_size=m["size"])
        recorder.peer_mark("settle", m["t"])


def torchft_step(recorder: Recorder, spawn_id: int, label: int | None, reporter: bool, m: Message) -> None:
    """A torchft replica committed a step: resume, regrow and samples-lost figures (module docstring)."""
    for failure in recorder.failures:
        if failure.resume_time is None and failure.peer_seen and m["t"] >= failure.detect_time:
            failure.resume_time = m["t"]
        if failure.replacement == spawn_id and failure.regrow_time is None:
            failure.regrow_time = m["t"]
            how = (f"healed from a peer and committed step {m['step']}" if m["step"] > 0 else
                   "found no peer to heal from (they had finished) and started from step 0")
            recorder.event("regrow", m["step"], f"rank {label}'s replacement {how}", rank=label, ranks=[label])
        elif failure.resume_time is not None and failure.regrow_time is None and reporter:
            failure.samples_lost += failure.lost_share


def torchft_quorum(recorder: Recorder, spawn_id: int, label: int | None, m: Message) -> None:
    """A survivor's first new quorum after the fault: torchft has seen it."""
    recorder.event("quorum", m["step"], f"torchft quorum {m['quorum_id']}: {m['participants']} replicas", rank=label,
                   quorum_id=m["quorum_id"], participants=m["participants"])
    for failure in recorder.failures:
        if not failure.peer_seen and failure.fault_time <= m["t"] and failure.replacement != spawn_id:
            failure.detect_time, failure.peer_seen = m["t"], True


def torchft_discarded(recorder: Recorder, label: int | None, m: Message) -> None:
    recorder.event("discarded", m["step"], "torchft did not commit the step" + (f": {m['error']}" if m.get(
        "error") else ""), rank=label, error=m.get("error") or None)
    for failure in recorder.failures:
        if failure.resume_time is None and failure.fault_time <= m["t"]:
            failure.discarded.add(m["step"])
            failure.steps_redone = len(failure.discarded)


def torchrun_restarted(recorder: Recorder) -> None:
    """A restarted torchrun worker said hello: the agent has seen the failure and acted on it."""
    for failure in recorder.failures:
        if not failure.peer_seen:
            failure.detect_time, failure.peer_seen = time.time(), True
