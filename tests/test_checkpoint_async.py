"""Checkpoints copied in the background (workbench.rank.staging): the file holds exactly the state of its step,
although the next steps run (and update the parameters bucket by bucket) while the writer copies it.

The in-process tests drive a real data-parallel Trainer (one rank, gloo over a HashStore) and hold the writer's
copy of each part until the training thread waits for that part: a change of the state that did not wait first
would land in the checkpoint, and the comparison with the state taken synchronously would fail.
"""

import threading

import h5py
import numpy as np
import pytest
import torch
import torch.distributed as dist

import workbench
from workbench.base import checkpoint as ckpt
from workbench.config.run import RunConfig
from workbench.rank import staging
from workbench.rank.replicated import Trainer

EVERY = 3
GATE_S = 10.0  # how long a held part waits for the training thread (a test that fails ends after this, not hangs)


class FakeChannel:
    latest_generation = None
    local_address = "127.0.0.1"
    waiting, ops = False, 0  # the heartbeat's clues, kept by Comm.wait
    throttle = pause = None  # a live slow-down, a step boundary: none here

    def __init__(self):
        self.wake = threading.Event()
        self.live_faults = []
        self.sent = []

    def end(self, steps):  # the step the run ends at: no run.finish here
        return steps

    def send(self, message):
        self.sent.append(message)


@pytest.fixture
def held_copies(monkeypatch):
    """Every checkpoint staged in the background (none copied inline), each part's copy held until the training
    thread waits for it (or a later part); the parts that waited in vain are listed."""
    missed = []
    copy_part = staging.Staged._copy_part

    def held(self, index, cache):
        with self._lock:
            if not self._lock.wait_for(lambda: self.waiting_for is not None and self.waiting_for >= index, GATE_S):
                missed.append(index)
        copy_part(self, index, cache)

    monkeypatch.setattr(staging, "INLINE_BYTES", 0)
    monkeypatch.setattr(staging.Staged, "_copy_part", held)
    return missed


def trainer_for(tmp_path, faults=(), **overrides):
    settings = {"world_size": 1, "steps": 100, "strategy": "checkpoint_restart", "checkpoint_every": EVERY,
                "hidden": [32, 16], "buckets": 3, "eval_interval": 100, "batch_size": 16, "momentum": 0.9,
                **overrides}
    trainer = Trainer(RunConfig(**settings), FakeChannel(), dist.HashStore(), tmp_path)
    trainer.join({"gen": 0, "rank": 0, "size": 1, "source": 0, "faults": list(faults)})
    return trainer


def synchronous_file(trainer, path):
    """The checkpoint of the trainer's present state as the synchronous path writes it (everything cloned now)."""
    model, optimizer = trainer.checkpoint_state()
    return ckpt.save(path, ckpt.Checkpoint(trainer.step, model, optimizer, torch.get_rng_state(), trainer.config.seed,
                                           trainer.config.to_dict(), trainer.extra_state(), trainer.provenance))


def contents(path):
    found = {}
    with h5py.File(path, "r") as f:
        f.visititems(lambda name, obj: found.update({name: (obj[()], dict(obj.attrs))})
                     if isinstance(obj, h5py.Dataset) else None)
        return found, dict(f.attrs)


def assert_same_file(written, expected):
    (data, attrs), (data_expected, attrs_expected) = contents(written), contents(expected)
    assert attrs == attrs_expected
    assert sorted(data) == sorted(data_expected)
    for name, (array, meta) in data.items():
        array_expected, meta_expected = data_expected[name]
        assert array.dtype == array_expected.dtype and np.asarray(array).tobytes() == \
            np.asarray(array_expected).tobytes(), name
        assert meta == meta_expected, name


def run_past_a_checkpoint(trainer, tmp_path, between=None):
    """Train to the first checkpoint, take the synchronous state there, then let the next step (and ``between``)
    change the state while the copy is held; returns (background file, synchronous file)."""
    while trainer.step < EVERY:
        trainer.train_step()
    expected = synchronous_file(trainer, tmp_path / "sync.h5")
    if between is not None:
        between(trainer)
    trainer.train_step()
    trainer._writer.join(GATE_S * 4)
    return tmp_path / ckpt.checkpoint_name(EVERY), expected


@pytest.mark.parametrize("overrides,last", [({}, "fc3.weight"), ({"optimizer": "adam"}, "fc3.weight"),
                                            ({"model": "user_code:bn_cnn"}, "fc.weight")],
                         ids=["sgd-momentum", "adam", "batch-norm"])
def test_a_background_checkpoint_is_its_steps_state_bit_for_bit(held_copies, tmp_path, overrides, last):
    trainer = trainer_for(tmp_path, **overrides)
    assert trainer.dp.update_per_bucket and len(trainer.dp.buckets) == 3  # updates applied bucket by bucket
    written, expected = run_past_a_checkpoint(trainer, tmp_path)
    assert held_copies == []  # every part was copied only once the update of its bucket waited for it
    assert_same_file(written, expected)
    assert ckpt.verify(written) == []
    (message,) = [m for m in trainer.channel.sent if m["type"] == "checkpoint"]
    assert message["step"] == EVERY and message["stall_s"] > 0  # the waits for the held copy are counted
    # the live state went on meanwhile (the comparison above is not between two copies of the same tensors)
    assert not torch.equal(ckpt.load(written).model[last], trainer.model.state_dict()[last])


def test_a_soft_error_restore_waits_for_the_copy(held_copies, tmp_path):
    """Soft-error recovery returns to an older snapshot, in place: it may not reach the checkpoint under way."""
    trainer = trainer_for(tmp_path)
    older = trainer._snapshot()
    written, expected = run_past_a_checkpoint(trainer, tmp_path, between=lambda t: t._restore(older))
    assert trainer.step == 1  # restored to step 0, then one step
    assert held_copies == []
    assert_same_file(written, expected)


def test_a_flip_at_the_next_steps_start_waits_for_the_copy(held_copies, tmp_path):
    """A flip into the weights of the last bucket (fc1, updated last): written at the step's start, before any
    update waits, so the flip itself must wait for the copy."""
    trainer = trainer_for(tmp_path, faults=[f"flip:target=weight,rank=0,tensor=fc1.weight,step={EVERY},index=0,bit=30"])
    written, expected = run_past_a_checkpoint(trainer, tmp_path)
    assert [m["step"] for m in trainer.channel.sent if m["type"] == "flip"] == [EVERY]
    assert held_copies == []
    assert_same_file(written, expected)


def test_a_small_state_is_copied_on_the_training_thread(tmp_path):
    trainer = trainer_for(tmp_path)
    while trainer.step < EVERY:
        trainer.train_step()
    assert trainer._staged is None  # 17k parameters: under INLINE_BYTES, nothing left to wait for
    expected = synchronous_file(trainer, tmp_path / "sync.h5")
    trainer.train_step()
    trainer._writer.join(GATE_S)
    assert_same_file(tmp_path / ckpt.checkpoint_name(EVERY), expected)


def test_the_writer_runs_jobs_in_turn_hands_on_a_failing_one_and_ends_when_idle(monkeypatch):
    monkeypatch.setattr(staging, "_IDLE_S", 0.05)
    failed: list[Exception] = []
    writer, done = staging.Writer(on_error=failed.append), []
    writer.submit(lambda: done.append(1))
    writer.join(5)
    blocker = threading.Event()
    writer.submit(lambda: blocker.wait(5))
    with pytest.raises(RuntimeError, match="still under way"):
        writer.submit(lambda: None)  # one job at a time: whoever submits joins the previous one first
    blocker.set()
    writer.join(5)
    writer.submit(lambda: 1 / 0)  # handed on (a rank ends its run with it); the thread goes on
    writer.join(5)
    assert [type(exc) for exc in failed] == [ZeroDivisionError]
    writer.submit(lambda: done.append(2))
    writer.join(5)
    assert done == [1, 2] and not writer.is_alive()
    thread = writer._thread
    if thread is not None:
        thread.join(5)
    assert writer._thread is None  # idle: ended
    writer.submit(lambda: done.append(3))  # a new thread
    writer.join(5)
    assert done == [1, 2, 3]


@pytest.mark.usefixtures("no_leaks")
@pytest.mark.parametrize("fault,redone", [("kill:rank=1,step=12", 2), ("kill:rank=0,step=10", 0)],
                         ids=["a-peer-two-steps-later", "the-writer-in-the-next-step"])
def test_a_restart_from_a_background_checkpoint_ends_where_the_no_fault_run_ends(tmp_path, fault, redone):
    """Ranks as processes, a model whose state (2.4 MB) is copied in the background: a rank dies after the
    checkpoint of step 10 was staged (the writer itself in the very next step: its planned kill waits for the copy
    and the write), the world restarts from it and ends bit for bit where a run without a fault ends."""
    settings = {"world_size": 2, "steps": 16, "strategy": "checkpoint_restart", "checkpoint_every": 5,
                "hidden": [512, 512], "eval_interval": 16}
    clean = workbench.run(settings, out=tmp_path / "clean")
    faulty = workbench.run({**settings, "faults": [fault]}, out=tmp_path / "faulty")
    assert clean.completed and faulty.completed, faulty.summary["reason"]
    assert [f["steps_redone"] for f in faulty.failures] == [redone]
    final = [ckpt.load(r.summary["final_checkpoint"]) for r in (clean, faulty)]
    for name, tensor in final[0].model.items():
        assert torch.equal(tensor, final[1].model[name]), name
