import numpy as np

from workbench.workloads.data import BatchSequence, digits, shard, synthetic


def test_digits_split_is_fixed_and_stratified():
    a, b = digits(), digits()
    assert a.x_train.shape == (1438, 1, 8, 8) and a.x_test.shape == (359, 1, 8, 8)
    assert np.array_equal(a.y_test.numpy(), b.y_test.numpy())
    counts = np.bincount(a.y_test.numpy(), minlength=10)
    assert counts.min() >= 34 and counts.max() <= 38
    assert a.x_train.min() == -1.0 and a.x_train.max() == 1.0


def test_batch_sequence_depends_on_seed_and_step_only():
    seq = BatchSequence(100, 10, seed=3)
    first = [seq(s).copy() for s in range(25)]
    again = BatchSequence(100, 10, seed=3)
    assert all(np.array_equal(again(s), first[s]) for s in reversed(range(25)))
    assert sorted(np.concatenate(first[:10]).tolist()) == list(range(100))  # one epoch = a permutation
    assert not np.array_equal(first[0], first[10])  # next epoch reshuffles
    assert not np.array_equal(BatchSequence(100, 10, seed=4)(0), first[0])


def test_shards_partition_the_global_batch_for_any_world():
    batch = np.arange(64)
    for size in (1, 3, 4, 7):
        parts = [shard(batch, r, size) for r in range(size)]
        assert np.array_equal(np.concatenate(parts), batch)
        assert max(map(len, parts)) - min(map(len, parts)) <= 1


def test_synthetic_size_knob_and_learnable_shape():
    data = synthetic(256)
    assert data.x_train.shape == (256, 1, 8, 8) and data.num_classes == 10
