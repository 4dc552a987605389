"""No silent slow path: what a run's processes import at start, and the speed gate failing on a planted regression.

A rank that imported scikit-learn (the digits file not found) started 2.4 s slower for three issues, and the
supervising process importing torch (through the checkpoint module) cost every CLI run ~1.1 s; neither said so.
These tests hold the imports; benchmarks/gate.py holds the speed (docs/benchmarks.md, "The speed gate").
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest
from planting import FIRED_VAR, sitecustomize

ROOT = Path(__file__).resolve().parents[1]
HEAVY = "sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'sklearn'))"


def run_python(code: str, timeout: float = 180, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=ROOT)


def test_the_supervising_process_imports_neither_torch_nor_scikit_learn(tmp_path):
    """workbench.run and the CLI, through a kill and a checkpoint_restart (checkpoints written, verified, resumed)."""
    out = run_python(f"""
        import sys, workbench
        r = workbench.run(world_size=2, steps=6, strategy="checkpoint_restart", checkpoint_every=2,
                          faults=["kill:rank=1,step=3"], out={str(tmp_path / "api")!r})
        assert r.completed and len(r.failures) == 1, r.summary
        print({HEAVY})
        """)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "[]", out.stdout
    out = run_python(f"""
        import atexit, sys
        atexit.register(lambda: print({HEAVY}))
        from workbench.launch.cli import main
        main(["run", "--world-size", "2", "--steps", "4", "--strategy", "checkpoint_restart", "--checkpoint-every",
              "2", "--out", {str(tmp_path / "cli")!r}])
        """)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "[]", out.stdout


def test_a_forked_rank_and_its_replacement_import_no_scikit_learn(tmp_path, monkeypatch):
    import workbench

    probe = tmp_path / "modules"
    monkeypatch.setenv("WORKBENCH_TEST_PROBE", str(probe))
    # the run goes on until the replacement has joined (its regrow event), then ends at a step boundary: no step
    # count chosen so that the replacement probably made it in time
    regrown = threading.Event()
    run = workbench.start(world_size=2, steps=1_000_000, model="user_code:probing_model", strategy="shrink",
                          regrow=True, warm_spares=0, faults=["kill:rank=1,step=3"])
    run.subscribe(lambda kind, payload: kind == "event" and payload["kind"] == "regrow" and regrown.set())
    try:
        assert regrown.wait(60) or any(e["kind"] == "regrow" for e in run.events), run.events
        run.finish()
        result = run.wait(60)
    finally:
        if not run.done:
            run.stop()
    assert result.completed and result.summary["world_size_final"] == 2, result.summary
    written = sorted(tmp_path.glob("modules.*"))
    assert len(written) >= 3, written  # two ranks and the replacement
    for path in written:
        assert path.read_text() == "", f"rank {path.suffix[1:]} imported {path.read_text().split()}"


PLANT = sitecustomize('''\
"""Planted by tests/test_slow_paths.py: a regression the speed gate must catch, in every process that starts."""
import os, time

KIND = os.environ["WORKBENCH_PLANT"]
TARGET = {"sklearn": "workbench.rank.main", "fork_delay": "workbench.supervisor.template_server"}[KIND]
DELAY_S = 0.5


def plant(module):
    if KIND == "sklearn":  # a rank start that imports scikit-learn
        main = module.main

        def slow_main(argv):
            started = time.perf_counter()
            import sklearn.datasets  # noqa: F401
            fired(f"{time.perf_counter() - started:.3f}")
            return main(argv)

        module.main = slow_main
    else:  # a delay in the fork path
        fork = module.Server.fork

        def slow_fork(self, request, client):
            time.sleep(DELAY_S)
            fired(f"{DELAY_S}")
            return fork(self, request, client)

        module.Server.fork = slow_fork
''')
FIGURES = "second_run,regrow_join,restart_resume"  # every figure a plant below must make miss
DELAY_S = 0.5  # the planted fork delay


def gate(tmp_path: Path, plant: str | None, figures: str = FIGURES) -> tuple[int, dict[str, dict], list[float]]:
    """``benchmarks/gate.py --only figures`` with the regression ``plant`` in every process (None: the control,
    nothing planted): its exit code, its rows by figure, and the seconds each planted delay took."""
    env = {k: v for k, v in os.environ.items() if k != "WORKBENCH_TEMPLATE"}
    if plant is not None:
        (tmp_path / "sitecustomize.py").write_text(PLANT)
        env.update({"WORKBENCH_PLANT": plant, FIRED_VAR: str(tmp_path / "fired.txt"),
                    "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])})
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gate.py"), "--only", figures, "--no-history"],
                         capture_output=True, text=True, timeout=280, env=env, cwd=ROOT)
    rows = {row["figure"]: row for row in map(json.loads, (line for line in out.stdout.splitlines()
                                                           if line.startswith('{"figure"')))}
    assert "gate: " in out.stderr and "figures within budget" in out.stderr, (out.stdout[-2000:], out.stderr[-2000:])
    fired = tmp_path / "fired.txt"
    delays = [float(line.split()[1]) for line in fired.read_text().splitlines()] if fired.exists() else []
    return out.returncode, rows, delays


@pytest.fixture(scope="module")
def unplanted(tmp_path_factory) -> dict[str, dict]:
    """The control of the plants below, measured once: the same figures without a plant pass the gate."""
    code, rows, _ = gate(tmp_path_factory.mktemp("unplanted"), None)
    assert set(rows) == set(FIGURES.split(",")), rows
    assert code == 0 and all(row["verdict"] == "pass" for row in rows.values()), \
        ("the unplanted control misses: the machine is too busy for the gate's plants to mean anything", rows)
    return rows


def caught(tmp_path: Path, plant: str, figures: list[str], unplanted: dict[str, dict]) -> tuple[dict, list[float]]:
    """The gate with ``plant`` in misses each of ``figures``, where the control passed; how much each planted value
    exceeds the control's, and the planted delays (the fork's sleeps, the imports' seconds)."""
    code, rows, delays = gate(tmp_path, plant, ",".join(figures))
    assert delays, "the plant never fired"
    assert code == 1 and set(rows) == set(figures), (code, rows)
    for name in figures:
        assert rows[name]["verdict"] == "miss" and unplanted[name]["verdict"] == "pass", (rows[name], unplanted[name])
    return {name: rows[name]["value"] - unplanted[name]["value"] for name in figures}, delays


def test_the_gate_fails_on_a_rank_start_that_imports_scikit_learn(tmp_path, unplanted):
    """Each rank start imports scikit-learn (~2 s on the 2-core VM): a second run's ranks start that much later (in
    parallel), the regrow's replacements join later by at least half of it (the join's clock starts as the import
    may be under way), or not before the run ends (a miss too: infinite)."""
    added, imports = caught(tmp_path, "sklearn", ["second_run", "regrow_join"], unplanted)
    assert all(seconds >= min(imports) / 2 for seconds in added.values()), (added, imports)


def test_the_gate_fails_on_a_delay_in_the_fork_path(tmp_path, unplanted):
    """Each fork of a rank sleeps 0.5 s first: a run and a restart start that much later, at least."""
    added, sleeps = caught(tmp_path, "fork_delay", ["second_run", "restart_resume"], unplanted)
    assert set(sleeps) == {DELAY_S} and all(seconds >= DELAY_S for seconds in added.values()), (added, sleeps)


def test_the_docs_gate_table_is_the_newest_run_in_the_history():
    """docs/benchmarks.md's gate table is generated from benchmarks/results/gate_history.jsonl, never by hand."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("gate", ROOT / "benchmarks" / "gate.py")
    gate = importlib.util.module_from_spec(spec)
    sys.modules["gate"] = gate  # its dataclasses look their module up
    try:
        spec.loader.exec_module(gate)
    finally:
        del sys.modules["gate"]
    docs = (ROOT / "docs" / "benchmarks.md").read_text()
    between = docs.split(gate.BEGIN, 1)[1].split(gate.END, 1)[0].strip()
    assert gate.HISTORY.is_file(), "no gate run recorded: run make bench-gate, then benchmarks/gate.py --table"
    assert between == gate.table(gate.HISTORY), "docs/benchmarks.md's gate table is stale: run gate.py --table"
    rows = [json.loads(line) for line in gate.HISTORY.read_text().splitlines() if line.strip()]
    assert {f.name for f in gate.FIGURES} <= {row["figure"] for row in rows}, "a figure was never recorded"
    for row in rows:
        assert {"date", "commit", "machine", "value", "reference", "ratio", "budget", "verdict"} <= set(row), row


def test_the_gates_table_refuses_a_history_it_cannot_read_in_one_line(tmp_path):
    """``--table --history`` on a missing file, a directory or a line that is no record: one line, exit 2."""
    (tmp_path / "bad.jsonl").write_text('{"figure": "x"}\nnot json\n')
    for history, says in ((tmp_path / "missing.jsonl", "cannot be read (No such file or directory)"),
                          (tmp_path, "cannot be read (Is a directory)"),
                          (tmp_path / "bad.jsonl", "line 2 is not a gate record")):
        done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gate.py"), "--table", "--history",
                               str(history)], capture_output=True, text=True, timeout=60, cwd=tmp_path)
        assert done.returncode == 2 and says in done.stderr, done.stderr
        assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr
