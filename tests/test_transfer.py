"""The state digest that decides who receives state at a generation change (workbench/rank/transfer.py)."""

from __future__ import annotations

import torch

from workbench.rank.transfer import digest


def _state() -> list[tuple[str, torch.Tensor]]:
    torch.manual_seed(0)
    return [("model/w", torch.randn(5)), ("model/h", torch.randn(3).half()), ("optim/step", torch.tensor(7)),
            ("model/empty", torch.empty(0)), ("model/d", torch.randn(2, dtype=torch.float64))]


def test_equal_states_give_equal_digests_and_order_names_and_shapes_count() -> None:
    a, b = _state(), [(n, t.clone()) for n, t in _state()]
    assert digest(a) == digest(b)
    assert digest(a) != digest(a[::-1])
    assert digest(a) != digest([("model/v", a[0][1]), *a[1:]])
    assert digest(a) != digest([("model/w", a[0][1].reshape(1, 5)), *a[1:]])


def test_every_single_bit_flip_changes_the_digest() -> None:
    state = _state()
    base = digest(state)
    flips = 0
    for _, tensor in state:
        raw = tensor.view(-1).view(torch.uint8) if tensor.numel() else tensor
        for byte in range(raw.numel()):
            for bit in range(8):
                raw[byte] ^= 1 << bit
                assert digest(state) != base, (byte, bit)
                raw[byte] ^= 1 << bit
                flips += 1
    assert digest(state) == base
    assert flips == 8 * (5 * 4 + 3 * 2 + 8 + 2 * 8)
