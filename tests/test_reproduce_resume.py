"""A campaign a user can run (issue #46, deliverable 6): every finished run prints a progress line (runs done of
the total, elapsed, the finish estimated from the mean time per run so far), which a sweep worker relays to the
sweep's terminal; a campaign interrupted after some runs continues where it stopped when run again, without
redoing a finished run, and ends with the table an uninterrupted campaign makes."""

from __future__ import annotations

import io
import re
from types import SimpleNamespace

import pytest

import workbench
from workbench.campaigns.reproduce import common, gossipgrad
from workbench.launch.sweeps import point

TINY = {"seeds": [0], "steps": 10}  # p = 2 and 4, allreduce and gossip: 4 runs
REAL_RUN = workbench.run
TIMED = ["train_s", "rank_train_s"]  # the clock's: differs from one invocation to the next


def counting(monkeypatch, stop_after=None):
    """Count the runs workbench.run starts; with ``stop_after``, a KeyboardInterrupt (Ctrl-C) when the run after
    that many starts."""
    started, real = [], REAL_RUN

    def run(**settings):
        if stop_after is not None and len(started) == stop_after:
            raise KeyboardInterrupt
        started.append(settings)
        return real(**settings)

    monkeypatch.setattr(workbench, "run", run)
    return started


def test_an_interrupted_campaign_resumes_without_redoing_a_finished_run(tmp_path, monkeypatch, capsys):
    out = tmp_path / "campaign"
    started = counting(monkeypatch, stop_after=2)
    with pytest.raises(KeyboardInterrupt):
        gossipgrad.campaign("small", out, **TINY)
    assert len(started) == 2
    first = capsys.readouterr().out
    assert re.search(r"gossipgrad: 1/4 runs done \(p2-s0-data, [\d.]+ s; 0 reused\) · elapsed 0:00:\d\d · "
                     r"~[\d.]+ s per run, estimated finish \d\d:\d\d:\d\d \(in 0:00:\d\d\)", first), first
    assert "2/4 runs done" in first and "3/4" not in first

    started = counting(monkeypatch)
    resumed, _ = gossipgrad.campaign("small", out, **TINY)
    assert [(s["world_size"], s["parallelism"]) for s in started] == [(4, "data"), (4, "gossip")]  # only the rest
    second = capsys.readouterr().out
    assert "2/4 runs done (p2-s0-gossip, reused; 2 reused)" in second
    assert "estimated finish: after the first run not reused" in second
    assert re.search(r"4/4 runs done \(p4-s0-gossip, [\d.]+ s; 2 reused\) · elapsed \S+ · finished", second), second

    started = counting(monkeypatch)
    whole, _ = gossipgrad.campaign("small", tmp_path / "uninterrupted", **TINY)
    assert len(started) == 4
    assert resumed.drop(columns=TIMED).equals(whole.drop(columns=TIMED)), (resumed, whole)


def test_the_estimate_counts_the_mean_of_runs_run_not_reused_ones(monkeypatch):
    clock = iter([0.0, 100.0, 130.0])
    monkeypatch.setattr(common.time, "monotonic", lambda: next(clock))
    stream = io.StringIO()
    tracker = common.Progress("paper", 4, stream=stream)
    first = tracker.finished("a", 0.0, reused=True)  # 1/4, reused: nothing to estimate from yet
    assert "1/4 runs done (a, reused; 1 reused)" in first and "after the first run not reused" in first
    line = tracker.finished("b", 30.0, reused=False)  # 2 left at 30 s each
    assert "2/4 runs done (b, 30.0 s; 1 reused) · elapsed 0:02:10 · ~30.0 s per run" in line and "(in 0:01:00)" in line
    assert stream.getvalue() == f"{first}\n{line}\n"


def test_a_sweep_worker_relays_each_new_progress_line_as_an_event(tmp_path):
    events = []
    worker = SimpleNamespace(emit=lambda **event: events.append(event))
    path = tmp_path / "progress.txt"
    relay = point._ProgressRelay(worker, "scale=paper", path, every=0.05)
    path.write_text("gossipgrad: 1/8 runs done\n")
    common._write(path, "gossipgrad: 1/8 runs done\n")
    path.write_text("gossipgrad: 2/8 runs done\n")
    relay.stop()
    lines = [e["line"] for e in events]
    assert lines[-1] == "gossipgrad: 2/8 runs done" and len(lines) == len(set(lines))
    assert all(e == {"id": "scale=paper", "event": "progress", "line": e["line"]} for e in events)


def test_each_progress_line_is_written_into_the_campaigns_out_folder(tmp_path):
    """Under ``workbench sweep`` the campaign's ``out`` is its point's directory: the worker relays the file."""
    tracker = common.Progress("paper", 2, stream=io.StringIO(), into=tmp_path)
    tracker.finished("a", 1.0, reused=False)
    line = tracker.finished("b", 1.0, reused=False)
    assert (tmp_path / "progress.txt").read_text() == line + "\n"
    assert common.Progress("paper", 1, stream=io.StringIO(), into=tmp_path / "absent").finished("a", 1.0, False)
