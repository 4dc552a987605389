"""The gradient exchange, in one process: ranks as threads over a HashStore (gloo works across threads)."""

import copy
from datetime import timedelta

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from ranks_in_threads import run_ranks
from torch import nn

from workbench.config.run import RunConfig
from workbench.rank.gradient_exchange import DEFAULT_BUCKETS, GradientExchange, bucket_layout
from workbench.rank.soft_errors import ALARM_SLOTS
from workbench.workloads import registry
from workbench.workloads.data import checksum_of, sample_checksum
from workbench.workloads.models import build_model, mlp

MLP_SIZES = [10, 640, 64, 8192, 128, 8192]  # the digits MLP's parameters in backward order (fc3.bias .. fc1.weight)


def step_once(comm, x, y, batch, cap_mb, launches, initial, buckets=None):
    model = copy.deepcopy(initial)  # the global RNG is shared by the threads: build models before they start
    dp = GradientExchange(model, comm, "sgd", lr=0.1, momentum=0.0, bucket_cap_mb=cap_mb, buckets=buckets)
    dp.before_last_launch = lambda: launches.append(comm.rank)
    part = torch.tensor_split(torch.arange(batch), comm.size)[comm.rank]
    out = model(x[part])
    loss = F.cross_entropy(out, y[part], reduction="sum")
    dp.begin(torch.tensor([loss.item(), 0.0, float(len(part)), *[0.0] * ALARM_SLOTS]), part.numpy() + 100)
    (loss / batch).backward()
    stats = dp.finish()
    return len(dp.buckets), (stats, dp.sample_figures()), {n: p.detach().clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("size,buckets,cap_mb,expected", [(1, None, 1.0, 2), (2, None, 1.0, 2), (2, 1, 1.0, 1),
                                                             (2, 4, 1.0, 4), (3, None, 0.01, 4)])
def test_update_equals_single_process_full_batch(size, buckets, cap_mb, expected):
    torch.manual_seed(1)
    x, y = torch.rand(24, 1, 8, 8), torch.randint(0, 10, (24,))
    torch.manual_seed(0)
    reference = mlp((1, 8, 8), 10)
    optimizer = torch.optim.SGD(reference.parameters(), lr=0.1)
    full_loss = F.cross_entropy(reference(x), y)
    full_loss.backward()
    optimizer.step()
    launches = []
    torch.manual_seed(0)
    initial = mlp((1, 8, 8), 10)
    results = run_ranks(size, lambda comm: step_once(comm, x, y, 24, cap_mb, launches, initial, buckets))
    for n_buckets, (stats, entered), params in results:
        assert n_buckets == expected
        assert stats[2].item() == 24  # samples summed over ranks
        # the last bucket carried the count and the ids' checksum (ids 100..123), summed exactly
        assert entered[0].item() == 24 and checksum_of(entered.tolist()) == sample_checksum(np.arange(100, 124))
        assert stats[0].item() / 24 == pytest.approx(full_loss.item(), rel=1e-5)
        for name, value in reference.named_parameters():
            torch.testing.assert_close(params[name], value.detach(), rtol=1e-5, atol=1e-6)
    assert sorted(launches) == list(range(size))  # the fault point is passed once per rank per step


def test_rollback_restores_exactly_and_retry_finishes_a_step():
    """One rank, several buckets: apply, undo (rollback), then finish from bucket 1 with the kept gradients."""
    torch.manual_seed(0)
    initial = mlp((1, 8, 8), 10)
    x, y = torch.rand(16, 1, 8, 8), torch.randint(0, 10, (16,))

    def body(comm):
        model = copy.deepcopy(initial)
        dp = GradientExchange(model, comm, "sgd", lr=0.1, momentum=0.9, bucket_cap_mb=0.01, keep_local=True,
                          snapshot_buckets=True)
        before = {n: p.detach().clone() for n, p in model.named_parameters()}
        loss = F.cross_entropy(model(x), y, reduction="sum")
        dp.begin(torch.tensor([loss.item(), 0.0, 16.0, *[0.0] * ALARM_SLOTS]), np.arange(16))
        (loss / 16).backward()
        dp.finish()
        after = {n: p.detach().clone() for n, p in model.named_parameters()}
        assert dp.applied == len(dp.buckets) > 1
        assert dp.restore_applied() == len(dp.buckets)
        for n, p in model.named_parameters():
            assert torch.equal(p, before[n])
        dp.retry(0, have_local=True)  # the kept local gradients give the same update again
        for n, p in model.named_parameters():
            assert torch.equal(p, after[n])
        return True

    assert run_ranks(1, body) == [True]


def test_a_retry_carries_what_entered_every_bucket_not_bucket_0s_full_batch():
    """forward's retry among the members, from bucket 1 (bucket 0 was applied with every share): the stats in bucket
    0 keep the whole batch, the sample figures in the last bucket say only the contributors' samples entered the
    whole update (rank 1 as a replacement without a kept gradient: zeros)."""
    torch.manual_seed(0)
    initial = mlp((1, 8, 8), 10)
    x, y = torch.rand(16, 1, 8, 8), torch.randint(0, 10, (16,))

    def body(comm):
        model = copy.deepcopy(initial)
        dp = GradientExchange(model, comm, "sgd", lr=0.1, momentum=0.0, bucket_cap_mb=1.0, keep_local=True)
        part = torch.tensor_split(torch.arange(16), comm.size)[comm.rank]
        loss = F.cross_entropy(model(x[part]), y[part], reduction="sum")
        dp.begin(torch.tensor([loss.item(), 0.0, float(len(part)), *[0.0] * ALARM_SLOTS]), part.numpy())
        (loss / 16).backward()
        whole = dp.finish(), dp.sample_figures()
        stats = dp.retry(1, have_local=comm.rank == 0)
        return whole, (stats, dp.sample_figures())

    for (stats, entered), (retried, kept) in run_ranks(2, body):
        assert stats[2].item() == entered[0].item() == 16
        assert checksum_of(entered.tolist()) == sample_checksum(np.arange(16))
        assert retried[2].item() == 16  # bucket 0 is not redone
        assert kept[0].item() == 8 and checksum_of(kept.tolist()) == sample_checksum(np.arange(8))


def test_bucket_layout_count_cap_and_parameter_boundaries():
    # default: 2 runs, cut where the larger is smallest: fc3 and fc2 (8906 parameters), fc1 (8320)
    assert DEFAULT_BUCKETS == 2 and bucket_layout(MLP_SIZES, None, 1.0) == [[0, 1, 2, 3], [4, 5]]
    assert bucket_layout(MLP_SIZES, 1, 1.0) == [[0, 1, 2, 3, 4, 5]]  # the old single bucket, asked for
    assert bucket_layout(MLP_SIZES, 3, 1.0) == [[0, 1, 2], [3, 4], [5]]  # largest 8320: the best 3 runs can do
    assert bucket_layout(MLP_SIZES, 4, 1.0) == [[0, 1, 2], [3], [4], [5]]
    assert bucket_layout(MLP_SIZES, 100, 1.0) == [[i] for i in range(6)]  # never more buckets than parameters
    # the cap wins: 0.02 MB = 5242 floats; a run over it is cut further, a parameter over it is a bucket alone
    assert bucket_layout(MLP_SIZES, 1, 0.02) == [[0, 1, 2], [3], [4], [5]]
    floats = 4 / 2**20  # MB per float32
    assert bucket_layout([100] * 8, 2, 300 * floats) == [[0, 1, 2], [3, 4, 5], [6, 7]]  # 3 buckets fit the cap
    assert bucket_layout([400, 200, 400], 1, 500 * floats) == [[0], [1], [2]]  # [200, 400] over the cap: cut
    assert bucket_layout([1000, 1, 1, 1], 4, 1.0) == [[0], [1], [2], [3]]  # a dominant parameter: still 4
    assert bucket_layout([5], None, 1.0) == [[0]] and bucket_layout([], None, 1.0) == [[]]
    for layout in (bucket_layout(MLP_SIZES, None, 1.0), bucket_layout([7, 1, 9, 30, 2] * 40, None, 0.001)):
        assert sorted(i for group in layout for i in group) == list(range(sum(len(g) for g in layout)))
        assert all(group == list(range(group[0], group[-1] + 1)) for group in layout)  # contiguous, in order


@pytest.mark.parametrize("model", registry.model_names())
def test_every_built_in_model_has_several_buckets_by_default(model):
    shape = (1, 8, 8) if model in ("mlp", "cnn") else (40,) if model.startswith("mnist1d_") else (3, 32, 32)
    params = [p for p in build_model(RunConfig(model=model), shape, 10).parameters() if p.requires_grad][::-1]
    layout = bucket_layout([p.numel() for p in params], None, 1.0)
    assert len(layout) >= min(DEFAULT_BUCKETS, len(params)) >= 2
    cap = 2**20 // 4
    assert all(len(g) == 1 or sum(params[i].numel() for i in g) <= cap for g in layout)


def bn_mlp():
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Linear(32, 16),
                         nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 10))


@pytest.mark.parametrize("build", [lambda: mlp((1, 8, 8), 10), bn_mlp], ids=["mlp", "batchnorm"])
def test_updates_overlap_the_backward_pass_and_equal_updates_after_it(build):
    """Per-bucket updates applied during the backward pass (as each bucket's allreduce completes) give the same
    parameters, optimizer state and running statistics as applying every bucket after the pass."""
    torch.manual_seed(0)
    initial = build()
    torch.manual_seed(1)
    x, y = torch.rand(3, 16, 1, 8, 8), torch.randint(0, 10, (3, 16))

    def train(comm, overlap):
        model = copy.deepcopy(initial)
        dp = GradientExchange(model, comm, "sgd", lr=0.1, momentum=0.9, bucket_cap_mb=1.0, update_per_bucket=overlap,
                          buckets=4)
        if overlap:
            # make the overlap certain: launching bucket k waits (bounded) for bucket k-1's allreduce, so the poll
            # that follows the launch finds k-1 complete while the backward pass still has work to do
            dp.on_launch = lambda b: b.index and dp.buckets[b.index - 1].work.wait(timedelta(seconds=10))
        overlapped = []
        for step in range(3):
            part = torch.tensor_split(torch.arange(16), comm.size)[comm.rank]
            loss = F.cross_entropy(model(x[step][part]), y[step][part], reduction="sum")
            dp.begin(torch.tensor([loss.item(), 0.0, float(len(part)), *[0.0] * ALARM_SLOTS]), part.numpy())
            (loss / 16).backward()
            overlapped.append((dp.overlapped, [b.overlapped for b in dp.buckets]))
            dp.finish()
            assert dp.applied == len(dp.buckets) == 4
        return overlapped, {k: v.detach().clone() for k, v in model.state_dict().items()}

    for overlap_rank, plain_rank in zip(run_ranks(2, lambda comm: train(comm, True)),
                                        run_ranks(2, lambda comm: train(comm, False))):
        overlapped, state = overlap_rank
        # counted when backward() returned: buckets 0..2 were applied inside it, in launch order
        assert all(count >= 3 and flags[:3] == [True] * 3 for count, flags in overlapped), overlapped
        assert plain_rank[0] == [(0, [False] * 4)] * 3  # update_per_bucket=False: nothing during the pass
        for name, value in plain_rank[1].items():
            torch.testing.assert_close(state[name], value, rtol=0, atol=1e-6)
        assert any("running_mean" in k for k in state) == (build is bn_mlp)


class Alarm(Exception):
    pass


def test_an_alarm_seen_during_the_backward_pass_is_raised_once_every_bucket_is_launched():
    """A detector's alarm (on_reduced raising) met while applying buckets during the backward pass is raised by
    finish(), after every bucket is launched: a peer that meets it only in finish() launched all of them, and the
    members' collectives must keep pairing up (drain, then the next step)."""
    torch.manual_seed(0)
    initial = mlp((1, 8, 8), 10)
    x, y = torch.rand(16, 1, 8, 8), torch.randint(0, 10, (16,))

    def body(comm):
        model = copy.deepcopy(initial)
        dp = GradientExchange(model, comm, "sgd", lr=0.1, momentum=0.0, bucket_cap_mb=1.0, buckets=4)
        if comm.rank == 0:  # certain to meet the alarm of bucket 1 during the pass (see the overlap test)
            dp.on_launch = lambda b: b.index and dp.buckets[b.index - 1].work.wait(timedelta(seconds=10))
        phase, seen = {"now": "", "alarm": True}, []

        def check(bucket):
            if phase["alarm"] and bucket.index == 1:
                seen.append(phase["now"])
                raise Alarm(comm.rank)

        dp.on_reduced = check

        def step():
            part = torch.tensor_split(torch.arange(16), comm.size)[comm.rank]
            loss = F.cross_entropy(model(x[part]), y[part], reduction="sum")
            dp.begin(torch.tensor([loss.item(), 0.0, float(len(part)), *[0.0] * ALARM_SLOTS]), part.numpy())
            phase["now"] = "backward"
            (loss / 16).backward()  # the alarm, if met here, is kept
            phase["now"] = "finish"
            return dp.finish()

        with pytest.raises(Alarm):
            step()
        assert all(b.launched for b in dp.buckets) and dp.applied == 1
        dp.drain()
        phase["alarm"] = False
        assert step()[2].item() == 16  # the next exchange pairs up: both members' shares
        return seen, {n: p.detach().clone() for n, p in model.named_parameters()}

    (seen0, params0), (seen1, params1) = run_ranks(2, body)
    assert seen0 == ["backward"] and len(seen1) == 1
    for name, value in params0.items():
        assert torch.equal(value, params1[name])
