"""Issue 45, item 2: the run's event kinds are declared once (workbench/supervisor/events.py): the recorder checks
each event against its kind, every kind written anywhere is declared, no event kind is compared by its name
outside the declaration, figures read a generation's members from its fields, and the docs' table is the code's."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from structure_tool import comparisons

from workbench.config.run import RunConfig
from workbench.faults import kinds as fault_kinds
from workbench.launch import lab as widgets
from workbench.rank import protocol
from workbench.results import fallbacks, plots
from workbench.results.run_result import RunResult
from workbench.supervisor import events
from workbench.supervisor.events import EventError
from workbench.supervisor.recorder import Recorder

ROOT = Path(__file__).resolve().parents[1]
ROOM = {ROOT / "workbench" / "supervisor" / "events.py"}
# the fault kinds' events are compared through their fault kinds (tests/test_fault_kinds.py scans those names)
NAMES = set(events.OWN)
# a bare ``kind`` compared with a message's name is the protocol's dispatch (``kind = m["type"]``)
MESSAGES = {*protocol.CONTROL_KINDS, *protocol.TEMPLATE_KINDS}
WRITERS = {"event", "_event", "row", "Note"}  # Recorder.event/_event, events.row, a membership Note's kind


def test_every_kind_is_one_frozen_object_looked_up_once():
    assert len(events.REGISTRY) >= 40 and events.NAMES == tuple(events.REGISTRY)
    assert set(fault_kinds.REGISTRY) <= set(events.REGISTRY)  # a fault that fired is its kind's event
    for name, kind in events.REGISTRY.items():
        assert events.get(name) is kind and kind.name == name and kind.meaning
        assert not set(kind.fields) & set(events.COLUMNS) and not set(kind.fields) & set(kind.optional)
        with pytest.raises(AttributeError):
            kind.name = "other"  # frozen
    assert events.GENERATION.fields == ("gen", "members") and events.JOINED.optional == ("gpu_wait_s",)
    with pytest.raises(EventError, match="event kind 'nope' is not declared"):
        events.get("nope")


def test_the_recorder_refuses_an_undeclared_kind_or_fields():
    recorder = Recorder(RunConfig(world_size=2))
    try:
        recorder.event("checkpoint", 3, "a path")
        recorder.event(events.JOINED, 3, "synced", rank=1, gen=0, bytes_in=5)
        recorder.event("joined", 3, "synced", rank=1, gen=0, bytes_in=5, gpu_wait_s=0.1)
        with pytest.raises(EventError, match="event kind 'checkpiont' is not declared"):
            recorder.event("checkpiont", 3, "a path")
        with pytest.raises(EventError, match="'joined': missing field.s. bytes_in"):
            recorder.event("joined", 3, "synced", gen=0)
        with pytest.raises(EventError, match="'failure': undeclared field.s. gen"):
            recorder.event("failure", 3, "rank 1 killed", rank=1, gen=0)
        assert [e["kind"] for e in recorder.events] == ["checkpoint", "joined", "joined"]
        assert list(recorder.events[0]) == list(events.COLUMNS)
        assert recorder.count(events.JOINED) == 2 and recorder.count("checkpoint") == 1
    finally:
        fallbacks.forget(recorder)


def _written(path: Path, root: Path = ROOT) -> list[tuple[str, str]]:
    """(where, kind) for every event kind written as a literal: ``.event("k", ...)``, ``Note("k", ...)``, ..."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call) and node.args:
            func = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None)
            first = node.args[1] if func == "row" and len(node.args) > 1 else node.args[0]
            if func in WRITERS and isinstance(first, ast.Constant) and isinstance(first.value, str):
                found.append((f"{path.relative_to(root)}:{node.lineno}", first.value))
    return found


def test_every_kind_written_anywhere_is_declared():
    written = [hit for path in sorted((ROOT / "workbench").rglob("*.py")) for hit in _written(path)]
    assert len(written) > 30
    undeclared = [f"{where}: {kind!r}" for where, kind in written if kind not in events.REGISTRY]
    assert undeclared == [], "declare them in workbench/supervisor/events.py"


def _kind_comparisons(path: Path, root: Path = ROOT) -> list[str]:
    return comparisons("an event kind", path, root)  # tools/check_structure.py's rule, run on one file


def test_no_event_kind_is_compared_outside_the_declaration():
    files = [p for p in sorted((ROOT / "workbench").rglob("*.py")) if p not in ROOM]
    assert len(files) > 50
    offenders = [hit for path in files for hit in _kind_comparisons(path)]
    assert offenders == [], "select rows with workbench.supervisor.events.of / kind_is and the declared objects"


def test_the_scan_finds_a_planted_comparison(tmp_path):
    planted = tmp_path / "planted.py"
    planted.write_text('def f(e, kinds, d, kind, m):\n    a = e["kind"] == "generation", "detected" in kinds\n'
                       '    b = d.kind == "restart", e.get("kind") in ("joined", "end")\n'
                       '    return kind == "joined", m["type"] == "checkpoint", kind == "store"\n')
    hits = _kind_comparisons(planted, tmp_path)
    assert len(hits) == 5 and not any('kind == "joined"' in hit or "type" in hit for hit in hits)


def test_every_marked_kind_is_declared():
    marked = {*plots.FAULT_MARKERS, *widgets.MARKED, *widgets.MARKER_STYLE}
    assert marked <= set(events.REGISTRY), marked - set(events.REGISTRY)


def test_the_recovery_timeline_reads_a_generations_members_from_its_fields():
    """The lanes come from the ``generation`` event's ``gen``/``members``; its prose is not read (here it lies)."""
    rows = [events.row(0.0, events.GENERATION, 0, "generation 0: ranks [0, 1, 2]", gen=0, members=[0, 1, 2]),
            events.row(1.0, "failure", 4, "rank 1 killed", rank=1),
            events.row(1.5, events.GENERATION, 5, "prose no figure reads", gen=1, members=[0, 2])]
    summary = {"world_size_initial": 3, "steps_completed": 10}
    failures = [{"rank": 1, "step": 4, "cause": "killed"}]
    fig = plots.recovery_timeline(RunResult({}, [], rows, failures, summary))
    dead = [t for t in fig.data if t.name == "dead"]
    assert dead and list(dead[0].y)[0] == 1 and list(dead[0].x)[0] == 5


def test_the_reference_page_holds_the_table():
    page = (ROOT / "docs" / "reference" / "workbench.supervisor.events.md").read_text()
    assert events.markdown() in page, \
        "docs/reference/workbench.supervisor.events.md: paste workbench.supervisor.events.markdown() again"
