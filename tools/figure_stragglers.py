"""Draw docs/img/stragglers.png: a slow rank (factor 3) flagged and dropped under shrink, beside a failure-free run
at the world size the drop leaves; prints the figures it shows. Needs matplotlib (not a workbench dependency).

    PYTHONPATH=. python tools/figure_stragglers.py [OUT.png]
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

import workbench

STEPS, SLOW_AT = 80, 20


def main(out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import pandas as pd

    kw = dict(steps=STEPS, eval_interval=STEPS, strategy="shrink", hidden=[512, 512], batch_size=128)
    baseline = workbench.start(world_size=3, **kw)  # side by side: the shared cores load both alike
    slow = workbench.start(world_size=4, straggler_response="drop", faults=[f"slow:rank=2,step={SLOW_AT},factor=3"],
                           **kw)
    base, result = baseline.wait(600), slow.wait(600)
    table = pd.DataFrame(result.rank_steps).drop_duplicates(["step", "rank"], keep="last")
    table["relative"] = table.cpu_s / table.groupby("step").cpu_s.transform("median")
    grid = table.pivot(index="rank", columns="step", values="relative")
    flag = next(e for e in result.events if e["kind"] == "straggler")
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 5.2), sharex=True, height_ratios=[1, 1.3],
                                      layout="constrained")
    image = top.imshow(grid.values, aspect="auto", cmap="YlOrRd", vmin=0.5, vmax=3.0, interpolation="nearest",
                       extent=(grid.columns[0] - 0.5, grid.columns[-1] + 0.5, len(grid) - 0.5, -0.5))
    top.set_yticks(range(len(grid)), [f"rank {r}" for r in grid.index])
    top.plot([SLOW_AT], [2], marker="v", color="sienna", markeredgecolor="black", ms=10, label="slow (x3)")
    top.plot([flag["step"]], [2], marker="*", color="sienna", markeredgecolor="black", ms=14,
             label="flagged and dropped")
    top.legend(loc="upper left", fontsize=8)
    fig.colorbar(image, ax=(top, bottom), label="strip: x step median", pad=0.01, shrink=0.45, anchor=(0, 1))
    top.set_title("per-rank step time (each rank's own CPU per step)")
    for run, name, colour in ((result, "slow rank 2 of 4, dropped (shrink)", "crimson"),
                              (base, "failure-free, world 3", "grey")):
        frame = run.to_dataframe()
        bottom.plot(frame.step, frame.rank_step_time * 1e3, color=colour, label=name)
    bottom.axvline(flag["step"], color="sienna", linestyle="--", linewidth=1)
    bottom.set_ylabel("step time (ms,\nrank-time clock)")
    bottom.set_xlabel("step")
    bottom.legend(fontsize=8)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    after = statistics.median(r["rank_step_time"] for r in result.metrics if r["step"] >= flag["step"] + 10)
    reference = statistics.median(r["rank_step_time"] for r in base.metrics if r["step"] >= flag["step"] + 10)
    before = statistics.median(r["rank_step_time"] for r in result.metrics if 5 <= r["step"] < SLOW_AT)
    slowed = statistics.median(r["rank_step_time"] for r in result.metrics if SLOW_AT <= r["step"] <= flag["step"])
    print(f"{flag['detail']}\nrank-time step: {before * 1e3:.2f} ms before, {slowed * 1e3:.2f} ms slowed, "
          f"{after * 1e3:.2f} ms after the drop against {reference * 1e3:.2f} ms failure-free at world 3 "
          f"({100 * (after / reference - 1):+.1f} %); wrote {out}")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parents[1] / "docs/img/stragglers.png")
