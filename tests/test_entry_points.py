"""Every ``python -m`` entry point the docs name answers bad arguments in one line on stderr, exit 2, before it
starts anything, and never with a traceback; ``failure_free`` refuses each bad input of its own and ends on Ctrl-C
with exit 130 in one line, the run it had started stopped."""

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import rank_processes
from test_bad_meetings import interrupt_twice

ROOT = Path(__file__).resolve().parent.parent
FAILURE_FREE = "workbench.campaigns.reproduce.failure_free"

# (module, arguments, a piece of the one line it answers)
CASES = [
    ("workbench", ["run", "--world-size", "two"], "argument --world-size"),
    ("workbench.supervisor.template", ["--listen-fd", "x"], "argument --listen-fd: 'x' is not allowed"),
    ("workbench.rank", ["--control", "nowhere", "--id", "0"], "--control: 'nowhere' is not HOST:PORT"),
    ("workbench.rank", ["--store", "127.0.0.1:1", "--connect-timeout", "0"], "--connect-timeout: '0' is not allowed"),
    ("workbench.rank.speed", ["0"], "argument rounds: '0' is not allowed: an integer >= 1"),
    ("workbench.rank.peers.torchft_rank", ["--control", "x:y", "--id", "0"], "--control: 'x:y' is not HOST:PORT"),
    ("workbench.rank.peers.ulfm_rank", ["--store", "127.0.0.1:1"], "OMPI_COMM_WORLD_RANK (its rank number) is "
     "not set"),
    ("workbench.launch.sweeps.point", ["--events", "99"], "argument --events: '99' is not allowed: a file descriptor"),
    ("workbench.launch.sweeps.point", [], "the following arguments are required: --events"),
    (FAILURE_FREE, ["no_such_paper"], "'no_such_paper' is not a registry entry that compares accuracy; allowed: "
     "ccgrid22, gossipgrad"),
    (FAILURE_FREE, ["jpdc24"], "'jpdc24' is not a registry entry that compares accuracy"),
    (FAILURE_FREE, ["gossipgrad", "--seeds", "1234567"], "give tuning seeds, 0-29 (never a reporting seed)"),
    (FAILURE_FREE, ["gossipgrad", "--seeds", "-1"], "seeds [-1]: give tuning seeds, 0-29"),
    (FAILURE_FREE, ["gossipgrad", "--seeds", "0", "0"], "seeds [0, 0]: give each seed once"),
    (FAILURE_FREE, ["gossipgrad", "--steps", "-5"], "argument --steps: '-5' is not allowed: an integer >= 1"),
    (FAILURE_FREE, ["gossipgrad", "--steps", "0"], "argument --steps: '0' is not allowed: an integer >= 1"),
    (FAILURE_FREE, ["gossipgrad", "--bogus"], "unrecognized arguments: --bogus"),
    ("workbench.campaigns.reproduce.report", ["pyproject.toml"], "ROOT 'pyproject.toml' is not a directory"),
    ("workbench.campaigns.reproduce.report", ["--out", "docs"], "--out 'docs' is not allowed: give an HTML file"),
    ("workbench.campaigns.reproduce.measure_workload", ["no_such_workload"], "no workload 'no_such_workload'"),
    ("workbench.campaigns.reproduce.run_study", ["no_such_study"], "no registry entry 'no_such_study'"),
    ("workbench.campaigns.reproduce.run_study", ["jpdc24"], "runs its own registration only; run its notebook"),
    ("workbench.campaigns.reproduce.run_study", [], "the following arguments are required: key"),
    ("workbench.campaigns.reproduce.measure_workload", [], "the following arguments are required: name"),
    ("workbench.workloads.mnist1d_file", ["--write", "docs"], "'docs' is a directory: give a file path"),
    ("workbench.workloads.mnist1d_file", ["--write", "no/such/dir/m.npz"], "is in no directory (no/such/dir is "
     "missing)"),
]


def documented_entry_points() -> set[str]:
    """The modules ``python -m workbench...`` names in README.md and docs/*.md."""
    found = set()
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        found |= set(re.findall(r"python -m (workbench[a-z0-9_.]*)", path.read_text()))
    return {name.rstrip(".") for name in found}


def test_every_entry_point_the_docs_name_has_a_bad_argument_case():
    documented = documented_entry_points()
    assert FAILURE_FREE in documented and "workbench.workloads.mnist1d_file" in documented
    assert documented <= {module for module, _, _ in CASES}, documented - {module for module, _, _ in CASES}


@pytest.mark.parametrize("module,args,needle", CASES, ids=[f"{m.split('.')[-1]} {' '.join(a)}" for m, a, _ in CASES])
def test_bad_arguments_are_one_line_exit_2(module, args, needle, tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("OMPI_COMM_WORLD_RANK", "RANK")}
    done = subprocess.run([sys.executable, "-m", module, *args], cwd=ROOT, stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=120, env={**env, "TMPDIR": str(tmp_path)})
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and "Traceback" not in done.stderr, (done.returncode, done.stderr[-3000:])
    assert len(lines) == 1 and needle in lines[0], done.stderr
    assert done.stdout == "" and os.listdir(tmp_path) == []  # nothing started, nothing written


@pytest.mark.parametrize("moment", ["starting", "training"])
def test_failure_free_on_ctrl_c_stops_its_run_and_exits_130_in_one_line(tmp_path, moment):
    """A terminal's Ctrl-C: SIGINT to the process group, while the first failure-free run starts (its directory
    claimed) or trains (its four ranks up), then again while it stops."""
    proc = subprocess.Popen([sys.executable, "-m", FAILURE_FREE, "gossipgrad", "--seeds", "0"], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            env={**os.environ, "TMPDIR": str(tmp_path)})

    def ranks():
        return {line.split()[0] for line in rank_processes(parent=proc.pid)}

    def reached():
        return list(tmp_path.glob("*/w4-s0/*")) and (moment == "starting" or len(ranks()) >= 4)

    deadline = time.monotonic() + 90
    while time.monotonic() < deadline and proc.poll() is None and not reached():
        time.sleep(0.01)
    started, pids = bool(reached()), ranks()
    interrupt_twice(proc)
    out, err = proc.communicate(timeout=90)
    assert started and (moment == "starting" or len(pids) >= 4), err[-3000:]
    assert proc.returncode == 130 and err.strip() == "failure_free: interrupted", (proc.returncode, err[-3000:])
    assert out == "" and list(tmp_path.iterdir()) == []  # the scratch runs removed
    assert not pids & {line.split()[0] for line in rank_processes()}  # every rank stopped
