"""The ranks' optimizers (workbench/rank/optim.py) against torch.optim: bitwise the same, step after step."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from torch import nn

from workbench.rank.optim import SGD, Adam, make_optimizer


def _model(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(7, 5), nn.Tanh(), nn.Linear(5, 3))


def _train(model: nn.Module, optimizer, steps: int, set_to_none: bool) -> list[torch.Tensor]:  # noqa: ANN001
    generator = torch.Generator().manual_seed(1)
    for _ in range(steps):
        x, y = torch.randn(9, 7, generator=generator), torch.randint(0, 3, (9,), generator=generator)
        optimizer.zero_grad(set_to_none=set_to_none)
        nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
    return [p.detach().clone() for p in model.parameters()]


@pytest.mark.parametrize("kind, ours, theirs", [
    ("sgd", lambda p: SGD(p, lr=0.05, momentum=0.9), lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9)),
    ("sgd0", lambda p: SGD(p, lr=0.05), lambda p: torch.optim.SGD(p, lr=0.05)),
    ("adam", lambda p: Adam(p, lr=0.01), lambda p: torch.optim.Adam(p, lr=0.01)),
])
@pytest.mark.parametrize("set_to_none", [True, False])
def test_bitwise_equal_to_torch_optim(kind: str, ours, theirs, set_to_none: bool) -> None:  # noqa: ANN001
    a, b = _model(0), _model(0)
    opt_a, opt_b = ours(list(a.parameters())), theirs(list(b.parameters()))
    for got, want in zip(_train(a, opt_a, 25, set_to_none), _train(b, opt_b, 25, set_to_none)):
        assert torch.equal(got, want), kind
    for p_a, p_b in zip(a.parameters(), b.parameters()):
        state_a, state_b = opt_a.state[p_a], opt_b.state[p_b]
        assert state_a.keys() == state_b.keys()
        for key in state_a:
            assert torch.equal(torch.as_tensor(state_a[key]), torch.as_tensor(state_b[key])), key


def test_state_dict_round_trip_continues_bitwise() -> None:
    a, b = _model(3), _model(3)
    opt_a = make_optimizer("adam", list(a.parameters()), 0.01, 0.0)
    opt_b = torch.optim.Adam(list(b.parameters()), lr=0.01)
    _train(a, opt_a, 5, True), _train(b, opt_b, 5, True)
    saved = opt_a.state_dict()
    assert sorted(saved["state"]) == [0, 1, 2, 3] and saved["param_groups"][0]["params"] == [0, 1, 2, 3]
    c = _model(99)
    c.load_state_dict(a.state_dict())
    opt_c = Adam(list(c.parameters()), lr=0.5)
    opt_c.load_state_dict(saved)  # state copied, lr taken from the state dict
    assert opt_c.param_groups[0]["lr"] == 0.01
    assert opt_c.state[next(c.parameters())]["exp_avg"].data_ptr() != opt_a.state[next(a.parameters())][
        "exp_avg"].data_ptr()
    for got, want in zip(_train(c, opt_c, 5, True), _train(b, opt_b, 5, True)):
        assert torch.equal(got, want)
    with pytest.raises(ValueError, match="number of parameters"):
        SGD(list(c.parameters())[:2], lr=0.1).load_state_dict(saved)


def test_ranks_optimizers_never_import_dynamo() -> None:
    """The point of the module: stepping and checkpointing the optimizer does not import torch._dynamo."""
    code = ("import sys, torch; from workbench.rank.optim import make_optimizer; "
            "p = torch.nn.Parameter(torch.ones(3)); o = make_optimizer('adam', [p], 0.1, 0.0); "
            "p.grad = torch.ones(3); o.step(); o.load_state_dict(o.state_dict()); o.zero_grad(); "
            "o = make_optimizer('sgd', [p], 0.1, 0.9); p.grad = torch.ones(3); o.step(); "
            "print('torch._dynamo' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "False"


@pytest.mark.parametrize("kind", ["sgd", "sgd0", "adam"])
def test_undoable_steps_are_bitwise_the_plain_ones_and_undo_exactly(kind: str) -> None:
    """Rollback's undoable steps (new values written out of place and swapped in) equal plain steps bit for bit;
    undo() puts back the exact tensors from before the step, the first step's missing history included."""
    make = {"sgd": lambda p: SGD(p, lr=0.05, momentum=0.9), "sgd0": lambda p: SGD(p, lr=0.05),
            "adam": lambda p: Adam(p, lr=0.01)}[kind]
    plain, undoable = _model(5), _model(5)
    opt_plain, opt_undo = make(list(plain.parameters())), make(list(undoable.parameters()))
    generator = torch.Generator().manual_seed(2)
    for step in range(12):
        x, y = torch.randn(9, 7, generator=generator), torch.randint(0, 3, (9,), generator=generator)
        for model, optimizer in ((plain, opt_plain), (undoable, opt_undo)):
            optimizer.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
        before = [p.detach().clone() for p in undoable.parameters()]
        history = {p: {k: v.clone() for k, v in opt_undo.state[p].items()} for p in undoable.parameters()
                   if opt_undo.state.get(p)}
        if step % 3 == 0:  # a step undone, then taken again: undo restores exactly
            opt_undo.step(undoable=True)
            assert not all(torch.equal(a, b) for a, b in zip(before, undoable.parameters()))
            opt_undo.undo()
            for a, b in zip(before, undoable.parameters()):
                assert torch.equal(a, b)
            assert {p for p, s in opt_undo.state.items() if s} == set(history)  # a first step's history is gone
            for p, saved in history.items():
                for key, value in saved.items():
                    assert torch.equal(value, opt_undo.state[p][key]), key
        opt_plain.step()
        opt_undo.step(undoable=True)
        for a, b in zip(plain.parameters(), undoable.parameters()):
            assert torch.equal(a, b), step
    with pytest.raises(RuntimeError, match="not undoable"):
        opt_undo.step()
        opt_undo.undo()


def test_undoable_steps_recycle_two_sets_of_buffers() -> None:
    """In the steady state an undoable step allocates nothing: the tensors of two steps ago are reused."""
    model = _model(1)
    optimizer = SGD(list(model.parameters()), lr=0.05, momentum=0.9)
    seen = []
    for _ in range(6):
        optimizer.zero_grad()
        model(torch.ones(2, 7)).sum().backward()
        optimizer.step(undoable=True)
        seen.append(next(model.parameters()).data_ptr())
    assert seen[2:] == [seen[2], seen[3]] * 2 and seen[2] != seen[3]
