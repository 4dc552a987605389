"""Two "hosts" on this machine: network namespaces joined by a veth pair, made and removed by the test.

Each namespace has its own loopback and one end of the veth (10.231.N.1 and 10.231.N.2), so a process in one
reaches the other only over that link, as across two machines. Needs root and iproute2; ``unavailable()`` says
why they cannot be made here (the test is then skipped with that reason).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path


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


def run_over_two_hosts(a: Host, out_dir: Path, hosts_text: str, port: int, run_args: list[str],
                       remotes: list[list[str]], timeout: float = 240) -> tuple[dict, list[int], list[str]]:
    """``workbench run --hosts-file`` from host ``a`` (the file holding ``hosts_text``, the store on ``port``), then
    the ``remotes`` commands started; bounded waits, every process gone after. (the run's ``--json`` summary, the
    remotes' exit codes, their stderr)."""
    hosts = out_dir / "hosts"
    hosts.write_text(hosts_text)
    supervisor = subprocess.Popen(
        a.command(sys.executable, "-m", "workbench", "run", "--hosts-file", str(hosts), "--store-port", str(port),
                  *run_args, "--out", str(out_dir / "run"), "--json"),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    procs = [subprocess.Popen(command, stderr=subprocess.PIPE, text=True) for command in remotes]
    try:
        out, err = supervisor.communicate(timeout=timeout)
        codes = [p.wait(timeout=30) for p in procs]
        errors = [p.stderr.read() for p in procs]
    finally:
        for p in (supervisor, *procs):
            p.kill()
            p.wait()
    assert supervisor.returncode == 0, err[-2000:]
    return json.loads(out.strip().splitlines()[-1]), codes, errors
