"""The supervisor's side of the peers: the services they run beside their ranks, and how their own detection and
recovery become our figures.

* torchft: its Rust lighthouse as the separate service its users run (quorum, heartbeats). Detection = a
  survivor's first new quorum after the fault; resume = the first step committed by a quorum without the dead
  replica; regrow = the replacement's first committed step; samples lost = the missing replica's share of each
  step committed without it; steps redone = steps torchft did not commit.
* torchrun: one elastic agent for the world (``--max-restarts``); its workers join our slots by ``$RANK``; a
  restarted worker saying hello is the agent having seen the failure.
"""

from __future__ import annotations

import shutil
import socket
import sys
import time
from pathlib import Path
from typing import Any

from workbench.errors import RunStartError


def free_port(host: str) -> int:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
        probe.bind((host, 0))
        return probe.getsockname()[1]


def start_lighthouse(launcher: Any, host: str, heartbeat_timeout: float) -> str:
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


def start_agent(launcher: Any, host: str, world_size: int, store_address: str, restarts: int) -> Any:
    """torchrun: one elastic agent for the world; its workers join the slots by $RANK."""
    return launcher.launch(
        [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--master-addr", host,
         "--master-port", str(free_port(host)), "--nproc-per-node", str(world_size),
         "--max-restarts", str(restarts), "--monitor-interval", "0.1",
         "-m", "workbench.peers.torchrun_rank", "--store", store_address],
        "torchrun.log", what="the torchrun agent", env={"LOGLEVEL": "WARNING"})


def torchft_step(recorder: Any, spawn_id: int, label: int | None, reporter: bool, m: dict[str, Any]) -> None:
    """A torchft replica committed a step: resume, regrow and samples-lost figures (module docstring)."""
    for failure in recorder.failures:
        if failure.resume_time is None and failure.peer_seen and m["t"] >= failure.detect_time:
            failure.resume_time = m["t"]
        if failure.replacement == spawn_id and failure.regrow_time is None:
            failure.regrow_time = m["t"]
            how = (f"healed from a peer and committed step {m['step']}" if m["step"] > 0 else
                   "found no peer to heal from (they had finished) and started from step 0")
            recorder.event("regrow", m["step"], f"rank {label}'s replacement {how}", rank=label)
        elif failure.resume_time is not None and failure.regrow_time is None and reporter:
            failure.samples_lost += failure.lost_share


def torchft_quorum(recorder: Any, spawn_id: int, label: int | None, m: dict[str, Any]) -> None:
    """A survivor's first new quorum after the fault: torchft has seen it."""
    recorder.event("quorum", m["step"], f"torchft quorum {m['quorum_id']}: {m['participants']} replicas", rank=label)
    for failure in recorder.failures:
        if not failure.peer_seen and failure.fault_time <= m["t"] and failure.replacement != spawn_id:
            failure.detect_time, failure.peer_seen = m["t"], True


def torchft_discarded(recorder: Any, label: int | None, m: dict[str, Any]) -> None:
    recorder.event("discarded", m["step"], "torchft did not commit the step" + (f": {m['error']}" if m.get(
        "error") else ""), rank=label)
    for failure in recorder.failures:
        if failure.resume_time is None and failure.fault_time <= m["t"]:
            failure.discarded.add(m["step"])
            failure.steps_redone = len(failure.discarded)


def torchrun_restarted(recorder: Any) -> None:
    """A restarted torchrun worker said hello: the agent has seen the failure and acted on it."""
    for failure in recorder.failures:
        if not failure.peer_seen:
            failure.detect_time, failure.peer_seen = time.time(), True
