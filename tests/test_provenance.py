"""Provenance: what collect() records and that it is right, where it is kept (result.h5, checkpoints, tables), files
from before it, and the report's warnings on mixed commits or hosts."""

import json
import os
import socket
import subprocess
import sys
from datetime import datetime
from importlib import metadata
from pathlib import Path

import h5py
import pytest
import torch
from sweep_fixtures import fake_sweep

import workbench
from workbench.base import checkpoint
from workbench.launch import cli
from workbench.launch.sweeps.report import ProvenanceWarning, report
from workbench.results import provenance
from workbench.results.run_result import RunResult

ROOT = Path(__file__).resolve().parents[1]


def git(*args):
    return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True, check=True).stdout.strip()


def test_collect_is_right_and_imports_no_torch():
    code = ("import json, sys; from workbench.results import provenance; p = provenance.finish(provenance.collect(7)); "
            "print(json.dumps(p)); print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True,
                         env={**os.environ, provenance.NOTEBOOK_VAR: "/x/nb.ipynb"}).stdout.splitlines()
    prov, torch_imported = json.loads(out[0]), out[1]
    assert torch_imported == "False"
    assert set(prov) == set(provenance.FIELDS)
    assert prov["commit"] == git("rev-parse", "HEAD")
    assert prov["dirty"] == bool(git("status", "--porcelain", "--untracked-files=no"))
    for package in ("torch", "numpy", "h5py", "papermill"):
        assert prov[package] == metadata.version(package)
    assert prov["python"] == ".".join(map(str, sys.version_info[:3])) and prov["workbench"] == workbench.__version__
    assert prov["host"] == socket.gethostname() and prov["cores"] == os.cpu_count() and prov["cpu"]
    assert prov["memory_gib"] > 0 and prov["load_start"] >= 0 and prov["load_end"] >= 0
    started, ended = (datetime.fromisoformat(prov[k]) for k in ("started_utc", "ended_utc"))
    assert started.utcoffset().total_seconds() == 0 and started <= ended
    assert prov["notebook"] == "/x/nb.ipynb" and prov["command"] == "-c" and prov["seed"] == 7


def test_not_a_git_checkout_is_unknown_not_a_crash(tmp_path, monkeypatch):
    monkeypatch.setattr(provenance, "_SOURCE", tmp_path)  # no .git: an installed package
    provenance._git_state.cache_clear()
    try:
        assert provenance.git_state() == ("unknown", None)
        assert provenance.collect()["commit"] == "unknown"
        monkeypatch.setattr(provenance, "_SOURCE", ROOT)
        monkeypatch.setenv("PATH", str(tmp_path))  # a checkout, but no git program
        provenance._git_state.cache_clear()
        assert provenance.git_state() == ("unknown", None)
    finally:
        provenance._git_state.cache_clear()


def test_cli_run_result_and_checkpoint_carry_provenance(tmp_path):
    """Acceptance: `workbench run --world-size 2 --steps 50 --out DIR --json` -> load_results has prov.*."""
    proc = subprocess.run([sys.executable, "-m", "workbench", "run", "--world-size", "2", "--steps", "50", "--out",
                           str(tmp_path), "--json"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    row = workbench.load_results(tmp_path).iloc[0]
    assert row["prov.commit"] == git("rev-parse", "HEAD") and row["prov.torch"] == metadata.version("torch")
    assert row["prov.cpu"] and row["prov.host"] == socket.gethostname() and row["prov.seed"] == 0
    assert "run --world-size 2 --steps 50" in row["prov.command"]
    assert datetime.fromisoformat(row["prov.started_utc"]) < datetime.fromisoformat(row["prov.ended_utc"])
    final = checkpoint.load(tmp_path / "checkpoints" / "final.h5")
    assert final.provenance["started_utc"] == row["prov.started_utc"] and final.provenance["commit"] == row[
        "prov.commit"]


def test_files_without_provenance_still_load(tmp_path):
    new = RunResult({"seed": 1}, [], [], [], {"outcome": "completed", "final_test_accuracy": 0.5},
                    provenance=provenance.collect(1))
    new.save(tmp_path / "new")
    old = RunResult({"seed": 0}, [], [], [], {"outcome": "completed", "final_test_accuracy": 0.4})
    path = old.save(tmp_path / "old")
    with h5py.File(path, "a") as f:  # as written before provenance was kept
        del f.attrs["provenance"]
    assert RunResult.load(path).provenance == {}
    frame = workbench.load_results(tmp_path).set_index("config.seed")
    assert frame.loc[1, "prov.commit"] == new.provenance["commit"] and frame["prov.commit"].isna().sum() == 1
    ckpt = tmp_path / "c.h5"
    checkpoint.save(ckpt, checkpoint.Checkpoint(3, {"w": torch.ones(2)}, {}, provenance={"seed": 3}))
    assert checkpoint.load(ckpt).provenance == {"seed": 3}
    with h5py.File(ckpt, "a") as f:
        del f.attrs["provenance"]
    assert checkpoint.load(ckpt).provenance == {}


def test_report_prints_provenance_and_warns_on_mixed_commits_and_hosts(tmp_path, capsys):
    ids = fake_sweep(tmp_path / "s")
    page = report(tmp_path / "s", out=tmp_path / "r.html").read_text()  # no provenance (older points): no crash
    assert "no provenance recorded" in page
    for i, pid in enumerate(ids):
        result = RunResult.load(tmp_path / "s" / pid / "result.h5")
        result.provenance = {**provenance.collect(0), "commit": "a" * 40 if i % 2 else "b" * 40,
                             "host": "node1" if i < 3 else "node2"}
        result.save(tmp_path / "s" / pid)
    with pytest.warns(ProvenanceWarning) as caught:
        page = report(tmp_path / "s", out=tmp_path / "r.html").read_text()
    assert {str(w.message).split(": ", 1)[1] for w in caught} == {
        f"the points come from 2 different commits: {'b' * 12} (6 points), {'a' * 12} (6 points)",
        "the points come from 2 different hosts: node1 (3 points), node2 (9 points)"}
    assert "Warning: the points come from 2 different commits" in page and "<summary>Provenance</summary>" in page
    assert cli.main(["report", str(tmp_path / "s"), "--out", str(tmp_path / "r.html")]) == 0
    out, err = capsys.readouterr()
    assert f"torch {metadata.version('torch')}" in out and "host node1 (3 points), node2 (9 points)" in out
    assert err.count("workbench: warning: sweep") == 2 and "different hosts" in err
