"""The protocols are written once (issue 30, item 3): every message kind sent or dispatched on anywhere is declared
in workbench.base.protocol, every declared kind is sent somewhere, a real run's messages fit the table; every exception
class of the workbench is a WorkbenchError; a rank rebuilds the configuration without re-running its checks."""

import ast
import importlib
import inspect
import json
import sys
from pathlib import Path

import netns
import pytest

import workbench
from workbench.base import checkpoint as ckpt
from workbench.base import protocol
from workbench.base.errors import WorkbenchError
from workbench.base.protocol import CONTROL, TEMPLATE, ProtocolError
from workbench.config.run import RunConfig, config_from_wire
from workbench.supervisor.control import ControlServer

PACKAGE = Path(workbench.__file__).parent
SOURCES = sorted(PACKAGE.rglob("*.py"))
TABLES = {"CONTROL": CONTROL, "TEMPLATE": TEMPLATE}


def _builder(call: ast.Call) -> str | None:
    """Which table a call builds a message of: ``message``/``protocol.message`` (CONTROL), ``TEMPLATE.message``,
    ``CONTROL.message``, and the template owner's ``self._ask(kind, ...)`` (TEMPLATE)."""
    func = call.func
    if isinstance(func, ast.Name) and func.id == "message":
        return "CONTROL"
    if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
        if func.attr == "message":
            return {"protocol": "CONTROL", "CONTROL": "CONTROL", "TEMPLATE": "TEMPLATE"}.get(func.value.id)
        if func.attr == "_ask" and func.value.id == "self":
            return "TEMPLATE"
    return None


def _literals(node: ast.AST) -> list[str]:
    return [n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str)]


def _sent_kinds() -> dict[str, set[tuple[str, str]]]:
    """table -> {(kind, where)} for every literal kind passed to a builder (or to ``serve`` as its error kind)."""
    sent: dict[str, set[tuple[str, str]]] = {"CONTROL": set(), "TEMPLATE": set()}
    for path in SOURCES:
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call):
                continue
            where = f"{path.relative_to(PACKAGE.parent)}:{node.lineno}"
            table = _builder(node)
            if table is not None and node.args:
                kinds = _literals(node.args[0])
                assert kinds or isinstance(node.args[0], ast.Name), f"{where}: a kind that is no literal"
                sent[table] |= {(k, where) for k in kinds}
            elif isinstance(node.func, ast.Name) and node.func.id == "serve" and len(node.args) == 3:
                sent["CONTROL"] |= {(k, where) for k in _literals(node.args[2])}
    return sent


def test_every_kind_sent_is_declared_and_every_declared_kind_is_sent():
    sent = _sent_kinds()
    assert len(sent["CONTROL"]) >= 40 and len(sent["TEMPLATE"]) >= 7  # the scan sees the send sites
    for table, found in sent.items():
        undeclared = sorted(f"{where}: {kind!r}" for kind, where in found if kind not in TABLES[table].kinds)
        assert not undeclared, f"{table}: kinds sent but not declared in workbench/base/protocol.py: {undeclared}"
        unsent = set(TABLES[table].kinds) - {kind for kind, _ in found}
        assert not unsent, f"{table}: declared but sent nowhere: {sorted(unsent)}"


def test_no_message_is_built_by_hand():
    """A dict literal with a "type" key in a module that speaks a protocol is a message that bypasses the table."""
    for path in SOURCES:
        if path.name == "protocol.py" or "workbench.base.protocol" not in path.read_text():
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Dict):
                keys = [k.value for k in node.keys if isinstance(k, ast.Constant)]
                assert "type" not in keys, f"{path.name}:{node.lineno}: a message built without workbench.base.protocol"


def test_receivers_dispatch_on_declared_kinds():
    """In each function that checks a message with ``TABLE.received(m, SENDER)``, every kind it compares ``kind``
    with is one that SENDER sends."""
    receivers = 0
    for path in SOURCES:
        for func in ast.walk(ast.parse(path.read_text())):
            if not isinstance(func, ast.FunctionDef):
                continue
            calls = [n for n in ast.walk(func) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
                     and n.func.attr == "received" and isinstance(n.func.value, ast.Name)]
            for call in calls:
                receivers += 1
                table, sender = TABLES[call.func.value.id], getattr(protocol, call.args[1].id)
                for compare in (n for n in ast.walk(func) if isinstance(n, ast.Compare)):
                    if isinstance(compare.left, ast.Name) and compare.left.id == "kind":
                        for kind in _literals(ast.Tuple(elts=compare.comparators)):
                            assert kind in table.kinds and table.kinds[kind].sender == sender, \
                                f"{path.name}:{compare.lineno}: {func.name}: {kind!r} is no kind a {sender} sends"
    assert receivers == 5  # the supervisor (hello, then the rest), the rank, the template's owner, the template
    from workbench.supervisor.peers.adapters import ADAPTERS  # the supervisor hands a peer's own kinds to its adapter

    for peer, adapter in ADAPTERS.items():
        for kind in adapter.handlers:
            assert CONTROL.kinds[kind].sender == protocol.RANK, f"{peer} handles {kind!r}, which no rank sends"


def test_the_builder_and_the_receiver_refuse_what_the_table_does_not_say():
    assert protocol.message("stop", reason="r") == {"type": "stop", "reason": "r"}
    with pytest.raises(ProtocolError, match="kind 'stpo' is not declared"):
        protocol.message("stpo", reason="r")
    with pytest.raises(ProtocolError, match="'step' lacks gen"):
        protocol.message("step", step=3)
    with pytest.raises(ProtocolError, match="'stop' has no reasno"):
        protocol.message("stop", reason="r", reasno="r")
    assert CONTROL.received({"type": "hb"}, protocol.RANK) == "hb"
    with pytest.raises(ProtocolError, match="a supervisor sent 'hb'"):
        CONTROL.received({"type": "hb"}, protocol.SUPERVISOR)
    with pytest.raises(ProtocolError, match="a rank sent None"):
        CONTROL.received({"kind": "hb"}, protocol.RANK)


def test_the_reference_page_holds_the_tables():
    page = (PACKAGE.parent / "docs" / "reference" / "workbench.base.protocol.md").read_text()
    assert CONTROL.markdown() in page and TEMPLATE.markdown() in page, \
        "docs/reference/workbench.base.protocol.md: paste protocol.CONTROL.markdown() and TEMPLATE.markdown() again"


def test_a_real_run_sends_only_declared_kinds_and_fields(monkeypatch):
    """Both directions, recorded in the supervisor's process: a run with a checkpoint, a caught flip, a kill."""
    seen = []
    received, send = protocol.Protocol.received, ControlServer.send

    def record_received(self, m, sender):
        seen.append((self, sender, dict(m)))
        return received(self, m, sender)

    def record_send(self, worker, sent):
        seen.append((CONTROL, protocol.SUPERVISOR, dict(sent)))
        return send(self, worker, sent)

    monkeypatch.setattr(protocol.Protocol, "received", record_received)
    monkeypatch.setattr(ControlServer, "send", record_send)
    result = workbench.run(world_size=3, steps=40, eval_interval=20, checkpoint_every=20, strategy="shrink",
                           detect=["guard"], hidden=[16], faults=[
                               "flip:target=grad,rank=0,step=10,tensor=fc2.weight,index=3,bit=30",
                               "kill:rank=2,step=25"])
    assert result.completed, result.summary["reason"]
    kinds = set()
    for table, sender, m in seen:
        name = m.pop("type")
        kind = table.kinds[name]
        assert kind.sender == sender
        assert set(kind.fields) <= set(m) <= set(kind.fields) | set(kind.optional), (sender, name, m)
        if table is CONTROL:
            kinds.add(name)
    assert {"hello", "start", "ready", "generation", "joined", "hb", "step", "flip", "detected", "fault",
            "checkpoint", "done", "stop"} <= kinds


# -- errors --------------------------------------------------------------------------------------------------------
def test_every_exception_class_of_the_workbench_is_a_workbench_error():
    """Warnings (ProvenanceWarning) and interrupts (HangUp, a KeyboardInterrupt that no ``except Exception`` may
    swallow) are not errors."""
    names = []
    for path in SOURCES:
        classes = [n.name for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.ClassDef) and n.bases]
        if not classes or path.name == "__main__.py":
            continue
        module = importlib.import_module(".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts))
        for name in classes:
            cls = getattr(module, name, None)
            if inspect.isclass(cls) and issubclass(cls, BaseException) and not issubclass(cls, (Warning,
                                                                                                 KeyboardInterrupt)):
                names.append(name)
                assert issubclass(cls, WorkbenchError), f"{module.__name__}.{name} is not a WorkbenchError"
    assert {"TemplateError", "CommError", "ConfigError", "ProtocolError", "JoinError"} <= set(names)


# -- the configuration on the wire ---------------------------------------------------------------------------------
def _checkpoint(path: Path, steps: int = 20) -> str:
    """A checkpoint of the digits MLP hidden=[16] at step ``steps``, as a run writes it, without running one."""
    from workbench.workloads.models import build_model

    config = RunConfig(world_size=2, steps=40, hidden=[16])
    net = build_model(config, (1, 8, 8), 10)
    state = {k: v.detach().clone() for k, v in net.state_dict().items()}
    ckpt.save(path, ckpt.Checkpoint(steps, state, {}, None, 0, config.to_dict()))
    return str(path)


def test_a_rank_rebuilds_the_configuration_without_its_checks(tmp_path, monkeypatch):
    config = RunConfig(world_size=3, steps=50, hidden=[16], resume=_checkpoint(tmp_path / "c.h5"),
                       faults=["kill:rank=1,step=30", "random:mtbf_steps=20,seed=1"], detect="guard")
    wire = json.loads(json.dumps(config.to_dict()))
    (tmp_path / "c.h5").unlink()  # the checkpoint is on the supervisor's host only

    def no_check(*args):
        raise AssertionError("a rank re-ran a user-facing check")

    monkeypatch.setattr(ckpt, "verify", no_check)
    monkeypatch.setattr(RunConfig, "__post_init__", no_check)
    rebuilt = config_from_wire(wire)
    assert rebuilt == config and rebuilt.faults == config.faults and rebuilt.random_failures == config.random_failures
    with pytest.raises(ProtocolError, match=r"missing \['steps'\], unknown \['stepz'\]"):
        config_from_wire({**{k: v for k, v in wire.items() if k != "steps"}, "stepz": 5})


@pytest.mark.skipif(netns.unavailable() is not None, reason=str(netns.unavailable()))
def test_a_rank_joins_from_a_host_without_the_resume_checkpoint(tmp_path):
    """Acceptance (issue 30): the run resumes from a checkpoint that only the supervisor's host has (the second
    namespace mounts an empty directory over it); rank 1 joins from there, rank 0 (the source) reads it."""
    held = tmp_path / "held"
    held.mkdir()
    resume = _checkpoint(held / "c.h5", steps=20)
    with netns.two_hosts() as (a, b):
        port = 29500
        rank = f"{sys.executable} -m workbench rank --store {a.address}:{port} --rank-hint 1"
        hide = f"mount -t tmpfs none {held} && test ! -e {resume}"  # this host has no such checkpoint
        summary, (code,), (remote_err,) = netns.run_over_two_hosts(
            a, tmp_path, f"{a.address} 1\n{b.address} 1\n", port,
            ["--steps", "30", "--hidden", "16", "--eval-interval", "10", "--resume", resume],
            [b.command("sh", "-c", f"{hide} && exec {rank}")])
    assert code == 0, remote_err[-2000:]
    assert summary["outcome"] == "completed" and summary["steps_completed"] == 30
    result = workbench.RunResult.load(summary["result_path"])
    assert result.metrics[0]["step"] == 20  # resumed from the checkpoint
    assert any(e["kind"] == "host" and e["detail"] == f"rank 1 joined from {b.address}" for e in result.events)
