"""Where ranks compute: ``RunConfig.device`` is ``cpu``, ``cuda`` or ``auto`` (cuda where a GPU is usable).

The machine's GPUs are read once per process by a short child process (:func:`inventory`), so no process that
forks ranks (a kernel, the rank template) ever initialises CUDA: a forked child of a CUDA process cannot use it.
A rank picks its GPU after it starts (:func:`rank_device`): the spawn slot's index modulo the GPUs, so ranks
share GPUs round-robin. Ranks exchange over gloo, which reduces CUDA tensors in place (NCCL refuses two ranks on
one GPU). What is supported and measured: docs/devices.md.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Any

from workbench import strategies
from workbench.base import modes
from workbench.base.errors import ConfigError
from workbench.base.fallbacks import taken

DEVICES = ("cpu", "cuda", "auto")
# asked of a fresh interpreter: torch's build, then each GPU's name and memory (this reads the driver, the caller
# never does); nvidia-smi adds the driver's version where it is installed
_PROBE = """
import json, subprocess, torch
found = {"torch": torch.__version__, "cuda": torch.version.cuda, "gpus": []}
if torch.version.cuda is not None and torch.cuda.is_available():
    for i in range(torch.cuda.device_count()):
        p = torch.cuda.get_device_properties(i)
        found["gpus"].append({"name": p.name, "memory_gib": round(p.total_memory / 2**30, 1)})
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20).stdout.split()
        found["driver"] = out[0] if out else None
    except (OSError, subprocess.SubprocessError):
        found["driver"] = None
print(json.dumps(found))
"""
_PROBE_TIMEOUT_S = 120  # torch's import on a loaded machine, then the driver's first answer
RELEASE_TIMEOUT_S = 30.0  # the longest a GPU rank waits for a dead rank's memory before it takes its GPU anyway
_RELEASE_POLL_S = 0.05


@dataclass(frozen=True)
class Inventory:
    """The GPUs torch can use on this machine (none on a CPU build), and why there are none."""

    torch: str
    cuda: str | None  # the CUDA version torch was built with; None: a CPU build
    gpus: tuple[dict[str, Any], ...] = ()
    driver: str | None = None
    problem: str | None = None  # the probe itself failed: what it said

    def why_none(self) -> str:
        if self.problem:
            return self.problem
        if self.cuda is None:
            return f"torch {self.torch} is a CPU build (no CUDA)"
        return f"torch {self.torch} (CUDA {self.cuda}) sees no GPU on this machine"

    def describe(self) -> str:
        """One line: the GPUs, their memory, driver and CUDA version (provenance's ``device``)."""
        names: dict[str, int] = {}
        for gpu in self.gpus:
            key = f"{gpu['name']} ({gpu['memory_gib']:g} GiB)"
            names[key] = names.get(key, 0) + 1
        listed = ", ".join(f"{n} x {key}" if n > 1 else key for key, n in names.items())
        return f"{listed}; driver {self.driver or 'unknown'}, CUDA {self.cuda}, torch {self.torch}"


_found: Inventory | None = None  # the machine's answer, once it gave one


def inventory() -> Inventory:
    """This machine's GPUs, read once per process in a child interpreter (never initialising CUDA here); a probe
    that failed is asked again next time (its ``problem`` is not kept as the machine's answer)."""
    global _found
    if _found is not None:
        return _found
    try:
        done = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True,
                              timeout=_PROBE_TIMEOUT_S, stdin=subprocess.DEVNULL)
        found = json.loads(done.stdout.strip().splitlines()[-1])
    except (OSError, subprocess.SubprocessError, ValueError, IndexError) as exc:
        return Inventory("unknown", None, problem=f"the GPU probe failed ({type(exc).__name__})")
    _found = Inventory(found["torch"], found["cuda"], tuple(found["gpus"]), found.get("driver"))
    return _found


def check_choice(config: Any) -> None:
    """What the configuration's values alone decide (RunConfig): the choice, and the modes that run on GPUs."""
    device = config.device
    if device not in DEVICES:
        raise ConfigError("device", f"{device!r} is not known: allowed {', '.join(DEVICES)}")
    if device == "cpu":
        return
    if not config.mode.gpus:
        raise ConfigError("device", f"{device!r} runs parallelism {modes.said(lambda m: m.gpus)}; parallelism "
                          f"{config.parallelism!r} ranks run on the CPU (--device cpu)")
    if strategies.get(config.strategy).peer is not None:
        raise ConfigError("device", f"{device!r} runs our strategies; strategy {config.strategy!r} runs the peer "
                          "system on the CPU (--device cpu)")
    if config.hosts:
        raise ConfigError("device", f"{device!r} runs ranks on this machine; a run over hosts runs on the CPU "
                          "(--device cpu)")


def resolve(config: Any) -> Any:
    """The configuration with ``device`` settled on this machine (``auto`` becomes ``cuda``, or ``cpu``, said as the
    fallback ``device_auto_cpu`` with why: :mod:`workbench.base.fallbacks`); ConfigError
    (one line, before any process starts) when ``cuda`` is asked for and no GPU is usable."""
    if config.device == "cpu":
        return config
    found = inventory()
    if not found.gpus:
        if config.device == "cuda":
            raise ConfigError("device", f"'cuda' asked for, but {found.why_none()}: use --device cpu, or auto "
                              "(cuda where a GPU is usable)")
        taken("device_auto_cpu", f"device auto: the ranks run on the CPU ({found.why_none()})")
        return _replace(config, "cpu")
    return _replace(config, "cuda")


def _replace(config: Any, device: str) -> Any:
    return config if config.device == device else dataclasses.replace(config, device=device)


def describe(config: Any) -> str:
    """Provenance's ``device``: ``cpu``, or the GPUs the ranks share and how they exchange."""
    if config.device != "cuda":
        return "cpu"
    found = inventory()
    return f"cuda, gloo on CUDA tensors, {config.world_size} ranks on {len(found.gpus)} GPU(s): {found.describe()}"


def rank_device(device: str, slot: int | None) -> Any:
    """In a rank process, after it started: its torch device. ``cuda``: GPU ``slot`` modulo the GPUs (round-robin),
    made this process's current device."""
    import torch

    if device != "cuda":
        return torch.device("cpu")
    count = torch.cuda.device_count()
    if count == 0:
        raise RuntimeError("device 'cuda': this rank's process sees no GPU")
    index = (slot or 0) % count
    torch.cuda.set_device(index)
    return torch.device("cuda", index)


def gpu_holders() -> set[int] | None:
    """The pids the driver lists as holding GPU memory (``nvidia-smi``'s compute processes); None where it cannot
    be asked (no nvidia-smi, no answer)."""
    try:
        done = subprocess.run(["nvidia-smi", "--query-compute-apps=pid", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=10, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError):
        return None
    if done.returncode != 0:
        return None
    return {int(word) for word in done.stdout.split() if word.isdigit()}


def wait_for_release(dead_pids: list[int], timeout: float = RELEASE_TIMEOUT_S) -> float:
    """In a GPU rank before it takes its GPU: wait until the driver lists none of ``dead_pids`` (this run's dead
    ranks) as holding GPU memory, at most ``timeout`` s; the seconds waited. A killed process's memory is freed
    when the driver closes its context, after the process is gone; nothing is waited for where nvidia-smi cannot
    tell (a container that shows no processes: the replacement's allocation then says if memory is short), said:
    ``gpu_wait_unknown``."""
    started = time.monotonic()
    pending = set(dead_pids) - {os.getpid()}
    while pending:
        held = gpu_holders()
        if held is None:
            taken("gpu_wait_unknown", f"nvidia-smi cannot tell which processes hold GPU memory: the GPU was taken "
                  f"without waiting for {len(pending)} dead ranks' memory to be freed")
            break
        if not pending & held or time.monotonic() - started >= timeout:
            break
        time.sleep(_RELEASE_POLL_S)
    return time.monotonic() - started
