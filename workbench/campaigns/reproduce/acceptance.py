"""Which workloads a registered comparison may run on: one that can show an effect. Each entry of the registry's
``workloads`` names its settings and what was measured of its failure-free runs on tuning seeds at the registered
world size and budget; :func:`check` refuses it, naming the figure, unless (a) it converged (the last fifth of
the steps gains less than 0.5 pt of test accuracy), (b) it ends at least 5 pt below its data set's ceiling, (c)
its seeds spread by at most 1.5 pt (sd over at least 6 seeds) and (d) the largest campaign it hosts takes at most
60 minutes on 2 idle cores. Measure an entry with ``python -m workbench.campaigns.reproduce.measure_workload NAME``.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from workbench.base.errors import WorkbenchError

MAX_LAST_FIFTH_GAIN_PT = 0.5  # (a)
CEILING_GAP = 0.05  # (b); every registered accuracy comparison is held to it too (registry.py)
MAX_SEED_SD_PT = 1.5  # (c)
MIN_SEEDS = 6
MAX_CAMPAIGN_MINUTES = 60.0  # (d)
SETTINGS = ("model", "dataset", "world_size", "steps")  # what every entry's settings name at least


class WorkloadRefused(WorkbenchError):
    """A workload that cannot show an effect: one line naming it, the criterion and the measured figure."""


def figures(measured: dict[str, Any]) -> dict[str, float]:
    """The four figures from a ``measured`` block: mean and sd of the final accuracies (pt), the mean gain over the
    last fifth of the steps (pt), and the minutes of the largest campaign (its runs x the mean run's minutes)."""
    finals = [100 * float(a) for a in measured["finals"]]
    gains = [100 * (float(f) - float(e)) for f, e in zip(measured["finals"], measured["at_four_fifths"])]
    return {"mean_pt": statistics.fmean(finals), "sd_pt": statistics.stdev(finals) if len(finals) > 1 else 0.0,
            "gain_pt": statistics.fmean(gains), "seeds": len(finals),
            "campaign_minutes": float(measured["run_minutes"]) * int(measured["campaign_runs"])}


def check_settings(name: str, entry: Any, where: str = "registry") -> dict[str, Any]:
    """``name``'s settings (a mapping naming at least :data:`SETTINGS`), or :class:`WorkloadRefused`."""
    settings = entry.get("settings") if isinstance(entry, dict) else None
    if not isinstance(settings, dict) or any(key not in settings for key in SETTINGS):
        raise WorkloadRefused(f"{where}: workload {name!r}: settings must name {', '.join(SETTINGS)}")
    return settings


def check(name: str, entry: Any, ceilings: dict[str, dict[str, Any]], where: str = "registry") -> dict[str, float]:
    """``name``'s figures, or :class:`WorkloadRefused` for a malformed entry or one that misses (a)-(d)."""
    at = f"{where}: workload {name!r}"
    settings, measured = check_settings(name, entry, where), entry.get("measured")
    keys = ("finals", "at_four_fifths", "seeds", "run_minutes", "campaign_runs", "source")
    if not isinstance(measured, dict) or any(key not in measured for key in keys):
        raise WorkloadRefused(f"{at}: measured must hold {', '.join(keys)} (python -m "
                              f"workbench.campaigns.reproduce.measure_workload {name})")
    if len(measured["finals"]) != len(measured["at_four_fifths"]) or len(measured["finals"]) != len(measured["seeds"]):
        raise WorkloadRefused(f"{at}: measured finals, at_four_fifths and seeds differ in length")
    ceiling = ceilings.get(str(settings["dataset"]))
    if ceiling is None:
        raise WorkloadRefused(f"{at}: no ceiling is registered for {settings['dataset']!r} (ceilings)")
    f = figures(measured)
    gap = 100 * float(ceiling["accuracy"]) - f["mean_pt"]
    misses = [
        (f["seeds"] < MIN_SEEDS, f"measured on {f['seeds']} seeds, at least {MIN_SEEDS} needed"),
        (not f["gain_pt"] < MAX_LAST_FIFTH_GAIN_PT, f"not converged: the last fifth of the steps gains "
                                                    f"{f['gain_pt']:.2f} pt (< {MAX_LAST_FIFTH_GAIN_PT} allowed)"),
        (not gap >= 100 * CEILING_GAP, f"at the ceiling: {f['mean_pt']:.1f} % is {gap:.1f} pt below "
                                        f"{settings['dataset']}'s {100 * ceiling['accuracy']:.1f} % (>= "
                                        f"{100 * CEILING_GAP:g} needed)"),
        (not f["sd_pt"] <= MAX_SEED_SD_PT, f"seeds spread {f['sd_pt']:.2f} pt (sd; <= {MAX_SEED_SD_PT} allowed)"),
        (not f["campaign_minutes"] <= MAX_CAMPAIGN_MINUTES, f"its largest campaign takes {f['campaign_minutes']:.0f} "
                                                            f"min (<= {MAX_CAMPAIGN_MINUTES:.0f} allowed)"),
    ]
    missed = [why for failed, why in misses if failed]
    if missed:
        raise WorkloadRefused(f"{at} cannot show an effect: {'; '.join(missed)}")
    return {**f, "ceiling_gap_pt": gap}


def measure(settings: dict[str, Any], seeds: list[int], tuning: tuple[int, int]) -> dict[str, Any]:
    """Failure-free runs of ``settings`` on tuning ``seeds``: each final accuracy, the accuracy at four fifths of
    the steps, and the mean run's wall minutes (``campaign_runs`` and ``source`` are the registrant's to add)."""
    import time

    import workbench

    if not seeds or any(not tuning[0] <= s <= tuning[1] for s in seeds):
        raise WorkloadRefused(f"seeds {seeds}: give tuning seeds, {tuning[0]}-{tuning[1]} (never a reporting seed)")
    steps = int(settings["steps"])
    four_fifths = (4 * steps) // 5
    finals, earlier, minutes = [], [], []
    with tempfile.TemporaryDirectory(prefix="workbench-acceptance-") as scratch:
        for seed in seeds:
            started = time.monotonic()
            result = workbench.run(**settings, seed=seed, eval_interval=steps // 10, out=Path(scratch) / f"s{seed}")
            minutes.append((time.monotonic() - started) / 60)
            if not result.completed:
                raise WorkloadRefused(f"seed {seed}: the failure-free run ended {result.outcome}")
            frame = result.to_dataframe().dropna(subset=["test_acc"])
            finals.append(round(float(result.summary["final_test_accuracy"]), 4))
            earlier.append(round(float(frame[frame.step < four_fifths].test_acc.iloc[-1]), 4))
            print(f"[acceptance] seed {seed}: {finals[-1]:.4f} (at step {four_fifths}: {earlier[-1]:.4f}), "
                  f"{minutes[-1]:.2f} min", file=sys.stderr, flush=True)
    return {"seeds": seeds, "finals": finals, "at_four_fifths": earlier,
            "run_minutes": round(statistics.fmean(minutes), 3)}
