"""A sweep point preempted with notice resumes where it stopped when it runs again (a Slurm requeue, a rerun).

The sweep hands the point's directory to its notebook as the parameter :data:`POINT_PARAMETER` (when the
notebook declares it, as it does ``out``), which passes it on to its runs: ``workbench.run(..., point=point)``.
On a notice the sweep's worker writes ``.notice`` there. A run given the point then has its whole job
preempted: it stops at a step boundary, whose checkpoint it keeps with its record so far in ``.preempted/<key>/``
(key: the run's configuration and its order among the kernel's runs of that configuration), and the point ends
``preempted``. When the point runs again, the run of the same key resumes from that checkpoint and its record
continues the kept one (:func:`continued`); docs/sweeps-and-clusters.md, "Preemption and requeue".
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING

from workbench.base.h5files import OutputError, atomic_output, reason
from workbench.faults import events as ev
from workbench.results import summary as summaries
from workbench.results.run_result import RESULT_FILE, RunResult

if TYPE_CHECKING:
    from workbench.config.run import RunConfig

POINT_PARAMETER = "point"  # the notebook parameter the sweep sets to the point's directory (None outside a sweep)
PROGRESS_FILE = "progress.txt"  # a campaign's latest progress line in its out folder (a sweep point's: relayed)
NOTICE_FILE = ".notice"  # written by the worker when the point has notice of preemption
PREEMPTED_DIR = ".preempted"  # one folder per run kept at its boundary checkpoint
CHECKPOINT_FILE = "checkpoint.h5"
_seen: Counter[str] = Counter()  # runs of each configuration this process started (the key's order)


class PointRun:
    """One run of a sweep point's kernel: where its kept state lives, whether there is some to resume from."""

    def __init__(self, point: Path, config: RunConfig) -> None:
        values = {k: v for k, v in config.to_dict().items() if k not in ("resume", "resume_verify")}
        digest = hashlib.sha256(json.dumps(values, sort_keys=True, default=str).encode()).hexdigest()[:16]
        _seen[digest] += 1
        self.point, self.dir = point, point / PREEMPTED_DIR / f"{digest}-{_seen[digest]}"
        self.kept: str | None = None  # this run's boundary checkpoint, kept for the next attempt

    @classmethod
    def of(cls, config: RunConfig, point: str | os.PathLike) -> PointRun | None:
        """The run's place in the sweep point whose directory is ``point`` (given to the run by its notebook:
        :func:`workbench.launch.session.start`), or None when the run resumes a checkpoint the user named."""
        from workbench.base.errors import ConfigError

        if not isinstance(point, (str, os.PathLike)) or not Path(point).is_dir():
            raise ConfigError("point", f"{point!r} is no sweep point's directory: give the notebook's `point` "
                              "parameter as the sweep set it (its point's directory), or None outside a sweep")
        kept = Path(point) / PREEMPTED_DIR
        if kept.is_symlink() and not kept.exists() or kept.exists() and not kept.is_dir():
            raise ConfigError("point", f"{kept} is in the way: a directory is needed there (a preempted run keeps "
                              "its checkpoint in it)")
        for place in (Path(point), kept):  # where a preempted run keeps its checkpoint for the next attempt
            if place.exists() and not os.access(place, os.W_OK | os.X_OK):
                raise ConfigError("point", f"{place} cannot be written: a run of a sweep point keeps its checkpoint "
                                  "there when its job is preempted; give the point's directory as the sweep made it")
        if config.resume is not None:
            return None
        return cls(Path(point), config)

    def resume_from(self) -> str | None:
        """The checkpoint an earlier attempt of this point kept for this run, if it kept one with its record."""
        checkpoint = self.dir / CHECKPOINT_FILE
        return str(checkpoint) if checkpoint.is_file() and (self.dir / RESULT_FILE).is_file() else None

    def noticed(self) -> bool:
        """The point has notice of preemption (this attempt)."""
        return (self.point / NOTICE_FILE).is_file()

    def keep(self, checkpoint: str) -> None:
        """Copy the whole job's boundary checkpoint into this run's folder (atomically), before the run's own
        directory (a temporary one, without ``out``) goes."""
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            with atomic_output(self.dir / f"next-{CHECKPOINT_FILE}") as tmp:
                shutil.copyfile(checkpoint, tmp)
        except OSError as exc:
            raise OutputError(self.dir / f"next-{CHECKPOINT_FILE}", reason(exc)) from None
        self.kept = str(self.dir / f"next-{CHECKPOINT_FILE}")

    def finish(self, result: RunResult, earlier: RunResult | None, noticed: bool) -> RunResult:
        """The run ended: its record continued from the ``earlier`` attempt's; kept for the next attempt when the
        whole job was preempted (:meth:`keep` was called); a run the notice stopped before it trained leaves its
        folder empty (the point is preempted, the run starts afresh next time); else the folder goes."""
        if earlier is not None:
            result = continued(earlier, result)
        if self.kept is None:
            shutil.rmtree(self.dir, ignore_errors=True)
            if noticed and result.outcome == "stopped":  # a marker: the point was preempted before it trained
                with contextlib.suppress(OSError):
                    self.dir.mkdir(parents=True, exist_ok=True)
            return result
        result.save(self.dir)  # the record so far, then its checkpoint: resume_from needs both
        os.replace(self.kept, self.dir / CHECKPOINT_FILE)
        summaries.kept_for_next_attempt(result.summary)
        return result

    def earlier(self) -> RunResult | None:
        return RunResult.load(self.dir) if (self.dir / RESULT_FILE).is_file() else None


def continued(earlier: RunResult, later: RunResult) -> RunResult:
    """``later`` (resumed from ``earlier``'s boundary checkpoint) as the continuation of ``earlier``: one record
    from step 0, times and generations of ``later`` shifted past ``earlier``'s (the time between the attempts left
    out), a ``requeued`` event where it resumed; the summary's times and counts summed over both attempts (training
    time leaves out both start-ups)."""
    first = later.metrics[0]["step"] if later.metrics else later.summary.get("steps_completed", 0)
    kept = [r for r in earlier.metrics if r["step"] < first]
    # the later attempt's clock starts where the earlier's record ends (its start-up shows; the queue does not)
    t_shift = max([e["time"] for e in earlier.events] + [r["time"] for r in earlier.metrics], default=0.0)
    rank_shift = kept[-1].get("rank_time", 0.0) if kept else 0.0
    gens = earlier.summary.get("generations", 0)
    metrics = kept + [{**r, "time": r["time"] + t_shift, "generation": r["generation"] + gens,
                       **({"rank_time": r["rank_time"] + rank_shift} if "rank_time" in r else {})}
                      for r in later.metrics]
    mark = ev.row(t_shift, ev.REQUEUED, first, f"the point ran again: resumed from the checkpoint of step {first} "
                  "kept when its job was preempted", checkpoint=later.config.get("resume"))
    events = [e for e in earlier.events if not ev.kind_is(e, ev.END)] + [mark] + [
        {**e, "time": e["time"] + t_shift, **({"gen": e["gen"] + gens} if "gen" in e else {})} for e in later.events]
    failures = earlier.failures + later.failures
    summary = summaries.continued(earlier.summary, later.summary, failures,
                                  steps_completed=max((r["step"] + 1 for r in metrics), default=0))
    config = {**later.config, "resume": earlier.config.get("resume")}
    steps = {k: list(earlier.rank_steps.get(k, [])) + list(later.rank_steps.get(k, []))
             for k in {**earlier.rank_steps, **later.rank_steps}}
    if "generation" in steps:
        n = len(earlier.rank_steps.get("generation", []))
        steps["generation"] = steps["generation"][:n] + [g + gens for g in steps["generation"][n:]]
    return RunResult(config, metrics, events, failures, summary, provenance=later.provenance, rank_steps=steps,
                     format=min(earlier.format, later.format))  # an earlier attempt's rows without fields: said
