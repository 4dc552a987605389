"""The membership state machine (workbench/supervisor/membership.py) on its own: events in, decisions out, no
process, socket or clock. A small driver plays the supervisor (core.Supervisor._apply): it keeps the live
processes from Start/Assign/Retire, the generations announced, and can make starting processes ready; it checks
the invariants on every batch of decisions. Strategies as in docs/internals.md (membership)."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from workbench.supervisor.membership import (
    Assign,
    End,
    Generation,
    Lost,
    Membership,
    Note,
    Restart,
    Retire,
    Start,
)

RECOVERING = ("shrink", "rollback", "forward")  # Reaction.REGROUP
STRATEGIES = ("none", "checkpoint_restart", "shrink", "rollback", "forward", "reinit", "torchft", "torchrun")
FROZE = "froze (no heartbeat for 5 s)"
KILLED = "was killed (SIGKILL)"


class Driver:
    """The supervisor's side: carries the decisions out (as far as membership is concerned) and checks them."""

    def __init__(self, strategy: str, world_size: int = 4, **kw) -> None:
        self.m = Membership(strategy, world_size, **kw)
        self.strategy, self.world_size = strategy, world_size
        self.regrow = kw.get("regrow", False)
        self.stage_of = kw.get("stage_of")
        self.resume = kw.get("resume")  # where a restarted world resumes: config resume, then the last checkpoint
        self.label: dict[int, int | None] = {}  # live process id -> label (None: a warm spare)
        self.ready_ids: set[int] = set()
        self.gone: set[int] = set()  # ids that died or were retired
        self.gens: list[Generation] = []
        self.log: list = []
        self.end: End | None = None
        self.dying: int | None = None

    # -- views ------------------------------------------------------------------------------------------------------
    @property
    def gen(self) -> Generation:
        return self.gens[-1]

    @property
    def starting(self) -> list[int]:
        return sorted(i for i in self.label if i not in self.ready_ids)

    @property
    def spares(self) -> list[int]:
        return sorted(i for i, label in self.label.items() if label is None)

    def holder(self, label: int) -> int:
        (id,) = [i for i, lab in self.label.items() if lab == label]
        return id

    # -- events -----------------------------------------------------------------------------------------------------
    def start(self) -> list:
        return self.apply(self.m.start())

    def ready(self, id: int) -> list:
        out = self.m.ready(id)
        if id in self.label:
            self.ready_ids.add(id)
        return self.apply(out)

    def die(self, id: int, cause: str = KILLED, step: int | None = None) -> list:
        self.dying = id
        if id in self.label:
            del self.label[id]
            self.gone.add(id)
        out = self.apply(self.m.died(id, cause, step))
        for d in out:
            if isinstance(d, Lost):
                assert d.id == id and d.cause == cause
        return out

    def kill(self, label: int, cause: str = KILLED, step: int | None = None) -> list:
        return self.die(self.holder(label), cause, step)

    def checkpoint(self, path: str) -> None:
        self.m.checkpoint(path)
        self.resume = path

    def stop(self, reason: str = "stopped by the user") -> list:
        return self.apply(self.m.stop(reason))

    def settle(self) -> list:
        """Make every started process ready, one at a time, until none is starting (or the run ended)."""
        out = []
        while self.starting and self.end is None:
            out += self.ready(self.starting[0])
        return out

    def up(self) -> Driver:
        self.start()
        self.settle()
        assert self.gen.gen == 0
        return self

    # -- carrying out and checking ----------------------------------------------------------------------------------
    def apply(self, decisions: list) -> list:
        if self.end is not None:
            assert decisions == [], f"decisions after {self.end}: {decisions}"
        done: list = []
        decisions = list(decisions)
        while decisions:
            d = decisions.pop(0)
            if isinstance(d, Restart):  # carried out in its place (the supervisor: after Retire's last reports)
                decisions[:0] = self.m.restart()
                continue
            done.append(d)
            assert self.end is None, f"{d} after {self.end}"
            if isinstance(d, Start):
                assert d.id not in self.label and d.id not in self.gone, f"{d}: id reused"
                assert d.slot == (self.strategy == "torchrun" and d.label is not None), d
                self.label[d.id] = d.label
            elif isinstance(d, Assign):
                assert self.label.get(d.id, "gone") is None and d.id in self.ready_ids, f"{d}: not a ready spare"
                self.label[d.id] = d.label
            elif isinstance(d, Retire):
                assert d.kill == (self.strategy != "torchrun"), d
                for id in d.ids:
                    assert id in self.label, f"{d}: {id} is not live"
                    del self.label[id]
                    self.gone.add(id)
            elif isinstance(d, Lost):
                assert d.id == self.dying, d
                pairs = dict(zip(self.gen.holders, self.gen.members))
                assert pairs.get(d.id) == d.label, f"{d}: not a member of {self.gen}"
                assert 0 <= d.position < d.size <= self.world_size and 0 <= d.world_size_after <= self.world_size
                if self.strategy not in ("reinit", "torchft"):  # those cut the members without a generation
                    assert (d.position, d.size) == (self.gen.members.index(d.label), len(self.gen.members)), d
            elif isinstance(d, Generation):
                self._check_generation(d)
                self.gens.append(d)
            elif isinstance(d, End):
                assert d.outcome in ("failed", "stopped") and d.reason
                self.end = d
            else:
                assert isinstance(d, Note) and d.kind and d.detail
        labels = [lab for lab in self.label.values() if lab is not None]
        assert len(labels) == len(set(labels)), f"a label held by two live processes: {self.label}"
        assert len(labels) <= self.world_size
        self.log += done
        return done

    def _check_generation(self, d: Generation) -> None:
        prev = self.gens[-1] if self.gens else None
        world = tuple(range(self.world_size))
        assert d.gen == (prev.gen + 1 if prev else 0), f"{d} after {prev}"
        assert list(d.members) == sorted(set(d.members)) and len(d.holders) == len(d.members), d
        assert 0 < len(d.members) <= self.world_size, d
        for label, id in zip(d.members, d.holders):
            assert self.label.get(id, "gone") == label and id in self.ready_ids, f"{d}: {id} is not a ready {label}"
        if self.stage_of is not None:
            stages = {self.stage_of(label) for label in range(self.world_size)}
            assert {self.stage_of(label) for label in d.members} == stages, f"{d}: a pipeline stage is missing"
        if prev is None:
            assert (d.members, d.source, d.resume, d.recovery) == (world, 0, self.resume, None), d
            return
        assert self.strategy != "none", d
        kept = [(lab, i) for lab, i in zip(prev.members, prev.holders) if self.label.get(i) == lab]
        pairs = list(zip(d.members, d.holders))
        if d.recovery in ("checkpoint_restart", "torchrun"):
            assert d.recovery == self.strategy and d.members == world and (d.source, d.resume) == (0, self.resume)
            assert not set(d.holders) & set(prev.holders), f"{d}: an old member in a restarted world"
        elif d.recovery == "reinit":
            assert self.strategy == "reinit" and d.members == world and d.resume is None, d
            survivors = [lab for lab, i in pairs if (lab, i) in kept]
            assert survivors and d.source == d.members.index(min(survivors)), f"{d}: survivors {survivors}"
        elif d.recovery is not None:
            assert d.recovery == self.strategy in RECOVERING and (d.source, d.resume) == (None, None), d
            assert len(d.members) <= len(prev.members), f"{d}: a recovery grew the world"
            assert set(kept) <= set(pairs), f"{d}: a survivor was left out"
        else:  # a regrow: the survivors and ready replacements
            assert self.strategy == "torchft" or (self.regrow and self.strategy in RECOVERING), d
            assert (d.source, d.resume) == (None, None) and len(d.members) > len(kept), d
            assert set(kept) <= set(pairs), f"{d}: a survivor was left out"


def kinds(decisions: list) -> list[str]:
    return [type(d).__name__ for d in decisions]


def of(decisions: list, kind: type) -> list:
    return [d for d in decisions if isinstance(d, kind)]


def stage_of_2x2(label: int) -> int:  # hybrid, 2 stages x 2 replicas: ranks 0,1 hold stage 0, ranks 2,3 stage 1
    return label // 2


# -- start ----------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_start_a_world_and_generation_0_when_all_are_ready(strategy):
    spares = 1 if strategy in ("reinit", "rollback") else 0
    d = Driver(strategy, 4, warm_spares=spares, regrow=strategy == "rollback", resume="given.h5")
    starts = d.start()
    assert kinds(starts) == ["Start"] * (4 + spares)
    assert [s.label for s in starts] == [0, 1, 2, 3] + [None] * spares
    assert [s.slot for s in starts] == [strategy == "torchrun"] * 4 + [False] * spares
    assert len({s.id for s in starts}) == 4 + spares
    for s in reversed(starts[1:]):  # any order; the last one to get ready completes the world
        assert d.ready(s.id) == []
    (g,) = d.ready(starts[0].id)
    assert g == Generation(0, (0, 1, 2, 3), tuple(s.id for s in starts[:4]), source=0, resume="given.h5")
    assert d.m.started and d.m.members == [0, 1, 2, 3]


def test_generation_0_waits_for_the_warm_spares_too():
    d = Driver("reinit", 2, warm_spares=2)
    starts = d.start()
    for s in starts[:3]:
        assert d.ready(s.id) == []
    assert kinds(d.ready(starts[3].id)) == ["Generation"]


def test_ready_twice_or_for_unknown_ids_is_ignored():
    d = Driver("shrink", 2)
    a, _ = d.start()
    assert d.ready(a.id) == [] and d.ready(a.id) == [] and d.ready(99) == [] and d.m.died(99, KILLED) == []


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("who", [0, 2, "spare"])
def test_a_death_during_start_up_ends_the_run(strategy, who):
    spares = 1 if who == "spare" else 0
    d = Driver(strategy, 3, warm_spares=spares, regrow=spares > 0 and strategy in RECOVERING)
    starts = d.start()
    d.ready(starts[1].id)
    victim = starts[-1] if who == "spare" else starts[who]
    (end,) = d.die(victim.id, "exited with code 1")
    name = "a warm spare" if who == "spare" else f"rank {who}"
    assert end == End("failed", f"{name} exited with code 1 during start-up")
    assert d.settle() == [] and d.gens == []


# -- none -----------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("rank", [0, 2])
def test_none_a_death_ends_the_run_naming_rank_and_step(rank):
    d = Driver("none").up()
    id = d.holder(rank)
    lost, end = d.kill(rank, KILLED, step=7)
    assert lost == Lost(rank, id, KILLED, rank, 4, 3, None)
    assert end == End("failed", f"rank {rank} {KILLED} at step 7; strategy 'none' does not recover")
    for other in list(d.label):  # a second death, late readies: nothing more
        assert d.die(other) == []
    assert d.stop() == []


def test_none_a_hang_is_a_death_with_its_cause():
    d = Driver("none").up()
    lost, end = d.kill(1, FROZE, step=3)
    assert lost.cause == FROZE and end.reason == f"rank 1 {FROZE} at step 3; strategy 'none' does not recover"


# -- shrink / rollback / forward without regrow -----------------------------------------------------------------------
@pytest.mark.parametrize("strategy", RECOVERING)
@pytest.mark.parametrize("rank", [0, 2, 3])
def test_survivors_form_the_next_generation(strategy, rank):
    d = Driver(strategy).up()
    id = d.holder(rank)
    lost, gen = d.kill(rank, KILLED, step=5)
    assert lost == Lost(rank, id, KILLED, rank, 4, 3, None)
    survivors = tuple(r for r in range(4) if r != rank)
    assert gen == Generation(1, survivors, tuple(d.holder(r) for r in survivors), recovery=strategy)
    assert d.settle() == []  # nobody replaces it


def test_shrink_two_deaths_in_one_generation_and_down_to_the_last():
    d = Driver("shrink", 4).up()
    d.kill(1)
    lost, gen = d.kill(3, FROZE)  # before anything is ready again: the second death is in generation 1
    assert (lost.position, lost.size, lost.world_size_after, lost.cause) == (2, 3, 2, FROZE)
    assert (gen.gen, gen.members, gen.recovery) == (2, (0, 2), "shrink")
    lost, gen = d.kill(0)
    assert (lost.position, lost.size, lost.world_size_after) == (0, 2, 1) and gen.members == (2,)
    lost, end = d.kill(2, KILLED, step=9)
    assert lost.world_size_after == 0
    assert end == End("failed", f"rank 2 {KILLED} at step 9; no rank survived")


def test_shrink_hybrid_the_last_replica_of_a_stage_ends_the_run():
    d = Driver("shrink", 4, stage_of=stage_of_2x2).up()
    _, gen = d.kill(3)  # stage 1 keeps rank 2
    assert gen.members == (0, 1, 2)
    _, gen = d.kill(0)  # stage 0 keeps rank 1
    assert gen.members == (1, 2)
    lost, end = d.kill(2, KILLED, step=4)
    assert lost.label == 2 and end.outcome == "failed"
    assert end.reason == (f"rank 2 {KILLED} at step 4, the last replica of pipeline stage 1; shrink cannot rebuild "
                          "a stage's layers (checkpoint_restart or reinit can)")


# -- shrink / rollback / forward with regrow ------------------------------------------------------------------------
@pytest.mark.parametrize("strategy", RECOVERING)
@pytest.mark.parametrize("rank", [0, 2])
def test_regrow_a_ready_spare_joins_the_same_generation(strategy, rank):
    d = Driver(strategy, 4, regrow=True, warm_spares=1).up()
    (spare,) = d.spares
    id = d.holder(rank)
    out = d.kill(rank)
    assert kinds(out) == ["Lost", "Assign", "Start", "Note", "Generation"]
    lost, assign, refill, note, gen = out
    assert lost == Lost(rank, id, KILLED, rank, 4, 4, spare)
    assert assign == Assign(spare, rank) and refill.label is None and note.kind == "spare"
    assert gen == Generation(1, (0, 1, 2, 3), tuple(d.holder(r) for r in range(4)), recovery=strategy)
    assert gen.holders[rank] == spare
    assert d.settle() == []  # the refilled spare getting ready changes nothing


@pytest.mark.parametrize("strategy", RECOVERING)
@pytest.mark.parametrize("rank", [0, 3])
def test_regrow_without_a_ready_spare_starts_a_fresh_replacement(strategy, rank):
    d = Driver(strategy, 4, regrow=True).up()
    id = d.holder(rank)
    out = d.kill(rank, FROZE)
    assert kinds(out) == ["Lost", "Generation", "Start"]
    lost, gen, start = out
    assert lost == Lost(rank, id, FROZE, rank, 4, 3, start.id) and start == Start(start.id, rank)
    survivors = tuple(r for r in range(4) if r != rank)
    assert (gen.gen, gen.members, gen.recovery) == (1, survivors, strategy)
    gen, note = d.ready(start.id)
    assert gen == Generation(2, (0, 1, 2, 3), tuple(d.holder(r) for r in range(4)))
    assert gen.holders[rank] == start.id and note.kind == "regrow"


def test_regrow_spare_not_ready_yet_falls_back_to_a_fresh_start():
    d = Driver("rollback", 4, regrow=True, warm_spares=1).up()
    d.kill(1)  # takes the spare; its successor is starting
    assert len(d.spares) == 1 and d.starting == d.spares
    out = d.kill(2)
    assert kinds(out) == ["Lost", "Generation", "Start"] and out[2].label == 2
    assert out[1].members == (0, 1, 3)


def test_regrow_two_deaths_in_one_generation_two_replacements():
    d = Driver("forward", 4, regrow=True).up()
    _, _, r0 = d.kill(0)
    lost, gen, r2 = d.kill(2)
    assert (lost.position, lost.size, lost.world_size_after, lost.replacement) == (1, 3, 2, r2.id)
    assert (gen.gen, gen.members) == (2, (1, 3))
    assert (r0.label, r2.label) == (0, 2)
    gen, note = d.ready(r2.id)  # in whatever order they get ready
    assert (gen.gen, gen.members, gen.recovery, note.kind) == (3, (1, 2, 3), None, "regrow")
    gen, _ = d.ready(r0.id)
    assert (gen.gen, gen.members) == (4, (0, 1, 2, 3))


def test_regrow_replacement_dies_before_ready_and_the_run_ends_after_max_starts():
    d = Driver("rollback", 3, regrow=True, max_starts=3).up()
    *_, start = d.kill(1)
    note, again = d.die(start.id, "exited with code 1")
    assert note.kind == "respawn" and again == Start(again.id, 1)
    note, again = d.die(again.id, "exited with code 1")
    (end,) = d.die(again.id, "exited with code 1")
    assert end == End("failed", "rank 1's replacement failed to start 3 times in a row (last: exited with code 1)")


def test_regrow_the_start_count_is_per_label_and_reset_by_ready():
    d = Driver("rollback", 3, regrow=True, max_starts=2).up()
    *_, start = d.kill(1)
    _, again = d.die(start.id, KILLED)
    d.ready(again.id)  # it made it: the count starts over
    *_, start = d.kill(1)
    _, again = d.die(start.id, KILLED)
    assert again.label == 1 and d.end is None


def test_regrow_a_member_with_a_starting_replacement_elsewhere():
    """A death while another rank's replacement starts: both are replaced, the world returns to its size."""
    d = Driver("shrink", 3, regrow=True).up()
    d.kill(2)
    d.kill(0)
    d.settle()
    assert d.gen.members == (0, 1, 2) and d.m.pending == []


# -- reinit ---------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("rank", [0, 1, 3])
def test_reinit_survivors_wait_for_the_replacement(rank):
    d = Driver("reinit", 4).up()
    id = d.holder(rank)
    out = d.kill(rank, KILLED)
    assert kinds(out) == ["Lost", "Start", "Note"]
    lost, start, note = out
    assert lost == Lost(rank, id, KILLED, rank, 4, 4, start.id)
    assert start == Start(start.id, rank) and note.kind == "respawn"
    (gen,) = d.ready(start.id)
    lowest = 1 if rank == 0 else 0
    assert gen == Generation(1, (0, 1, 2, 3), tuple(d.holder(r) for r in range(4)), source=lowest,
                             recovery="reinit")


@pytest.mark.parametrize("rank", [0, 2])
def test_reinit_with_a_ready_spare_the_generation_follows_at_once(rank):
    d = Driver("reinit", 4, warm_spares=1).up()
    (spare,) = d.spares
    out = d.kill(rank)
    assert kinds(out) == ["Lost", "Assign", "Start", "Note", "Generation"]
    assert out[0].replacement == spare and out[1] == Assign(spare, rank) and out[2].label is None
    gen = out[4]
    assert (gen.gen, gen.members, gen.holders[rank], gen.recovery) == (1, (0, 1, 2, 3), spare, "reinit")
    assert gen.source == (1 if rank == 0 else 0)


def test_reinit_two_deaths_two_replacements_one_generation():
    d = Driver("reinit", 4).up()
    _, r0, _ = d.kill(0)
    _, r1, _ = d.kill(1, FROZE)  # a survivor dies while the survivors wait
    assert (r0.label, r1.label) == (0, 1)
    assert d.ready(r1.id) == []
    (gen,) = d.ready(r0.id)
    assert (gen.gen, gen.members, gen.source, gen.recovery) == (1, (0, 1, 2, 3), 2, "reinit")


def test_reinit_spare_taken_while_waiting_for_a_fresh_replacement():
    d = Driver("reinit", 4, warm_spares=1).up()
    d.kill(0)  # the spare: generation 1 at once
    out = d.kill(2)  # the successor spare is not ready: a fresh start, the survivors wait
    assert kinds(out) == ["Lost", "Start", "Note"]
    out = d.kill(3)  # a second survivor: another fresh start, still one generation to come
    assert kinds(out) == ["Lost", "Start", "Note"]
    d.settle()
    assert (d.gen.gen, d.gen.members, d.gen.source) == (2, (0, 1, 2, 3), 0)


def test_reinit_replacement_dies_while_waiting_and_is_started_again():
    d = Driver("reinit", 3).up()
    _, start, _ = d.kill(2)
    note, again = d.die(start.id, "was not ready within 60 s")
    assert note.kind == "respawn" and again == Start(again.id, 2)
    (gen,) = d.ready(again.id)
    assert gen.recovery == "reinit" and gen.holders[2] == again.id


def test_reinit_all_survivors_die_while_waiting():
    d = Driver("reinit", 2).up()
    d.kill(0)
    lost, end = d.kill(1, KILLED, step=2)
    assert end == End("failed", f"rank 1 {KILLED} at step 2; no rank survived")


def test_reinit_second_death_lost_names_its_generation_position():
    d = Driver("reinit", 4).up()
    d.kill(1)
    lost, *_ = d.kill(3)
    assert (lost.position, lost.size) == (3, 4)


# -- checkpoint_restart ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("rank", [0, 2])
def test_checkpoint_restart_restarts_the_world_from_the_last_checkpoint(rank):
    d = Driver("checkpoint_restart", 4, resume="given.h5").up()
    d.checkpoint("ckpt/step4.h5")
    d.checkpoint("ckpt/step8.h5")
    id = d.holder(rank)
    survivors = tuple(d.holder(r) for r in range(4) if r != rank)
    out = d.kill(rank, KILLED, step=10)
    assert kinds(out) == ["Lost", "Retire"] + ["Start"] * 4 + ["Note"]
    assert out[0] == Lost(rank, id, KILLED, rank, 4, 4, None)
    assert out[1] == Retire(survivors, kill=True)
    starts = out[2:6]
    assert [s.label for s in starts] == [0, 1, 2, 3] and not any(s.slot for s in starts)
    assert out[6].kind == "restart" and "ckpt/step8.h5" in out[6].detail
    for s in starts[:3]:
        assert d.ready(s.id) == []
    (gen,) = d.ready(starts[3].id)
    assert gen == Generation(1, (0, 1, 2, 3), tuple(s.id for s in starts), source=0, resume="ckpt/step8.h5",
                             recovery="checkpoint_restart")


def test_checkpoint_restart_resumes_from_a_checkpoint_the_retired_world_reported_last():
    """A retired member's last reports are read between Retire and Restart (the supervisor drains its socket): a
    checkpoint it finished writing as another rank died is where the fresh world resumes, and the note says so."""
    d = Driver("checkpoint_restart", 4).up()
    d.checkpoint("ckpt/step10.h5")
    id = d.holder(2)
    d.dying = id
    del d.label[id]
    d.gone.add(id)
    out = d.m.died(id, KILLED, 15)
    assert kinds(out) == ["Lost", "Retire", "Restart"]
    d.apply(out[:2])
    d.checkpoint("ckpt/step15.h5")  # rank 0's report, drained as it was retired
    started = d.apply(out[2:])
    assert kinds(started) == ["Start"] * 4 + ["Note"]
    assert started[-1].detail == "world stopped; 4 fresh ranks resume from checkpoint ckpt/step15.h5"
    d.settle()
    assert d.gen.resume == "ckpt/step15.h5" and d.gen.recovery == "checkpoint_restart"


def test_checkpoint_restart_without_a_checkpoint_resumes_from_the_config():
    d = Driver("checkpoint_restart", 2).up()
    out = d.kill(1)
    assert "step 0" in out[-1].detail
    (gen,) = d.settle()
    assert (gen.resume, gen.source) == (None, 0)


def test_checkpoint_restart_a_fresh_rank_dies_before_ready():
    d = Driver("checkpoint_restart", 3).up()
    d.checkpoint("c.h5")
    starts = of(d.kill(1), Start)
    d.ready(starts[0].id)
    note, again = d.die(starts[2].id, "exited with code 1")
    assert note.kind == "respawn" and again == Start(again.id, 2)
    assert d.ready(starts[1].id) == []  # rank 2 is not ready yet
    (gen,) = d.ready(again.id)
    assert gen.holders == (starts[0].id, starts[1].id, again.id) and gen.resume == "c.h5"


def test_checkpoint_restart_retired_members_are_not_failures():
    d = Driver("checkpoint_restart", 3).up()
    old = [d.holder(r) for r in range(3)]
    d.kill(0)
    for id in old[1:]:  # the supervisor killed them; a late death report must change nothing
        assert d.m.died(id, KILLED) == [] and d.m.ready(id) == []
    assert len(of(d.log, Lost)) == 1


def test_checkpoint_restart_a_single_rank_world():
    d = Driver("checkpoint_restart", 1).up()
    out = d.kill(0)
    assert kinds(out) == ["Lost", "Retire", "Start", "Note"] and out[1] == Retire(())
    (gen,) = d.settle()
    assert gen.members == (0,) and gen.recovery == "checkpoint_restart"


def test_checkpoint_restart_fresh_ranks_failing_max_starts_times_end_the_run():
    d = Driver("checkpoint_restart", 2, max_starts=2).up()
    starts = of(d.kill(0), Start)
    _, again = d.die(starts[1].id, KILLED)
    (end,) = d.die(again.id, KILLED)
    assert end.outcome == "failed" and "rank 1's replacement failed to start 2 times" in end.reason


# -- torchft --------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("rank", [0, 2])
def test_torchft_survivors_go_on_and_the_replacement_joins_when_ready(rank):
    d = Driver("torchft", 4).up()
    id = d.holder(rank)
    out = d.kill(rank, FROZE)
    assert kinds(out) == ["Lost", "Start", "Note"]  # no generation: torchft finds its quorum itself
    lost, start, _ = out
    assert lost == Lost(rank, id, FROZE, rank, 4, 3, start.id) and start.label == rank
    assert d.m.members == [r for r in range(4) if r != rank]
    gen, note = d.ready(start.id)
    assert gen == Generation(1, (0, 1, 2, 3), tuple(d.holder(r) for r in range(4)))
    assert note.kind == "regrow"


def test_torchft_two_deaths_two_replacements():
    d = Driver("torchft", 4).up()
    _, r1, _ = d.kill(1)
    lost, r3, _ = d.kill(3)
    assert lost.world_size_after == 2 and (r1.label, r3.label) == (1, 3)
    gen, _ = d.ready(r3.id)
    assert gen.members == (0, 2, 3)
    gen, _ = d.ready(r1.id)
    assert (gen.gen, gen.members) == (2, (0, 1, 2, 3))


def test_torchft_replacement_dies_before_ready():
    d = Driver("torchft", 2).up()
    _, start, _ = d.kill(0)
    _, again = d.die(start.id, KILLED)
    assert again.label == 0
    gen, _ = d.ready(again.id)
    assert gen.members == (0, 1)


# -- torchrun -------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("rank", [0, 3])
def test_torchrun_restarts_the_whole_world_in_fresh_slots(rank):
    d = Driver("torchrun", 4).up()
    d.checkpoint("c8.h5")
    id = d.holder(rank)
    survivors = tuple(d.holder(r) for r in range(4) if r != rank)
    out = d.kill(rank, KILLED, step=9)
    assert kinds(out) == ["Lost", "Note", "Retire"] + ["Start"] * 4
    assert out[0] == Lost(rank, id, KILLED, rank, 4, 4, None) and out[1].kind == "restart"
    assert out[2] == Retire(survivors, kill=False)
    starts = out[3:]
    assert [(s.label, s.slot) for s in starts] == [(r, True) for r in range(4)]
    *rest, (gen,) = [d.ready(s.id) for s in starts]
    assert rest == [[]] * 3
    assert gen == Generation(1, (0, 1, 2, 3), tuple(s.id for s in starts), source=0, resume="c8.h5",
                             recovery="torchrun")


def test_torchrun_a_restarted_worker_dying_restarts_again():
    d = Driver("torchrun", 3).up()
    starts = of(d.kill(1), Start)
    d.ready(starts[0].id)
    out = d.die(starts[2].id, KILLED)
    assert kinds(out) == ["Note", "Retire", "Start", "Start", "Start"]
    assert out[1] == Retire((starts[0].id, starts[1].id), kill=False)
    assert [s.label for s in out[2:]] == [0, 1, 2]
    (gen,) = d.settle()
    assert (gen.gen, gen.holders, gen.recovery) == (1, tuple(s.id for s in out[2:]), "torchrun")


def test_torchrun_a_single_worker_world_restarts():
    d = Driver("torchrun", 1).up()
    d.checkpoint("c.h5")
    out = d.kill(0)
    assert d.end is None and [(s.label, s.slot) for s in of(out, Start)] == [(0, True)]
    (gen,) = d.settle()
    assert (gen.members, gen.resume, gen.recovery) == ((0,), "c.h5", "torchrun")


# -- every strategy: rank 0, hangs, spares, stop ---------------------------------------------------------------------
EXPECTED_AFTER_RANK_0 = {  # the kinds of decisions rank 0's death leads to, at world 3 without spares
    "none": ["Lost", "End"],
    "shrink": ["Lost", "Generation"],
    "rollback": ["Lost", "Generation"],
    "forward": ["Lost", "Generation"],
    "reinit": ["Lost", "Start", "Note"],
    "checkpoint_restart": ["Lost", "Retire", "Start", "Start", "Start", "Note"],
    "torchft": ["Lost", "Start", "Note"],
    "torchrun": ["Lost", "Note", "Retire", "Start", "Start", "Start"],
}


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("cause", [KILLED, FROZE])
def test_rank_0_dying_or_freezing(strategy, cause):
    d = Driver(strategy, 3).up()
    id = d.holder(0)
    out = d.kill(0, cause, step=11)
    assert kinds(out) == EXPECTED_AFTER_RANK_0[strategy]
    lost = out[0]
    assert (lost.label, lost.id, lost.cause, lost.position, lost.size) == (0, id, cause, 0, 3)
    d.settle()
    if strategy == "none":
        assert d.end.reason == f"rank 0 {cause} at step 11; strategy 'none' does not recover"
        return
    assert d.end is None
    assert d.gen.members == ((1, 2) if strategy in RECOVERING else (0, 1, 2))
    assert id not in d.gen.holders


@pytest.mark.parametrize("strategy", ["rollback", "reinit"])
def test_a_spare_dying_after_start_is_replaced_in_the_pool(strategy):
    d = Driver(strategy, 2, warm_spares=1, regrow=strategy == "rollback").up()
    (spare,) = d.spares
    note, refill = d.die(spare, "exited with code 1")
    assert note.kind == "spare_lost" and refill == Start(refill.id, None)
    assert d.gen.gen == 0 and d.m.members == [0, 1]


def test_a_spare_that_never_gets_ready_is_not_started_forever():
    d = Driver("rollback", 2, regrow=True, warm_spares=1, max_starts=3).up()
    d.die(d.spares[0], KILLED)  # a ready spare dies: its successor starts
    restarts = 0
    for _ in range(10):  # and every successor dies while it starts
        if not d.spares or d.end is not None:
            break
        restarts += len(of(d.die(d.spares[0], "exited with code 1"), Start))
    assert restarts <= 3


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_stop_ends_the_run_and_nothing_comes_after(strategy):
    d = Driver(strategy, 3).up()
    assert d.stop("stopped by the user") == [End("stopped", "stopped by the user")]
    assert d.stop("again") == []
    assert d.die(d.holder(1)) == []
    d.checkpoint("late.h5")
    assert d.m.ready(d.holder(0)) == []


def test_stop_during_start_up():
    d = Driver("shrink", 2)
    d.start()
    assert d.stop("user") == [End("stopped", "user")]
    assert d.settle() == [] and d.gens == []


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_events_for_unknown_or_dead_ids_are_ignored(strategy):
    d = Driver(strategy, 3).up()
    assert d.m.died(1000, KILLED) == [] and d.m.ready(1000) == []
    d.kill(2)
    if d.end is None:
        assert d.m.died(d.dying, KILLED) == [] and d.m.ready(d.dying) == []


# -- generated sequences ----------------------------------------------------------------------------------------------
CONFIGS = {  # name: (strategy, regrow, spares allowed, hybrid)
    "none": ("none", False, False, False),
    "shrink": ("shrink", False, False, False),
    "shrink-hybrid": ("shrink", False, False, True),
    "rollback": ("rollback", False, False, False),
    "forward": ("forward", False, False, False),
    "shrink+regrow": ("shrink", True, True, False),
    "rollback+regrow": ("rollback", True, True, False),
    "forward+regrow": ("forward", True, True, False),
    "reinit": ("reinit", False, True, False),
    "checkpoint_restart": ("checkpoint_restart", False, False, False),
    "torchft": ("torchft", False, False, False),
    "torchrun": ("torchrun", False, False, False),
}
ACTIONS = {  # what each action picks from: a member, a starting process, a replacement that starts, ...
    "kill_member": lambda d: [h for h in (d.gen.holders if d.gens else ()) if h in d.label],
    "hang_member": lambda d: [h for h in (d.gen.holders if d.gens else ()) if h in d.label],
    "kill_any": lambda d: sorted(d.label),
    "kill_starting": lambda d: d.starting,
    "kill_replacement": lambda d: [i for i in d.starting if d.label[i] is not None],
    "ready": lambda d: d.starting,
    "ready_too": lambda d: d.starting,
    "checkpoint": lambda d: [None],
    "stale": lambda d: sorted(d.gone),  # died or retired: whatever is said about it changes nothing
}


@pytest.mark.parametrize("name", CONFIGS)
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])  # profile's db
@given(world=st.integers(1, 6), spares=st.integers(0, 2), warm_up=st.sampled_from([True, True, False]),
       actions=st.lists(st.tuples(st.sampled_from(sorted(ACTIONS)), st.integers(0, 1000)), max_size=40))
def test_generated_sequences_keep_the_invariants(name, world, spares, warm_up, actions):
    strategy, regrow, spares_allowed, hybrid = CONFIGS[name]
    stage_of = None
    if hybrid:
        world = max(4, world - world % 2)  # 2 stages x world/2 replicas
        replicas = world // 2

        def stage_of(label: int) -> int:
            return label // replicas

    d = Driver(strategy, world, regrow=regrow, warm_spares=spares if spares_allowed else 0, stage_of=stage_of,
               max_starts=3)
    d.start()
    if warm_up:
        d.settle()
    sizes = [len(g.members) for g in d.gens]
    for step, (action, pick) in enumerate(actions):
        if d.end is not None:
            break
        choices = ACTIONS[action](d)
        if not choices:
            continue
        id = choices[pick % len(choices)]
        if action == "checkpoint":
            d.checkpoint(f"ckpt/step{step}.h5")
        elif action.startswith("ready"):
            d.ready(id)
        elif action == "stale":
            assert d.m.died(id, KILLED) == [] and d.m.ready(id) == []
        else:
            member = id in ACTIONS["kill_member"](d)
            out = d.die(id, FROZE if action == "hang_member" else KILLED, step=step)
            if member and d.end is None and strategy in RECOVERING:
                assert of(out, Generation)[-1].recovery == strategy  # the survivors go on at once
        sizes += [len(g.members) for g in d.gens[len(sizes):]]
    if strategy in RECOVERING and not regrow:  # shrink without regrow never grows
        assert sizes == sorted(sizes, reverse=True)
    if d.end is None:
        d.settle()
    if d.end is not None:
        for id in list(d.label):  # nothing after End, whatever comes
            assert d.m.ready(id) == [] and d.m.died(id, KILLED) == []
        assert d.stop("late") == []
        return
    assert d.gens, "all ready and nothing ended, yet no generation"
    if strategy != "none" and (regrow or strategy not in RECOVERING):  # liveness: the world returns to its size
        assert d.gen.members == tuple(range(world)), d.gen
        assert d.m.members == list(range(world)) and d.m.pending == [] and not d.m.restarting
    assert sorted(d.m.members) == list(d.gen.members)  # the membership agrees with what was announced last
