import json
import subprocess
import sys

import h5py
import numpy as np
import pytest
import torch

from workbench.base import checkpoint
from workbench.faults.bitflip import FlipError, bit_field, field_bits, flip, inject, replay
from workbench.faults.hdf5 import alter_checkpoint, compare_checkpoints, replay_checkpoint


@pytest.mark.parametrize("bit,expected", [(30, 1.7014118e38), (23, 1.0), (22, 0.75), (31, -0.5),
                                          (0, np.nextafter(np.float32(0.5), np.float32(1)))])
def test_fp32_flips_are_exact_ieee(bit, expected):
    x = np.array([0.5], dtype=np.float32)
    record = flip(x, 0, bit)
    assert x[0] == np.float32(expected) and record.old == 0.5 and record.bits == (bit,)


@pytest.mark.parametrize("dtype,sign,exponent,mantissa", [
    (torch.float64, 63, range(52, 63), range(0, 52)), (torch.float32, 31, range(23, 31), range(0, 23)),
    (torch.float16, 15, range(10, 15), range(0, 10)), (torch.bfloat16, 15, range(7, 15), range(0, 7))])
def test_fields_of_every_float_type(dtype, sign, exponent, mantissa):
    assert bit_field(dtype, sign) == "sign"
    assert field_bits(dtype, "exponent") == list(exponent) and field_bits(dtype, "mantissa") == list(mantissa)


# 1 with its bit 0 (bit 1 for the integer) flipped, exactly: 1 + one unit in the last place of each float type
ONE_FLIPPED = [(torch.float64, 0, 1 + 2.0**-52), (torch.float16, 0, 1 + 2.0**-10), (torch.bfloat16, 0, 1 + 2.0**-7),
               (torch.int32, 1, 3)]
_INT_VIEW = {torch.float64: torch.int64, torch.float16: torch.int16, torch.bfloat16: torch.int16,
             torch.int32: torch.int32}


def check_flips_of_one(flip_fn) -> None:
    """``flip_fn`` (:func:`flip`'s signature) flips exactly the bit it names of exactly the element it names, in
    place: the value is the exact IEEE one and the raw words differ from 1's by that bit alone."""
    for dtype, bit, expected in ONE_FLIPPED:
        t = torch.ones(3, dtype=dtype)
        record = flip_fn(t, 1, bit)
        assert t[1].item() == expected and t[0].item() == 1 and t[2].item() == 1, (dtype, t)
        words = t.view(_INT_VIEW[dtype]).tolist()
        one = torch.ones(1, dtype=dtype).view(_INT_VIEW[dtype]).item()
        assert words == [one, one ^ (1 << bit), one], (dtype, words)
        assert record.old == 1 and record.new == expected and record.index == 1
    h = torch.tensor([1.0], dtype=torch.float16)
    flip_fn(h, 0, 14)
    assert torch.isinf(h).item()  # float16 exponent all ones


def test_torch_tensors_flip_in_place_all_widths():
    check_flips_of_one(flip)


def test_a_flip_of_the_neighbouring_bit_is_caught(monkeypatch):
    """The planted break for the check above: a flip that lands one bit too high still changes the value (the
    old check, ``t[1] != 1``, passed it); the exact values and words do not."""
    from workbench.faults import bitflip

    real = bitflip.apply_masks
    monkeypatch.setattr(bitflip, "apply_masks", lambda x, indices, masks, target="": real(
        x, indices, [m << 1 for m in masks], target))
    with pytest.raises(AssertionError):
        check_flips_of_one(bitflip.flip)


@pytest.mark.parametrize("call,needle", [
    (lambda: flip(np.zeros(2, np.float32), 0, 32), "bit 32 is out of range for float32: allowed 0..31"),
    (lambda: flip(np.zeros(2, np.float32), 5, 1), "index 5 is out of range"),
    (lambda: flip(np.zeros(2, np.complex64), 0, 1), "dtype complex64 cannot be flipped"),
    (lambda: inject(np.zeros(4), count=2, probability=0.1), "exactly one of count or probability"),
    (lambda: inject(np.zeros(4, np.float32), count=1, bits=(20, 40)), "bit 32 is out of range"),
])
def test_bad_input_is_refused_clearly(call, needle):
    with pytest.raises(FlipError, match=needle):
        call()


def test_random_injection_is_seeded_and_replays_exactly():
    a = np.ones(10_000, dtype=np.float32)
    log = inject(a, count=50, field="exponent", burst=2, seed=7, target="w")
    assert len({e.index for e in log}) == 50
    assert all(e.bits and all(23 <= b <= 31 for b in e.bits) and len(e.bits) <= 2 for e in log)
    b = np.ones(10_000, dtype=np.float32)
    replay([e.to_dict() for e in log], {"w": b})
    assert np.array_equal(a.view(np.uint32), b.view(np.uint32))
    c = np.ones(10_000, dtype=np.float32)
    assert [e.index for e in inject(c, count=50, field="exponent", burst=2, seed=7)] == [e.index for e in log]
    p = inject(np.zeros(100_000), probability=0.01, xor_mask=0b101, seed=1)
    assert 800 < len(p) < 1200 and all(e.mask == 5 for e in p)


def make_checkpoint(path, chunked=False):
    ckpt = checkpoint.Checkpoint(3, {"fc1.weight": torch.full((8, 4), 0.5), "fc1.bias": torch.full((8,), 0.5)}, {})
    checkpoint.save(path, ckpt)
    if chunked:  # rewrite one dataset chunked and compressed: the read-modify-write path
        with h5py.File(path, "r+") as f:
            data, attrs = f["model/fc1.weight"][()], dict(f["model/fc1.weight"].attrs)
            del f["model/fc1.weight"]
            f.create_dataset("model/fc1.weight", data=data, chunks=(4, 4), compression="gzip").attrs.update(attrs)
    return path


@pytest.mark.parametrize("chunked", [False, True])
def test_checkpoint_alteration_exact_and_detected(tmp_path, chunked):
    src = make_checkpoint(tmp_path / "a.h5", chunked)
    (f,) = alter_checkpoint(src, datasets=["model/fc1.weight"], index=5, bit=30, out=tmp_path / "b.h5")
    with h5py.File(tmp_path / "b.h5") as h:
        assert h["model/fc1.weight"][()].reshape(-1)[5] == np.float32(1.7014118e38)
    assert checkpoint.verify(src) == [] and checkpoint.verify(tmp_path / "b.h5") == ["model/fc1.weight"]
    rows = {r["dataset"]: r for r in compare_checkpoints(src, tmp_path / "b.h5")}
    assert rows["model/fc1.weight"]["changed"] == 1 and rows["model/fc1.bias"]["changed"] == 0
    copy = make_checkpoint(tmp_path / "c.h5", chunked)
    replay_checkpoint(copy, [f])
    assert compare_checkpoints(copy, tmp_path / "b.h5")[0]["changed"] == 0


def test_random_alteration_spreads_over_datasets(tmp_path):
    src = make_checkpoint(tmp_path / "a.h5")
    log = alter_checkpoint(src, count=20, bits=(0, 22), seed=2)
    assert len(log) == 20 and {e.target for e in log} == {"model/fc1.weight", "model/fc1.bias"}
    with pytest.raises(FlipError, match="not a float dataset"):
        alter_checkpoint(src, datasets=["model/nope"], count=1)


def cli(*args):
    return subprocess.run([sys.executable, "-m", "workbench", *args], capture_output=True, text=True, timeout=120)


def test_flip_verify_compare_cli(tmp_path):
    src = make_checkpoint(tmp_path / "a.h5")
    out = tmp_path / "b.h5"
    proc = cli("flip", str(src), "--dataset", "model/fc1.weight", "--index", "0", "--bit", "23", "--out", str(out),
               "--log", str(tmp_path / "log.jsonl"))
    assert proc.returncode == 0 and "0.5 -> 1.0" in proc.stdout
    assert json.loads((tmp_path / "log.jsonl").read_text())["bits"] == [23]
    verify = cli("verify", str(out))
    assert verify.returncode == 1 and "model/fc1.weight" in verify.stdout
    assert cli("verify", str(src)).returncode == 0
    compare = cli("compare", str(src), str(out))
    assert "total: 1 values changed" in compare.stdout
    random = cli("flip", str(src), "--count", "3", "--bits", "23-30", "--seed", "1", "--dataset", "model/fc1.bias")
    assert random.returncode == 0 and "3 flips" in random.stdout
    bad = cli("flip", str(src), "--dataset", "model/fc1.weight", "--index", "0", "--bit", "99")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "allowed 0..31" in bad.stderr
