"""Where ranks compute (``--device cpu | cuda | auto``), tested without a GPU: the choice and its errors, ``auto``
falling back to the CPU, no process that forks ranks ever touching CUDA, flips off the CPU giving the CPU's bits,
and training needing only what a GPU host has. The GPU itself: ``benchmarks/device_check.py``."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

from workbench.base.errors import ConfigError
from workbench.base.fallbacks import FallbackWarning
from workbench.config import devices
from workbench.config.run import RunConfig
from workbench.faults import bitflip
from workbench.launch.session import prepare, run
from workbench.results.run_result import RunResult

ROOT = Path(__file__).resolve().parents[1]
NO_GPU = {"CUDA_VISIBLE_DEVICES": ""}  # a GPU host's GPUs hidden: what this machine (CI) is anyway


@pytest.mark.parametrize("settings, words", [
    ({"device": "gpu"}, "'gpu' is not known: allowed cpu, cuda, auto"),
    ({"device": "cuda", "parallelism": "gossip"}, "parallelism 'gossip' ranks run on the CPU"),
    ({"device": "auto", "parallelism": "pipeline", "world_size": 2}, "parallelism 'pipeline' ranks run on the CPU"),
    ({"device": "cuda", "strategy": "torchrun"}, "runs the peer system on the CPU"),
])
def test_a_device_the_run_cannot_use_is_named_with_what_is_allowed(settings, words):
    with pytest.raises(ConfigError) as caught:
        RunConfig(**settings)
    assert caught.value.field == "device" and words in str(caught.value), str(caught.value)


def test_cuda_without_a_gpu_exits_2_in_one_line_before_any_rank_starts(tmp_path):
    env = {**os.environ, **NO_GPU, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", "workbench", "run", "--device", "cuda", "--steps", "5",
                           "--out", str(tmp_path / "run")], capture_output=True, text=True, env=env, timeout=300,
                          stdin=subprocess.DEVNULL)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "device" in lines[0] and "--device cpu" in lines[0], done.stderr
    assert "Traceback" not in done.stderr and not (tmp_path / "run" / "result.h5").exists()


def test_auto_runs_on_the_cpu_where_no_gpu_is_usable_and_records_it(tmp_path, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    monkeypatch.setattr(devices, "_found", None)  # asked anew (restored afterwards)
    with pytest.warns(FallbackWarning, match=r"device auto: the ranks run on the CPU \(torch "):
        assert prepare(device="auto").device == "cpu"
    result = run(world_size=2, steps=6, device="auto", eval_interval=3)
    said = [e for e in result.events if e["kind"] == "fallback"]
    assert result.summary["fallbacks"] == ["device_auto_cpu"] and len(said) == 1, said  # claimed by the run
    assert said[0]["detail"].startswith("device auto: the ranks run on the CPU (")
    assert result.summary["outcome"] == "completed", result.summary["reason"]
    assert result.config["device"] == "cpu" and result.provenance["device"] == "cpu"
    assert result.summary["replicas_identical"] is True


def test_a_rank_takes_its_gpu_round_robin_by_its_slot(monkeypatch):
    chosen = []
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "set_device", chosen.append)
    assert devices.rank_device("cpu", 3) == torch.device("cpu") and chosen == []
    assert [devices.rank_device("cuda", slot) for slot in (0, 1, 2, 3, None)] == [
        torch.device("cuda", i) for i in (0, 1, 0, 1, 0)]
    assert chosen == [0, 1, 0, 1, 0]
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    with pytest.raises(RuntimeError, match="sees no GPU"):
        devices.rank_device("cuda", 0)


def test_the_inventory_says_why_there_is_no_gpu():
    cpu_build = devices.Inventory("2.13.0+cpu", None)
    assert cpu_build.why_none() == "torch 2.13.0+cpu is a CPU build (no CUDA)"
    hidden = devices.Inventory("2.11.0", "13.0")
    assert hidden.why_none() == "torch 2.11.0 (CUDA 13.0) sees no GPU on this machine"
    two = devices.Inventory("2.11.0", "13.0", ({"name": "H100", "memory_gib": 79.1},) * 2, "580.1")
    assert two.describe() == "2 x H100 (79.1 GiB); driver 580.1, CUDA 13.0, torch 2.11.0"


# -- no process that forks ranks touches CUDA ------------------------------------------------------------------
_TRIPWIRE = """
import os, sys
log = os.environ.get("WB_CUDA_LOG")
if log:
    import json, torch, torch.cuda
    def _note(what):
        with open(log, "a") as f:
            argv = open("/proc/self/cmdline", "rb").read().replace(b"\\0", b" ").decode().strip()
            f.write(json.dumps({"pid": os.getpid(), "argv": argv, "what": what}) + "\\n")
    _note("installed")
    def _wrap(name, fn):
        def recorded(*args, **kwargs):
            _note(name)
            return fn(*args, **kwargs)
        return recorded
    for _name in ("is_available", "device_count", "_lazy_init", "init", "set_device", "current_device",
                  "get_device_properties", "mem_get_info", "synchronize"):
        setattr(torch.cuda, _name, _wrap(_name, getattr(torch.cuda, _name)))
"""


def _tripwire_env(tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(textwrap.dedent(_TRIPWIRE))
    log = tmp_path / "cuda.log"
    return {**os.environ, **NO_GPU, "WB_CUDA_LOG": str(log), "PYTHONPATH": f"{site}{os.pathsep}{ROOT}"}, log


def test_neither_the_kernel_nor_the_rank_template_ever_touches_cuda(tmp_path):
    """Every process of a ``--device auto`` run notes each call into torch.cuda (a tripwire installed at interpreter
    start); the template that forks the ranks and the process that supervises them make none. The positive
    control: a process that does call torch.cuda is noted."""
    env, log = _tripwire_env(tmp_path)
    control = subprocess.run([sys.executable, "-c", "import torch; torch.cuda.is_available(); print('ok')"],
                             env=env, capture_output=True, text=True, timeout=300)
    assert control.stdout.strip() == "ok", control.stderr
    assert '"what": "is_available"' in log.read_text()  # the tripwire notes a call
    log.unlink()
    done = subprocess.run([sys.executable, "-m", "workbench", "run", "--device", "auto", "--world-size", "2",
                           "--steps", "6", "--out", str(tmp_path / "run")], env=env, capture_output=True, text=True,
                          timeout=600, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr
    notes = [json.loads(line) for line in log.read_text().splitlines()]
    installed = {n["pid"]: n["argv"] for n in notes if n["what"] == "installed"}
    template = [pid for pid, argv in installed.items() if "-m workbench.supervisor.template" in argv]
    kernel = [pid for pid, argv in installed.items() if " run --device auto" in argv]
    assert len(template) == 1 and len(kernel) == 1, installed
    touched = [n for n in notes if n["what"] != "installed" and n["pid"] in template + kernel]
    assert not touched, touched


# -- flips off the CPU ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int32])
def test_a_flip_off_the_cpu_gives_the_cpus_bits_and_values(dtype):
    """The path a GPU tensor takes (gather the elements hit, flip them on the host, scatter them back), run on a
    CPU tensor, against the in-place CPU path: the same tensor bit for bit and the same logged values, repeated
    indices included (two flips of one element both apply)."""
    base = (torch.randn(64, 3) * 100).to(dtype)
    indices = np.array([5, 0, 191, 5, 77, 5], dtype=np.int64)
    width = bitflip.width(bitflip.dtype_name(dtype))
    masks = np.array([1 << (width - 1), 1, 1 << (width // 2), 1 << 3, (1 << width) - 1, 1 << 3], dtype=np.uint64)
    on_cpu, gathered = base.clone(), base.clone()
    expected = bitflip.apply_masks(on_cpu, indices, masks, "w")
    got = bitflip._apply_gathered(gathered, indices, masks, "w")
    raw = {2: torch.int16, 4: torch.int32, 8: torch.int64}[base.element_size()]
    assert torch.equal(on_cpu.view(raw), gathered.view(raw)) and not torch.equal(on_cpu.view(raw), base.view(raw))
    np.testing.assert_array_equal(got.indices, expected.indices)
    np.testing.assert_array_equal(got.masks, expected.masks)
    np.testing.assert_array_equal(got.old, expected.old)
    np.testing.assert_array_equal(got.new, expected.new)
    with pytest.raises(bitflip.FlipError, match="out of range"):
        bitflip._apply_gathered(gathered, np.array([192]), np.array([1], dtype=np.uint64), "w")


# -- what a GPU host has is enough to train --------------------------------------------------------------------
_BLOCKER = """
import sys
class _Refuse:
    BLOCKED = {"plotly", "papermill", "yaml", "ipywidgets", "anywidget", "mlflow", "jupyterlab",
               "IPython", "ipykernel", "nbformat", "tqdm", "PIL", "setproctitle", "torchft", "mpi4py"}
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in self.BLOCKED:
            raise ImportError(f"{name} is not on the GPU host")
        return None
sys.meta_path.insert(0, _Refuse())
"""


def test_training_needs_only_what_the_gpu_host_has(tmp_path):
    """torch, numpy, h5py, scikit-learn (and its scipy) and pandas: a run with kills, a regrow and checkpoints, as
    benchmarks/device_check.py runs it, with every other dependency of the project refused at import."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(textwrap.dedent(_BLOCKER))
    env = {**os.environ, **NO_GPU, "PYTHONPATH": f"{site}{os.pathsep}{ROOT}"}
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "device_check.py"), "--smoke",
                           "--out", str(tmp_path / "check")], env=env, capture_output=True, text=True, timeout=600,
                          stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr[-3000:]
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    assert figures["device"] == "cpu" and figures["strategies"], figures
    for name, row in figures["strategies"].items():
        assert row["outcome"] == "completed" and row["replicas_identical"], (name, row)


# -- a GPU rank takes its GPU when first put in a generation ---------------------------------------------------
_FAKE_GPU = """
import json, os
log = os.environ.get("WB_GPU_LOG")
if log:
    import torch
    from workbench.config import devices
    def _note(**what):
        with open(log, "a") as f:
            f.write(json.dumps({"pid": os.getpid(), **what}) + "\\n")
    devices.inventory = lambda: devices.Inventory("fake", "13.0", ({"name": "Fake GPU", "memory_gib": 1.0},), "1")
    def rank_device(device, slot):
        _note(what="took", slot=slot)
        return torch.device("cpu")  # the CPU stands in for the GPU: the path a GPU rank takes, on this machine
    def wait_for_release(dead_pids, timeout=None):
        _note(what="waited", dead=list(dead_pids))
        return 0.0
    devices.rank_device, devices.wait_for_release = rank_device, wait_for_release
"""


def _fake_gpu_run(tmp_path, name, *args):
    site = tmp_path / "site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(textwrap.dedent(_FAKE_GPU))
    log = tmp_path / f"{name}.log"
    env = {**os.environ, **NO_GPU, "WB_GPU_LOG": str(log), "PYTHONPATH": f"{site}{os.pathsep}{ROOT}"}
    done = subprocess.run([sys.executable, "-m", "workbench", "run", "--world-size", "2", "--steps", "30",
                           "--eval-interval", "10", "--strategy", "rollback", "--regrow", "--warm-spares", "1",
                           "--out", str(tmp_path / name), "--json", *args], env=env, capture_output=True, text=True,
                          timeout=600, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr[-3000:]
    notes = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    return json.loads(done.stdout.strip().splitlines()[-1]), notes


def test_a_warm_spare_takes_no_gpu_until_it_replaces_a_dead_rank_and_waits_for_its_memory(tmp_path):
    """``--device cuda`` with a stand-in GPU (the inventory reports one; the rank's device is the CPU): the two
    ranks take their GPU at generation 0, the warm spare only when it replaces the killed rank, after waiting
    for the killed process's memory; the model moved after it was built trains exactly as the CPU run does."""
    quiet, quiet_notes = _fake_gpu_run(tmp_path, "quiet", "--device", "cuda")
    assert quiet["outcome"] == "completed" and quiet["replicas_identical"] is True, quiet
    assert sorted(n["slot"] for n in quiet_notes if n["what"] == "took") == [0, 1], quiet_notes  # not the spare (2)
    assert all(n["dead"] == [] for n in quiet_notes if n["what"] == "waited"), quiet_notes

    killed, notes = _fake_gpu_run(tmp_path, "killed", "--device", "cuda", "--fault", "kill:rank=1,step=12")
    assert killed["outcome"] == "completed" and killed["replicas_identical"] is True, killed
    took = [n for n in notes if n["what"] == "took"]
    assert sorted(n["slot"] for n in took) == [0, 1, 2], notes
    spare = next(n["pid"] for n in took if n["slot"] == 2)
    victim = next(n["pid"] for n in took if n["slot"] == 1)
    assert [n["dead"] for n in notes if n["what"] == "waited" and n["pid"] == spare] == [[victim]], notes
    result = RunResult.load(killed["result_path"])
    assert any("took its GPU after" in e["detail"] for e in result.events if e["kind"] == "joined"), result.events

    on_cpu, _ = _fake_gpu_run(tmp_path, "cpu", "--device", "cpu", "--fault", "kill:rank=1,step=12")
    losses = [(m["step"], m["loss"]) for m in RunResult.load(on_cpu["result_path"]).metrics]
    assert losses == [(m["step"], m["loss"]) for m in result.metrics] and len(losses) >= 30
    assert on_cpu["final_test_accuracy"] == killed["final_test_accuracy"], (on_cpu, killed)


def test_a_rank_waits_for_a_dead_ranks_gpu_memory_until_the_driver_frees_it(tmp_path, monkeypatch):
    """``wait_for_release`` asks nvidia-smi (a stand-in here that lists the dead pid for its first 3 answers)
    and returns once the pid is gone; it gives up at its bound, and waits for nothing where nvidia-smi is absent
    or lists none of the dead."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    count = tmp_path / "asked"
    smi = bin_dir / "nvidia-smi"
    smi.write_text(f"#!/bin/sh\necho x >> {count}\nif [ $(wc -l < {count}) -le 3 ]; then echo 4242; fi\necho 17\n")
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    assert devices.gpu_holders() == {4242, 17}
    waited = devices.wait_for_release([4242], timeout=10)
    assert count.read_text().count("x") == 4 and 0.1 <= waited < 5, waited  # 3 answers still held it
    assert devices.wait_for_release([99999], timeout=10) < 1  # not listed: nothing to wait for
    smi.write_text("#!/bin/sh\necho 4242\n")  # the driver never frees it
    assert 0.3 <= devices.wait_for_release([4242], timeout=0.3) < 2  # held past the bound: it goes on
    monkeypatch.setenv("PATH", str(tmp_path / "nowhere"))
    with pytest.warns(FallbackWarning, match="nvidia-smi cannot tell") as said:  # no nvidia-smi: said
        assert devices.gpu_holders() is None and devices.wait_for_release([4242]) < 0.5
    assert [w.message.what for w in said] == ["gpu_wait_unknown"]


def test_a_failed_gpu_probe_is_asked_again(monkeypatch):
    monkeypatch.setattr(devices, "_found", None)
    monkeypatch.setattr(devices, "_PROBE", "raise SystemExit(1)")  # no answer
    assert devices.inventory().problem == "the GPU probe failed (IndexError)" and devices._found is None
    with pytest.warns(FallbackWarning, match=r"device auto: the ranks run on the CPU \(the GPU probe failed"):
        assert devices.resolve(RunConfig(device="auto")).device == "cpu"
    monkeypatch.undo()
