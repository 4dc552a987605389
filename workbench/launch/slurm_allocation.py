"""``workbench run --slurm [N]``: the hosts of a run placed on the Slurm allocation it runs in, instead of a hosts file
(:mod:`workbench.base.hosts_file`).

:func:`allocation_hosts` reads the allocation from Slurm's environment (``SLURM_JOB_NODELIST`` expanded by ``scontrol
show hostnames``, ``SLURM_TASKS_PER_NODE``); this node is the first host when the supervisor runs inside the job, else
it holds no rank. One rank per task (or the first ``N``), this node's first; every other node is launched with ``srun
--overlap -N1 -n1 -w NODE --cpus-per-task=C`` (``SLURM_JOB_CPUS_PER_NODE``); addresses are the nodes' ``NodeAddr``.
Mistakes are a ``ConfigError``. Details: docs/sweeps-and-clusters.md and docs/internals.md.
"""

from __future__ import annotations

import ipaddress
import os
import socket
from collections.abc import Callable, Mapping
from typing import Any

from workbench.base import slurm_commands as slurm
from workbench.base.errors import ConfigError


def allocation_hosts(ranks: int | None = None, environ: Mapping[str, str] | None = None,
                     address_of: Callable[[str], str] | None = None) -> list[dict[str, Any]]:
    """The hosts (``RunConfig.hosts`` dicts) of a run of ``ranks`` ranks (default: one per task) on the allocation
    (see the module docstring). ``address_of``: node name -> IP address (default: Slurm's ``NodeAddr``)."""
    env = os.environ if environ is None else environ
    address_of = address_of or node_address
    nodelist = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")
    if not nodelist:
        raise ConfigError("slurm", "not inside a Slurm allocation (no SLURM_JOB_NODELIST): run it under salloc, "
                          "in an sbatch script, or give a hosts file")
    try:
        nodes = slurm.expand_nodelist(nodelist)  # scontrol show hostnames; without scontrol, read here
        tasks = slurm.expand_tasks_per_node(env.get("SLURM_TASKS_PER_NODE", ",".join("1" for _ in nodes)))
    except (slurm.SlurmError, slurm.SlurmUnavailable) as exc:
        raise ConfigError("slurm", str(exc)) from None
    cpus = _cpus_per_node(env, nodes)
    if len(tasks) != len(nodes):
        raise ConfigError("slurm", f"SLURM_TASKS_PER_NODE={env.get('SLURM_TASKS_PER_NODE')} does not match the "
                          f"{len(nodes)} nodes of {nodelist}")
    here = env.get("SLURMD_NODENAME")
    order = sorted(range(len(nodes)), key=lambda i: nodes[i] != here)  # this node first, else node-list order
    total = sum(tasks)
    if ranks is not None and not 1 <= ranks <= total:
        raise ConfigError("slurm", f"--slurm {ranks}: the allocation has {total} tasks (SLURM_TASKS_PER_NODE="
                          f"{env.get('SLURM_TASKS_PER_NODE')} on {nodelist}); ask for 1..{total} ranks")
    left = total if ranks is None else ranks
    placed: list[tuple[str, int, list[str]]] = []
    for i in order:
        take = min(tasks[i], left)
        left -= take
        if take:
            placed.append((nodes[i], take, [f"--cpus-per-task={cpus[i]}"] if cpus else []))
    hosts: list[dict[str, Any]] = []
    if here is None or not placed or placed[0][0] != here:  # the supervisor runs off the allocation's nodes
        first = address_of(placed[0][0])
        hosts.append({"address": _route_address(first), "slots": 0, "launch": None})
    for node, slots, cpu_option in placed:
        if node == here:
            hosts.append({"address": address_of(node), "slots": slots, "launch": None})
        else:
            hosts.append({"address": address_of(node), "slots": slots,
                          "launch": ["srun", "--overlap", "-N1", "-n1", f"-w{node}", *cpu_option]})
    return hosts


def _cpus_per_node(env: Mapping[str, str], nodes: list[str]) -> list[int]:
    """``SLURM_JOB_CPUS_PER_NODE`` expanded, one count per node (each rank launched with ``--cpus-per-task`` of
    its node's); [] where Slurm did not set it. ConfigError where it is malformed: the ranks would be launched
    with Slurm's default CPUs, fewer than the allocation holds."""
    text = env.get("SLURM_JOB_CPUS_PER_NODE")
    if text is None:
        return []
    try:
        cpus = slurm.expand_tasks_per_node(text)  # the same format as the tasks: 4(x2),2
    except slurm.SlurmError:
        raise ConfigError("slurm", f"cannot read SLURM_JOB_CPUS_PER_NODE={text!r} (counts such as 4(x2),2): the "
                          "ranks would get Slurm's default CPUs per task") from None
    if len(cpus) != len(nodes):
        raise ConfigError("slurm", f"SLURM_JOB_CPUS_PER_NODE={text} does not match the {len(nodes)} nodes of the "
                          "allocation")
    return cpus


def node_address(node: str) -> str:
    """The IP address Slurm reaches ``node`` at (``NodeAddr``, resolved if it is a name)."""
    address = node
    try:
        done = slurm.run(["scontrol", "-o", "show", "node", node])
        if done.returncode == 0:
            address = next((w.split("=", 1)[1] for w in done.stdout.split() if w.startswith("NodeAddr=")), node)
    except slurm.SlurmUnavailable:
        pass
    try:
        return str(ipaddress.ip_address(address))
    except ValueError:
        pass
    try:
        return socket.getaddrinfo(address, None, socket.AF_INET)[0][4][0]
    except OSError:
        raise ConfigError("slurm", f"cannot find the address of node {node} (NodeAddr {address})") from None


def _route_address(peer: str) -> str:
    """This machine's address on the route to ``peer`` (a UDP socket's local end after connect: nothing sent)."""
    if ipaddress.ip_address(peer).is_loopback:
        return peer
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect((peer, 9))
            return s.getsockname()[0]
        except OSError:
            raise ConfigError("slurm", f"no route from this machine to {peer}") from None
