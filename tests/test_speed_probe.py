"""The rank clock's speed probe (``speed_probe``): CPU scaled by reference / probe, the probe's own CPU left out,
its cadence, the reference given, measured once or refused, and the scaling reaching a real run's rank-time."""

from __future__ import annotations

import math
import os
import time

import pytest

import workbench
from workbench.base import machine
from workbench.config.run import ConfigError, RunConfig
from workbench.rank import speed
from workbench.rank.channel import _CpuClock


class FakeCpu:
    """A CPU clock the test moves, and a probe that reads what the test says the core's speed is."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.cpu, self.probe_s, self.probes = 0.0, 100e-6, 0
        monkeypatch.setattr(speed, "probe", self.probe)

    def probe(self) -> float:
        self.probes += 1
        return self.probe_s


def fake_clock(fake: FakeCpu, reference_us: float) -> _CpuClock:
    cpu_time = _CpuClock()
    cpu_time.raw = lambda: fake.cpu  # the probe's own CPU is left out by raw() itself: tested below
    cpu_time.scale_to(reference_us)
    return cpu_time


def test_cpu_is_read_at_the_reference_speed(monkeypatch):
    fake = FakeCpu(monkeypatch)
    fake.probe_s = 200e-6  # the core runs at half the reference speed now
    cpu_time = fake_clock(fake, reference_us=100.0)
    start = cpu_time()
    fake.cpu += 1.0
    assert cpu_time() - start == pytest.approx(0.5)  # one second of CPU at half speed: half a reference second
    for _ in range(speed.KEEP):  # the core is back at full speed: the lower quartile of the last KEEP probes
        fake.probe_s = 100e-6
        fake.cpu += speed.EVERY_S
        cpu_time.maybe_probe()
    assert cpu_time.factor() == pytest.approx(1.0)
    middle = cpu_time()
    fake.cpu += 1.0
    assert cpu_time() - middle == pytest.approx(1.0)
    unscaled = _CpuClock()
    unscaled.raw = lambda: fake.cpu
    assert unscaled() == fake.cpu and unscaled.factor() == 1.0  # speed_probe off: CPU as it is


def test_the_probe_runs_after_each_stretch_of_cpu(monkeypatch):
    fake = FakeCpu(monkeypatch)
    cpu_time = fake_clock(fake, reference_us=100.0)
    first = fake.probes
    fake.cpu += speed.EVERY_S / 2
    cpu_time.maybe_probe()
    assert fake.probes == first  # not yet
    fake.cpu += speed.EVERY_S / 2
    cpu_time.maybe_probe()
    assert fake.probes == first + 1
    assert speed.lower_quartile([1.0]) == 1.0
    assert speed.lower_quartile([1.0] * 12 + [9.0] * 3) == 1.0  # a probe switched out mid-way does not count


def test_the_probe_is_not_the_ranks_work():
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as a rank runs: the probe's products on its own thread
    try:
        cpu_time = _CpuClock()
        cpu_time.scale_to(1e6)  # real probes; a reference far above them: scaling is not what is tested here
        process_before = time.process_time()
        spent, before = sum(cpu_time.probes), cpu_time.raw()
        cpu_time.maybe_probe(force=True)
        after = cpu_time.raw()
        process = time.process_time() - process_before
    finally:
        torch.set_num_threads(threads)
    probe = sum(cpu_time.probes) - spent  # the new probe's own CPU
    assert probe > 0 and len(cpu_time.probes) == 2
    # the rank's clock advanced by the process's CPU (this test's other threads included: pytest-xdist's) less the
    # probe's: it failed as a comparison with the probe alone, where another thread's CPU fell into the interval
    assert after - before <= process - probe + 1e-6


def test_the_reference_is_given_measured_once_or_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setenv(machine.PROBE_VAR, "0")
    with pytest.raises(ValueError, match=r"\$WORKBENCH_PROBE_US='0': a positive number is allowed"):
        machine.check_given()
    monkeypatch.setenv(machine.PROBE_VAR, "250")
    assert machine.probe_us() == (250.0, machine.PROBE_VAR)
    monkeypatch.delenv(machine.PROBE_VAR)
    from leaks import all_processes, descendants

    before = descendants(os.getpid(), all_processes())
    measured, source = machine.probe_us()  # a started process pinned to one core; cached for this machine
    assert source == "measured now" and 10 < measured < 100_000
    assert descendants(os.getpid(), all_processes()) <= before
    monkeypatch.setattr(machine, "measure_probe", lambda: pytest.fail("measured twice"))
    assert machine.probe_us() == (measured, "cached")
    with pytest.raises(ConfigError, match="speed_probe"):
        RunConfig(speed_probe="yes")


def test_a_run_scales_its_rank_time_to_the_reference(monkeypatch):
    plain = workbench.run(world_size=2, steps=30, seed=0)
    assert plain.provenance["probe_us"] is None and plain.provenance["probe_source"] is None
    # a reference 100x slower than any core here: every CPU second of the ranks counts about 100 on the rank clock
    monkeypatch.setenv(machine.PROBE_VAR, "50000")
    probed = workbench.run(world_size=2, steps=30, seed=0, speed_probe=True)
    assert probed.completed and probed.provenance["probe_us"] == 50000.0
    assert probed.provenance["probe_source"] == machine.PROBE_VAR
    assert probed.summary["rank_train_s"] > 20 * plain.summary["rank_train_s"]
    assert all(math.isfinite(r["rank_step_time"]) for r in probed.metrics)


def test_a_probe_that_cannot_be_measured_leaves_the_clock_unscaled(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))  # an empty cache: the probe is measured (and fails)
    monkeypatch.delenv(machine.PROBE_VAR, raising=False)
    for variable in (machine.NET_MIB_VAR, machine.LATENCY_VAR):  # the other speeds given: not measured again here
        monkeypatch.setenv(variable, "100")

    def broken() -> float:
        raise RuntimeError("the speed probe could not be measured (TimeoutExpired)")

    monkeypatch.setattr(machine, "measure_probe", broken)
    result = workbench.run(world_size=2, steps=12, seed=0, speed_probe=True)
    assert result.completed and result.provenance["probe_us"] is None
    assert result.provenance["probe_source"] == "the speed probe could not be measured (TimeoutExpired)"
    assert result.summary["fallbacks"] == ["speed_probe_unmeasured"]
    said = [e for e in result.events if e["kind"] == "fallback"]
    assert len(said) == 1 and "not scaled to a reference speed" in said[0]["detail"]
