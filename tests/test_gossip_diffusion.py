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


def measured(size, schedule_class, after_step):
    def body(comm):
        state = torch.randn(5000, generator=torch.Generator().manual_seed(100 + comm.rank))
        return diffusion(comm, schedule_class(size, seed=3), state, after_step)
    return run_ranks(size, body)


@pytest.mark.parametrize("size", [2, 4, 8])
@pytest.mark.parametrize("after_step", [0, 7])
def test_log2_p_rounds_bring_every_replica_to_the_mean(size, after_step):
    figures = measured(size, GossipSchedule, after_step)
    assert all(f == figures[0] for f in figures)  # every rank reports the same allreduced figures
    assert figures[0]["rounds"] == size.bit_length() - 1
    assert figures[0]["before"] > 0.5 and figures[0]["after"] <= 1e-6


@pytest.mark.parametrize("size", [2, 4, 8])
def test_a_schedule_that_skips_a_round_leaves_the_replicas_apart(size):
    figures = measured(size, SkipsARound, 5)[0]
    assert figures["after"] > 0.1 * figures["before"]
