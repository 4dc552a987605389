"""GossipGraD's diffusion claim, measured over real pair links (ranks as threads): ceil(log2 p) rounds of the
partner schedule without updates bring every replica to the mean; a schedule that skips a round does not."""

import pytest
import torch
from ranks_in_threads import run_ranks

from workbench.rank.gossip import GossipSchedule, diffusion


class SkipsARound(GossipSchedule):
    """A broken gossip: the last hypercube dimension of every cycle exchanges nothing."""

    def partner(self, step, position):
        return None if step % self.k == self.k - 1 else super().partner(step, position)


def state_of(rank):
    return torch.randn(5000, generator=torch.Generator().manual_seed(100 + rank))


def diffused(size, schedule_class, after_step):
    """(figures, the diffused copy) per rank."""
    def body(comm):
        state = state_of(comm.rank)
        figures, consensus = diffusion(comm, schedule_class(size, seed=3), state, after_step)
        assert state.equal(state_of(comm.rank))  # a measurement on a copy
        return figures, consensus
    return run_ranks(size, body)


def measured(size, schedule_class, after_step):
    return [figures for figures, _ in diffused(size, schedule_class, after_step)]


@pytest.mark.parametrize("size", [2, 4, 8])
@pytest.mark.parametrize("after_step", [0, 7])
def test_log2_p_rounds_bring_every_replica_to_the_mean(size, after_step):
    figures = measured(size, GossipSchedule, after_step)
    assert all(f == figures[0] for f in figures)  # every rank reports the same allreduced figures
    assert figures[0]["rounds"] == size.bit_length() - 1
    assert figures[0]["before"] > 0.5 and figures[0]["after"] <= 1e-6


@pytest.mark.parametrize("size", [4, 8])
def test_the_diffused_copy_is_the_replicas_mean_and_leaves_the_state_alone(size):
    mean = torch.stack([state_of(rank) for rank in range(size)]).mean(0)
    for _, consensus in diffused(size, GossipSchedule, 3):
        assert torch.allclose(consensus, mean, atol=1e-6)


@pytest.mark.parametrize("size", [2, 4, 8])
def test_a_schedule_that_skips_a_round_leaves_the_replicas_apart(size):
    figures = measured(size, SkipsARound, 5)[0]
    assert figures["after"] > 0.1 * figures["before"]
