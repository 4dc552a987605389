"""The gradient exchange, in one process: ranks as threads over a HashStore (gloo works across threads)."""

import copy

import pytest
import torch
import torch.nn.functional as F
from ranks_in_threads import run_ranks

from workbench.models import mlp
from workbench.rank.data_parallel import DataParallel


def step_once(comm, x, y, batch, cap_mb, launches, initial):
    model = copy.deepcopy(initial)  # the global RNG is shared by the threads: build models before they start
    dp = DataParallel(model, comm, "sgd", lr=0.1, momentum=0.0, bucket_cap_mb=cap_mb)
    dp.before_last_launch = lambda: launches.append(comm.rank)
    part = torch.tensor_split(torch.arange(batch), comm.size)[comm.rank]
    out = model(x[part])
    loss = F.cross_entropy(out, y[part], reduction="sum")
    dp.begin(torch.tensor([loss.item(), 0.0, float(len(part)), 0.0, 0.0]))
    (loss / batch).backward()
    stats = dp.finish()
    return len(dp.buckets), stats, {n: p.detach().clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("size,cap_mb", [(1, 1.0), (2, 1.0), (3, 0.01)])
def test_update_equals_single_process_full_batch(size, cap_mb):
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
    results = run_ranks(size, lambda comm: step_once(comm, x, y, 24, cap_mb, launches, initial))
    for n_buckets, stats, params in results:
        assert (n_buckets > 1) == (cap_mb < 1)
        assert stats[2].item() == 24  # samples summed over ranks
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
        dp = DataParallel(model, comm, "sgd", lr=0.1, momentum=0.9, bucket_cap_mb=0.01, keep_local=True,
                          snapshot_buckets=True)
        before = {n: p.detach().clone() for n, p in model.named_parameters()}
        loss = F.cross_entropy(model(x), y, reduction="sum")
        dp.begin(torch.tensor([loss.item(), 0.0, 16.0, 0.0, 0.0]))
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
