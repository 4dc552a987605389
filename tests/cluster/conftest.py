"""A real one-node Slurm cluster for the tests of this directory: munged, slurmctld and slurmd started once per
session by ``tools/slurm_cluster.py`` under a temporary directory of their own (their own ports, state, munge
socket and ``slurm.conf``, reached through ``SLURM_CONF``; a cluster started with ``make cluster-up`` is not
touched), stopped at the session's end with every job cancelled and nothing of it left running.

Skipped, with the reason, where it cannot run: not root, or Slurm and munge not installed (``make
setup-cluster``, root and apt). A cluster that is installed but does not come up fails the tests that need it,
with its daemon's log.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

TOOLS = Path(__file__).resolve().parents[2] / "tools"
sys.path.insert(0, str(TOOLS))
import slurm_cluster  # noqa: E402


class SlurmSession:
    """The session's cluster: ``run`` a Slurm command against it (bounded)."""

    def __init__(self, cluster: "slurm_cluster.Cluster") -> None:
        self.cluster = cluster
        self.node = slurm_cluster.node_line().split()[0].split("=", 1)[1]

    def run(self, *argv: str, timeout: float = 30) -> subprocess.CompletedProcess:
        return subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, env=self.cluster.env)

    def queue(self) -> str:
        return self.run("squeue", "-h", "-o", "%i %T").stdout.strip()


@pytest.fixture(scope="session")
def slurm(tmp_path_factory):
    why = slurm_cluster.missing()
    if why:
        pytest.skip(f"no Slurm cluster: {why}")
    cluster = slurm_cluster.Cluster(tmp_path_factory.mktemp("slurm"))
    cluster.configure(ctld_port=slurm_cluster.free_port(), slurmd_port=slurm_cluster.free_port())
    previous = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = str(cluster.conf)  # every command and CLI the tests start talks to this cluster
    try:
        cluster.up()
        yield SlurmSession(cluster)
    finally:
        cluster.down()
        if previous is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = previous
    left = cluster.running()
    assert not left, f"the cluster's daemons outlived cluster.down(): {left}"
    assert not cluster.leftovers(), "processes of the cluster outlived cluster.down()"

