"""Where a run's ranks live when it spans several hosts: the hosts file and the placement of rank numbers.

A hosts file has one line per host, ``ADDRESS SLOTS [LAUNCH ...]``. The first line is this machine (the store and
control server bind there); a later line with a launcher has its ranks started through it (``ssh HOST``, ``srun
...``), one without has its ranks join by themselves (``workbench rank --store ADDR:PORT --rank-hint K``). Rank
numbers are given out in file order; warm spares start on this machine. Examples and details:
docs/sweeps-and-clusters.md and docs/internals.md.
"""

from __future__ import annotations

import ipaddress
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from workbench.base.errors import ConfigError


@dataclass(frozen=True)
class Host:
    address: str
    slots: int
    launch: tuple[str, ...] | None = None  # command prefix that starts a process there; None: spawned / joins

    def to_dict(self) -> dict[str, Any]:
        return {"address": self.address, "slots": self.slots, "launch": list(self.launch) if self.launch else None}

    @classmethod
    def coerce(cls, value: Any, first: bool) -> Host:
        if isinstance(value, Host):
            host = value
        elif isinstance(value, str):
            host = _parse_line(value)
        elif isinstance(value, dict) and set(value) <= {"address", "slots", "launch"} and "address" in value:
            launch = value.get("launch")
            if isinstance(launch, str):
                launch = shlex.split(launch)
            host = cls(value["address"], value.get("slots", 1), tuple(launch) if launch else None)
        else:
            raise ConfigError("hosts", f"{value!r} is not a host: give 'ADDRESS SLOTS [LAUNCH ...]' or "
                              "{'address': ..., 'slots': ..., 'launch': [...]}")
        check_address("hosts", host.address)
        lowest = 0 if first else 1
        if not (isinstance(host.slots, int) and not isinstance(host.slots, bool) and lowest <= host.slots <= 64):
            raise ConfigError("hosts", f"host {host.address} has {host.slots!r} slots; allowed {lowest}..64")
        if first and host.launch:
            raise ConfigError("hosts", f"the first host ({host.address}) is this machine: the supervisor binds to "
                              "its address and starts its ranks itself, so it takes no launcher")
        return host


def _parse_line(line: str) -> Host:
    words = shlex.split(line, comments=True)
    if len(words) < 2 or not words[1].isdigit():
        raise ConfigError("hosts", f"{line.strip()!r} is not 'ADDRESS SLOTS [LAUNCH ...]' (SLOTS a number)")
    return Host(words[0], int(words[1]), tuple(words[2:]) or None)


def check_address(field_name: str, address: Any) -> str:
    """An IP address literal (no names: a host's name may resolve to an interface the others cannot reach)."""
    try:
        return str(ipaddress.ip_address(address))
    except ValueError:
        raise ConfigError(field_name, f"{address!r} is not an IP address (e.g. 127.0.0.1 or 10.0.0.1)") from None


def read_hosts_file(path: str | Path) -> list[dict[str, Any]]:
    """The hosts of a hosts file, as dicts for ``RunConfig.hosts``; a ConfigError naming the line if one is bad."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError("hosts_file", f"cannot read {path}: {exc.strerror}") from None
    hosts: list[dict[str, Any]] = []
    for number, line in enumerate(text.splitlines(), 1):
        if not shlex.split(line, comments=True):
            continue
        try:
            hosts.append(Host.coerce(line, first=not hosts).to_dict())
        except ConfigError as exc:
            raise ConfigError("hosts_file", f"{path}:{number}: {exc.message}") from None
    if not hosts:
        raise ConfigError("hosts_file", f"{path} lists no hosts ('ADDRESS SLOTS [LAUNCH ...]' per line)")
    return hosts


def placement(hosts: list[Host]) -> dict[int, Host]:
    """Rank number -> the host that holds it, in file order."""
    where: dict[int, Host] = {}
    for host in hosts:
        for _ in range(host.slots):
            where[len(where)] = host
    return where


def check_hosts(config: Any) -> None:
    """A run's ``hosts`` (each a :class:`Host`, one slot per rank, the first this machine) and ``bind`` (this
    machine's address, the first host's), checked and completed in place."""
    if config.hosts is None:
        config.bind = check_address("bind", config.bind or "127.0.0.1")
        return
    if not isinstance(config.hosts, (list, tuple)) or not config.hosts:
        raise ConfigError("hosts", f"{config.hosts!r} must be a non-empty list of hosts (first: this machine)")
    hosts = [Host.coerce(h, first=i == 0) for i, h in enumerate(config.hosts)]
    slots = sum(h.slots for h in hosts)
    if slots != config.world_size:
        raise ConfigError("hosts", f"the hosts hold {slots} ranks but world_size={config.world_size}: give each "
                          "rank a slot (one line per host: ADDRESS SLOTS [LAUNCH ...])")
    config.hosts = [h.to_dict() for h in hosts]
    config.bind = check_address("bind", config.bind or hosts[0].address)
    if config.bind != hosts[0].address:
        raise ConfigError("bind", f"{config.bind} is not the first host's address {hosts[0].address}: the first "
                          "host is this machine, where the store and control server listen")
