"""Two "hosts" on this machine: network namespaces joined by a veth pair, made and removed by the test.

Each namespace has its own loopback and one end of the veth (10.231.N.1 and 10.231.N.2), so a process in one
reaches the other only over that link, as across two machines. Needs root and iproute2; ``unavailable()`` says
why they cannot be made here (the test is then skipped with that reason).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass


@dataclass
class Host:
    namespace: str
    address: str

    def command(self, *argv: str) -> list[str]:
        """``argv`` run inside this host's namespace."""
        return ["ip", "netns", "exec", self.namespace, *argv]


def _ip(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *argv], capture_output=True, text=True, timeout=20)


def unavailable() -> str | None:
    if shutil.which("ip") is None:
        return "iproute2's ip is not installed"
    if os.geteuid() != 0:
        return "making network namespaces needs root"
    probe = f"wbprobe{os.getpid()}"
    made = _ip("netns", "add", probe)
    _ip("netns", "del", probe)
    if made.returncode:
        return f"ip netns add failed here: {made.stderr.strip()}"
    return None


@contextlib.contextmanager
def two_hosts() -> Iterator[tuple[Host, Host]]:
    tag = f"{os.getpid() % 100000}"
    subnet = f"10.231.{os.getpid() % 250}"
    a, b = Host(f"wb{tag}a", f"{subnet}.1"), Host(f"wb{tag}b", f"{subnet}.2")
    steps = [
        ("netns", "add", a.namespace), ("netns", "add", b.namespace),
        ("link", "add", f"wb{tag}x", "netns", a.namespace, "type", "veth", "peer", "name", f"wb{tag}y",
         "netns", b.namespace),
    ]
    for host, dev in ((a, f"wb{tag}x"), (b, f"wb{tag}y")):
        steps += [("-n", host.namespace, "link", "set", "lo", "up"),
                  ("-n", host.namespace, "addr", "add", f"{host.address}/24", "dev", dev),
                  ("-n", host.namespace, "link", "set", dev, "up")]
    try:
        for step in steps:
            done = _ip(*step)
            if done.returncode:
                raise RuntimeError(f"ip {' '.join(step)}: {done.stderr.strip()}")
        yield a, b
    finally:
        for host in (a, b):  # removing a namespace removes its end of the veth, and with it the pair
            _ip("netns", "del", host.namespace)
