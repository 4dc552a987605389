"""The run's event kinds are declared once (workbench/faults/events.py), each with its fields: the recorder
checks each event against its kind, every kind written anywhere is declared, no event kind is compared by its name
outside the declaration, no reader matches an event's text (they read its fields), figures mark events as their
kinds' markers say, a fault's event says where it came from, the docs' table is the code's, and a result written
before events carried their fields is read as such."""

from __future__ import annotations

import ast
import json
import time
from pathlib import Path

import h5py
import pytest
from structure_tool import comparisons

import workbench
from workbench.base import fallbacks
from workbench.base.errors import ResultsError
from workbench.campaigns.reproduce import common
from workbench.config.run import RunConfig
from workbench.faults import events
from workbench.faults import kinds as fault_kinds
from workbench.faults.events import EventError, EventKind
from workbench.launch.lab import Lab
from workbench.launch.sweeps.requeue import continued
from workbench.results import plots
from workbench.results.rank_strip import rank_strip
from workbench.results.run_result import RunResult
from workbench.supervisor.recorder import Recorder

ROOT = Path(__file__).resolve().parents[1]
ROOM = {ROOT / "workbench" / "supervisor" / "events.py"}
WRITERS = {"event", "_event", "row", "Note"}  # Recorder.event/_event, events.row, a membership Note's kind
# a matching reader: an event's ``detail`` compared, searched by a str method or handed to ``re``
STR_METHODS = {"startswith", "endswith", "split", "rsplit", "partition", "rpartition", "find", "rfind", "index",
               "count", "replace", "strip", "lstrip", "rstrip", "lower", "upper", "casefold", "splitlines",
               "removeprefix", "removesuffix"}


def test_every_kind_is_one_frozen_object_with_its_fields():
    assert len(events.REGISTRY) >= 47 and events.NAMES == tuple(events.REGISTRY)
    assert list(events.FAULTS) == list(fault_kinds.REGISTRY)  # a fault that fired: one event kind per fault kind
    for name, kind in events.REGISTRY.items():
        assert events.get(name) is kind and kind.name == name and kind.meaning
        assert kind.fields, f"{name} declares no fields"
        assert not set(kind.fields) & set(events.COLUMNS) and not set(kind.fields) & set(kind.optional)
        assert kind.fault == (name in events.FAULTS) and (kind.fields[0] == "source") == kind.fault
        with pytest.raises(AttributeError):
            kind.name = "other"  # frozen
    assert events.GENERATION.fields == ("gen", "members", "recovery") and events.JOINED.optional == ("gpu_wait_s",)
    with pytest.raises(EventError, match="event kind 'nope' is not declared"):
        events.get("nope")


def test_a_kind_without_fields_or_a_fault_without_its_source_cannot_be_declared():
    with pytest.raises(EventError, match="'planted' declares no fields of its own"):
        EventKind("planted", "a kind that declares nothing", ())
    with pytest.raises(EventError, match="'planted' declares no fields of its own, or a column"):
        EventKind("planted", "a kind that declares a column", ("step",))
    with pytest.raises(EventError, match="'planted' is a fault's: its first field is its source"):
        EventKind("planted", "a fault without its source", ("rank_hint",), fault=True)


def test_the_recorder_refuses_an_undeclared_kind_or_fields():
    recorder = Recorder(RunConfig(world_size=2))
    try:
        recorder.event("checkpoint", 3, "a path", path="a.h5", stall_s=0.0, write_s=0.1)
        recorder.event(events.JOINED, 3, "synced", rank=1, gen=0, sync_s=0.1, bytes_in=5)
        recorder.event("joined", 3, "synced", rank=1, gen=0, sync_s=0.1, bytes_in=5, gpu_wait_s=0.1)
        recorder.event(events.KILL, 3, "live fault", rank=1, source=events.LIVE)
        with pytest.raises(EventError, match="event kind 'checkpiont' is not declared"):
            recorder.event("checkpiont", 3, "a path")
        with pytest.raises(EventError, match="'checkpoint': missing field.s. path, stall_s, write_s"):
            recorder.event("checkpoint", 3, "a path")  # the text alone: refused
        with pytest.raises(EventError, match="'joined': missing field.s. bytes_in"):
            recorder.event("joined", 3, "synced", gen=0, sync_s=0.1)
        with pytest.raises(EventError, match="'failure': undeclared field.s. gen"):
            recorder.event("failure", 3, "rank 1 killed", rank=1, cause="killed", world_after=1, gen=0)
        with pytest.raises(EventError, match="'kill': missing field.s. source"):
            recorder.event("kill", 3, "planned fault fired", rank=1)
        with pytest.raises(EventError, match="'kill': source='planed' .allowed: planned, live, job, signal."):
            recorder.event("kill", 3, "planned fault fired", rank=1, source="planed")
        assert [e["kind"] for e in recorder.events] == ["checkpoint", "joined", "joined", "kill"]
        assert list(recorder.events[0]) == [*events.COLUMNS, "path", "stall_s", "write_s"]
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
    assert len(written) > 20
    undeclared = [f"{where}: {kind!r}" for where, kind in written if kind not in events.REGISTRY]
    assert undeclared == [], "declare them in workbench/faults/events.py"


def _kind_comparisons(path: Path, root: Path = ROOT) -> list[str]:
    return comparisons("an event kind", path, root)  # tools/check_structure.py's rule, run on one file


def test_no_event_kind_is_compared_outside_the_declaration():
    files = [p for p in sorted((ROOT / "workbench").rglob("*.py")) if p not in ROOM]
    assert len(files) > 50
    offenders = [hit for path in files for hit in _kind_comparisons(path)]
    assert offenders == [], "select rows with workbench.faults.events.of / kind_is and the declared objects"


def test_the_scan_finds_a_planted_comparison(tmp_path):
    planted = tmp_path / "planted.py"
    planted.write_text('def f(e, kinds, d, kind, m):\n    a = e["kind"] == "generation", "detected" in kinds\n'
                       '    b = d.kind == "restart", e.get("kind") in ("joined", "end")\n'
                       '    return kind == "joined", m["type"] == "checkpoint", kind == "store"\n')
    hits = _kind_comparisons(planted, tmp_path)
    assert len(hits) == 5 and not any('kind == "joined"' in hit or "type" in hit for hit in hits)


def _reads_detail(node: ast.AST) -> bool:
    """``x["detail"]`` or ``x.get("detail", ...)``."""
    if isinstance(node, ast.Subscript):
        return isinstance(node.slice, ast.Constant) and node.slice.value == "detail"
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get"
            and bool(node.args) and isinstance(node.args[0], ast.Constant) and node.args[0].value == "detail")


def _text_matches(path: Path, root: Path = ROOT) -> list[str]:
    """Every place in ``path`` that matches a ``detail`` text: compares it, searches it with a str method, or hands
    it to ``re``, as ``path:LINE: source``."""
    source = path.read_text()
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            hit = any(_reads_detail(side) for side in [node.left, *node.comparators])
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            hit = (node.func.attr in STR_METHODS and _reads_detail(node.func.value)) or (
                isinstance(node.func.value, ast.Name) and node.func.value.id == "re"
                and any(_reads_detail(a) for a in node.args))
        else:
            hit = False
        if hit:
            found.append(f"{path.relative_to(root)}:{node.lineno}: {ast.get_source_segment(source, node)}")
    return found


def test_no_reader_matches_an_events_text():
    """The library, the benchmarks and the tools read fields (the tests may read the prose: it is for people)."""
    files = [p for where in ("workbench", "benchmarks", "tools") for p in sorted((ROOT / where).rglob("*.py"))
             if p not in ROOM]
    assert len(files) > 150
    offenders = [hit for path in files for hit in _text_matches(path)]
    assert offenders == [], "read the event's declared fields (workbench/faults/events.py), not its detail"


def test_the_text_scan_finds_planted_readers(tmp_path):
    planted = tmp_path / "planted.py"
    planted.write_text('import re\n\n\ndef f(result, e, c):\n'
                       '    a = sum(e.get("detail") == "planned fault fired" for e in result.events)\n'
                       '    b = "shrink" in e["detail"], e["detail"].startswith("generation 1:")\n'
                       '    d = re.search(r"ranks \\[(.*)\\]", e["detail"])\n'
                       '    return a, b, d, f"{e[\'kind\']}: {e[\'detail\']}", c.detail == "x"\n')
    hits = _text_matches(planted, tmp_path)
    assert len(hits) == 4 and not any("f\"{" in hit or "c.detail" in hit for hit in hits), hits


# -- markers: the kinds' own -------------------------------------------------------------------------------------
def _fault_run() -> RunResult:
    rows = [events.row(0.0, events.GENERATION, 0, "generation 0: ranks [0, 1, 2]", gen=0, members=[0, 1, 2],
                       recovery=None),
            events.row(0.5, events.SLOW, 2, "rank 2 runs 3x slower", rank=2, source=events.PLANNED, factor=3.0),
            events.row(0.9, events.KILL, 4, "planned fault fired", rank=1, source=events.PLANNED),
            events.row(1.0, events.FAILURE, 4, "rank 1 died (SIGKILL)", rank=1, cause="died (SIGKILL)",
                       world_after=2),
            events.row(1.2, events.STRAGGLER, 6, "rank 2 is a straggler", rank=2, own_s=0.03, others_s=0.01,
                       dropped=False),
            events.row(1.5, events.GENERATION, 5, "generation 1: ranks [0, 2] (shrink)", gen=1, members=[0, 2],
                       recovery="shrink")]
    metrics = [{"step": s, "time": 0.1 * s, "loss": 1.0, "test_acc": float("nan"), "world_size": 3 if s < 5 else 2,
                "generation": 0 if s < 5 else 1}
               for s in range(8)]
    summary = {"world_size_initial": 3, "steps_completed": 8, "outcome": "completed"}
    return RunResult({"strategy": "shrink"}, metrics, rows, [{"rank": 1, "step": 4, "cause": "killed"}], summary,
                     rank_steps={"step": [6, 6], "rank": [0, 2], "cpu_s": [0.01, 0.03]})


def test_figures_mark_events_as_their_kinds_say():
    result = _fault_run()
    traces = {t.name: t for t in plots.training_curve(result).data}
    for kind in (events.KILL, events.SLOW, events.FAILURE, events.GENERATION, events.STRAGGLER):
        assert kind.marker.curve and traces[kind.name].marker.symbol == kind.marker.symbol
        assert traces[kind.name].marker.color == kind.marker.colour
    assert "rank 1: planned fault fired" in traces["kill"].hovertext
    strip = {t.name: t for t in rank_strip(result).data if t.name}
    assert strip["slow"].marker.symbol == events.SLOW.marker.symbol == "triangle-down"
    timeline = {t.name: t for t in plots.membership_timeline({"run": result}).data}
    assert timeline["run: failure"].marker.symbol == events.FAILURE.marker.symbol
    # a fault kind's marker is its fault's; none is lent to what the run did about it
    faults = {(k.marker.symbol, k.marker.colour) for k in events.FAULTS.values()}
    assert not faults & {(k.marker.symbol, k.marker.colour) for k in events.OWN.values() if k.marker}


def test_the_lab_marks_the_kinds_marked_live():
    lab = Lab(world_size=2, steps=10)
    try:
        shown = {t.name: t for t in lab.figure.data[3:]}
        assert list(shown) == [k.name for k in events.marked(live=True)]
        assert all(shown[k.name].marker.symbol == k.marker.symbol for k in events.marked(live=True))
        assert "flip" in shown and "detected" in shown and "restart" not in shown  # the lab's own choice
    finally:
        lab.close()


def test_the_recovery_timeline_reads_a_generations_members_from_its_fields():
    """The lanes come from the ``generation`` event's ``gen``/``members``; its prose is not read (here it lies)."""
    rows = [events.row(0.0, events.GENERATION, 0, "generation 0: ranks [0, 1, 2]", gen=0, members=[0, 1, 2],
                       recovery=None),
            events.row(1.0, "failure", 4, "rank 1 killed", rank=1, cause="killed", world_after=2),
            events.row(1.5, events.GENERATION, 5, "prose no figure reads", gen=1, members=[0, 2], recovery="shrink")]
    summary = {"world_size_initial": 3, "steps_completed": 10}
    failures = [{"rank": 1, "step": 4, "cause": "killed"}]
    fig = plots.recovery_timeline(RunResult({}, [], rows, failures, summary))
    dead = [t for t in fig.data if t.name == "dead"]
    assert dead and list(dead[0].y)[0] == 1 and list(dead[0].x)[0] == 5


def test_the_reference_page_holds_the_table():
    page = (ROOT / "docs" / "reference" / "workbench.faults.events.md").read_text()
    assert events.markdown() in page, \
        "docs/reference/workbench.faults.events.md: paste workbench.faults.events.markdown() again"


# -- a fault's source ---------------------------------------------------------------------------------------------
def test_a_faults_event_says_whether_it_was_planned_or_live(tmp_path):
    """A planned kill at a step and a live one: each kill event says its source, the failures their causes; the
    campaigns count the planned one only, and a run that lost a rank to the live kill is not replayed."""
    run = workbench.start({"world_size": 4, "steps": 400, "hidden": [16], "strategy": "shrink", "eval_interval": 400,
                           "faults": ["kill:rank=3,step=3"]})
    try:
        deadline = time.monotonic() + 60
        while run.status.get("world_size") != 3 or run.status.get("step", 0) < 6:
            assert time.monotonic() < deadline and not run.done, run.status
            time.sleep(0.05)
        run.kill(1)
    finally:
        result = run.wait(120)
    assert result.completed, result.summary["reason"]
    kills = events.of(result.events, events.KILL)
    assert [(e["rank"], e["source"]) for e in kills] == [(3, events.PLANNED), (1, events.LIVE)]
    assert [e["rank"] for e in events.fired(result.events, events.LIVE)] == [1]
    assert {e["rank"]: e["world_after"] for e in events.of(result.events, events.FAILURE)} == {3: 3, 1: 2}
    assert all(set(events.get(e["kind"]).fields) <= set(e) for e in result.events)
    assert common.planned_losses(result) == 1 and not common.reusable(result)


# -- results written before events carried their fields ------------------------------------------------------------
def _older(result: RunResult, directory: Path) -> Path:
    """``result`` saved as the workbench wrote it before events carried fields: layout format 1, rows without them."""
    path = result.save(directory)
    with h5py.File(path, "r+") as f:
        f.attrs["format"] = 1
        rows = [{k: e[k] for k in events.COLUMNS} for e in result.events]
        del f["events"]
        f.create_dataset("events", data=[json.dumps(e) for e in rows], dtype=h5py.string_dtype())
    return path


def test_an_older_result_is_read_as_one_and_never_mis_read(tmp_path):
    older = RunResult.load(_older(_fault_run(), tmp_path / "old"))
    assert older.format == 1 and not older.events_have_fields and "source" not in older.events[2]
    assert {t.name for t in plots.training_curve(older).data} >= {"kill", "failure"}  # markers need no fields
    with pytest.raises(ResultsError, match=r"old/result.h5 was written before run events carried their fields "
                                           r"\(result format 1\): counting the planned faults that fired reads "
                                           r"them; run it again$"):
        common.planned_losses(older)
    assert not common.reusable(older)  # a campaign runs it again
    assert not continued(older, _fault_run()).events_have_fields  # a record continued from it says so too
    again = RunResult.load(older.save(tmp_path / "again"))
    assert again.format == 1  # saved again, it stays what it is
    fresh = RunResult.load(_fault_run().save(tmp_path / "new"))
    assert fresh.format == 2 and fresh.fielded_events("a test") == fresh.events and common.planned_losses(fresh) == 1
