"""tools/slurm_cluster.py itself: a cluster of its own (beside the session's), a job that ignores SIGTERM running
on it (its shell dies on scancel, the job's process outlives it, out of the step's process tree), then ``down``: no
daemon, no slurmstepd, no process of the job is left. And Slurm's node lists against our reader's."""

import subprocess
import sys
import time
from pathlib import Path

from cluster.conftest import slurm_cluster


def test_down_leaves_nothing_of_the_cluster_even_with_a_stubborn_job(slurm, tmp_path):
    cluster = slurm_cluster.Cluster(tmp_path / "own")
    cluster.configure(ctld_port=slurm_cluster.free_port(), slurmd_port=slurm_cluster.free_port())
    marker = tmp_path / "started"
    stubborn = (f"import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); open({str(marker)!r}, 'w'); "
                "time.sleep(300)")
    try:
        cluster.up()
        assert set(cluster.running()) == {"munged", "slurmctld", "slurmd"}
        job = subprocess.run(["sbatch", "--parsable", "-o", "/dev/null", "--wrap", f'{sys.executable} -c "{stubborn}"'],
                             env=cluster.env, capture_output=True, text=True, timeout=30)
        assert job.returncode == 0, job.stderr
        deadline = time.monotonic() + 60
        while not marker.exists():
            assert time.monotonic() < deadline, "the job did not start"
            time.sleep(0.2)
        found = cluster.leftovers()
        assert any(Path(f"/proc/{p}/cmdline").read_bytes().startswith(b"slurmstepd") for p in found)
    finally:
        cluster.down()
    assert cluster.running() == {} and cluster.leftovers() == []
    assert subprocess.run(["pgrep", "-f", str(marker)], capture_output=True).returncode == 1  # the job is gone
    cluster.down()  # a second down is a no-op


def test_why_a_cluster_cannot_run_is_said(monkeypatch):
    """The reason the session's cluster is skipped with, where it cannot run (no Slurm needed)."""
    monkeypatch.setattr(slurm_cluster.os, "geteuid", lambda: 1000)
    assert slurm_cluster.missing() == "needs root (slurmd starts jobs as their users)"
    monkeypatch.setattr(slurm_cluster.os, "geteuid", lambda: 0)
    monkeypatch.setattr(slurm_cluster.shutil, "which", lambda name, path=None: None if name == "slurmd" else name)
    assert slurm_cluster.missing() == "Slurm is not installed (slurmd missing): make setup-cluster (root, apt)"


def test_node_lists_read_without_scontrol_as_slurm_reads_them(slurm):
    """``workbench.base.slurm_commands.expand_nodelist`` asks Slurm's ``scontrol show hostnames``; its
    fallback where scontrol is absent reads the same lists the same way."""
    from workbench.base.slurm_commands import expand_nodelist, expand_nodelist_here

    for nodelist in ("rack[1-2]-node[01-02]", "node[01-03,7],gpu1", "n[1-2],m[5,7]-k[1-2]", "n[009-011]",
                     "x[1-10]", "foo[1-2][3-4]", slurm.node):
        assert expand_nodelist(nodelist) == expand_nodelist_here(nodelist), nodelist
