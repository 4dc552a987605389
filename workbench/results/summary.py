"""A run's summary (``RunResult.summary``, one dict of figures): its one writer. Whoever has figures for it hands
them here through a call that says what they are; no other module sets a summary's key (tests/test_results.py
scans for it). In a run's life: :func:`build` once it ended (the recorder's figures and the supervisor's of its
members), :func:`continued` and :func:`kept_for_next_attempt` for a sweep point's requeued run, :func:`saved_at`
or :func:`not_saved` for its ``result.h5``, :func:`tracked` for MLflow, :func:`with_baseline` for overheads
against a no-fault run. Who calls which: docs/internals.md, "Who writes the summary".
"""

from __future__ import annotations

from typing import Any

from workbench.results import clock

SUMMED_TIMES = ("wall_s", "train_s", "rank_train_s")  # a requeued point's: both attempts' (continued)
SUMMED_COUNTS = ("generations", "checkpoints", "flips", "detections", "stragglers", "steps_redone_total",
                 "samples_lost_total")


def build(recorded: dict[str, Any], members: dict[str, Any], provenance: dict[str, Any]) -> dict[str, Any]:
    """The summary of a run that ended: the recorder's figures (``recorded``, ending with the model's size), then
    the supervisor's of its members (``detector_s``, ``diffusion``, ``stragglers``), then the ``clock`` its figures
    are read on (:func:`workbench.results.clock.default`, from these and the run's ``provenance``)."""
    summary = {**recorded, **members}
    summary["clock"] = clock.default(summary, provenance)
    return summary


def saved_at(summary: dict[str, Any], path: str | None) -> None:
    """``result_path``: where the result was written (None: nowhere; the value before, when a write failed)."""
    summary["result_path"] = path


def not_saved(summary: dict[str, Any], error: Exception) -> None:
    """The run's result could not be written: it fails with that as its reason (what the run itself did kept)."""
    summary["result_error"] = str(error)
    summary["reason"] = f"result not written: {error} (the run {summary['outcome']}: {summary['reason']})"
    summary["outcome"] = "failed"
    summary["result_path"] = None


def tracked(summary: dict[str, Any], record: dict[str, Any]) -> None:
    """``tracking``: the run's MLflow record (uri, run_id, experiment_id, error)."""
    summary["tracking"] = record


def kept_for_next_attempt(summary: dict[str, Any]) -> None:
    """A sweep point's run stopped by its job's preemption: its checkpoint is kept for the point's next attempt,
    which resumes from it (in place of the reason's ``resume from`` hint)."""
    summary["reason"] = summary["reason"].split("; resume from")[0] + (
        "; kept for the point's next attempt, which resumes from it")


def continued(earlier: dict[str, Any], later: dict[str, Any], failures: list[dict[str, Any]],
              steps_completed: int) -> dict[str, Any]:
    """The summary of a run resumed from ``earlier``'s boundary checkpoint as the continuation of ``earlier``:
    ``later``'s, its times and counts summed over both attempts, the ``failures`` of both, the world it started
    with and one more ``requeues``."""
    summary = dict(later)
    for name in SUMMED_TIMES:
        summary[name] = round((earlier.get(name) or 0.0) + (later.get(name) or 0.0), 3)
    for name in SUMMED_COUNTS:
        summary[name] = (earlier.get(name) or 0) + (later.get(name) or 0)
    summary.update(world_size_initial=earlier["world_size_initial"], failures=failures,
                   steps_completed=steps_completed, requeues=earlier.get("requeues", 0) + 1)
    return summary


def with_baseline(summary: dict[str, Any], baseline: dict[str, Any], world_sizes: set[int]) -> None:
    """``overhead_s`` and ``overhead_pct`` on each clock (``rank_`` for the rank clock) against the no-fault run
    whose summary is ``baseline``, its ``baseline_accuracy``, and ``world_changed``: the run trained at other
    world sizes (``world_sizes``, its metrics') than the baseline's."""
    for prefix in ("", "rank_"):
        own, base = summary.get(f"{prefix}train_s"), baseline.get(f"{prefix}train_s")
        over = round(own - base, 3) if own is not None and base is not None else None
        summary[f"{prefix}overhead_s"] = over
        summary[f"{prefix}overhead_pct"] = round(100 * over / base, 2) if over is not None and base else None
    summary["baseline_accuracy"] = baseline["final_test_accuracy"]
    summary["world_changed"] = bool(world_sizes - {baseline.get("world_size_initial")})
