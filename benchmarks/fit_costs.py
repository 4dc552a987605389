"""Fit each recovery cost of benchmarks/results/costs.jsonl as a law of world size p and parameter count.

Per (strategy, cost), over the points' p50s, least squares fits four forms: a constant; a·log2 p + b; a·p + b;
and bytes over a bandwidth, A·params/b, with A the strategy's measured bytes moved per parameter per failure (4,
an fp32 parameter, where it moves none) and b fitted (only where the points span two model sizes). **The rule**:
each form's leave-one-out RMS error (fitted without a point, judged on it); the form with the fewest coefficients
whose error is within 10 % of the smallest wins (a constant and bytes have one, log and linear two; ties in
coefficients go to the smaller error). A form needs one point more than its coefficients; one point is a constant.
Writes cost_laws.json ({strategy: {cost: law}}, what ``workbench scale --costs`` reads), cost_fits.json (every
form, residuals, the points) and prints the markdown table of docs/scale.md. Usage:
    python benchmarks/fit_costs.py [--costs FILE] [--out DIR] [--markdown] [--docs docs/scale.md]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_costs  # noqa: E402  (the grid)

RESULTS = Path(__file__).resolve().parent / "results"
COST_STRATEGIES = tuple(bench_costs.STRATEGIES)
COEFFICIENTS = {"constant": 1, "bytes": 1, "log": 2, "linear": 2}
TOLERANCE = 0.10  # a simpler form wins while its leave-one-out error is within 10 % of the best
RULE = ("each form's leave-one-out RMS error (fitted without a point, judged on it); the form with the fewest "
        "coefficients whose error is within 10 % of the smallest wins (constant and bytes: one; log and linear: two; "
        "ties go to the smaller error); a form needs one point more than its coefficients; one point is a constant")
STATE_BYTES = 4.0  # bytes per parameter of an fp32 parameter: the bytes form's A where nothing is moved
# the scale model's costs (workbench.strategies.scale.Costs) from a point's measured p50s; the world's stall is
# detection plus these, so each leaves out what another already counts. None: the strategy has no such cost.
BEGIN, END = "<!-- cost-laws:begin (benchmarks/fit_costs.py --docs) -->", "<!-- cost-laws:end -->"
RESTARTS = ("checkpoint_restart", "torchrun")
LAW_COSTS = ("step_s", "detection_s", "settle_s", "join_s", "restart_s", "checkpoint_s")
COUNT_COSTS = ("bytes_moved", "steps_redone", "samples_lost")  # fitted and shown; the scale model implies them


def model_cost(strategy: str, cost: str, row: dict[str, Any]) -> float | None:
    """The p50 of ``cost`` (a Costs field, or a count) at one point, from its measured costs."""
    got = {name: value.get("p50") for name, value in row["costs"].items()}
    detection = got["detection_s"] or 0.0
    after = got["settle_s"] if got["settle_s"] is not None else got["resume_s"]  # fault to the agreed state
    if cost in ("step_s", "detection_s") or cost in COUNT_COSTS:
        return got[cost]
    if cost == "checkpoint_s":
        return got["checkpoint_stall_s"]
    if cost == "restart_s":  # a fresh world started and its checkpoint read (reload_s is inside it)
        return None if strategy not in RESTARTS or after is None else max(after - detection, 0.0)
    if strategy in RESTARTS:
        return None
    if cost == "join_s":
        if strategy == "torchft":  # the replica group's restart and heal from a live peer
            return None if got["regrow_s"] is None else max(got["regrow_s"] - detection, 0.0)
        return got["join_s"] if strategy in ("regrow", "reinit") else None
    if after is None:  # settle_s: the survivors' agreement
        return None
    joined = (got["join_s"] or 0.0) if strategy == "reinit" else 0.0  # reinit's join is a cost of its own
    return max(after - detection - joined, 0.0)


def fit_form(form: str, worlds: Sequence[float], params: Sequence[float], ys: Sequence[float],
             per_param: float) -> tuple[float, float] | None:
    """Least-squares (a, b) of ``form`` (None where it cannot be fitted: too few points, or no bandwidth)."""
    n = len(ys)
    if n < 1:
        return None
    if form == "constant":
        return sum(ys) / n, 0.0
    if form == "bytes":
        xs = [per_param * q for q in params]
        sxx = sum(x * x for x in xs)
        slope = sum(x * y for x, y in zip(xs, ys)) / sxx if sxx > 0 else 0.0
        return (per_param, 1.0 / slope) if slope > 0 else None
    xs = [math.log2(w) for w in worlds] if form == "log" else list(worlds)
    mean_x, mean_y = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mean_x) ** 2 for x in xs)
    if sxx == 0:
        return None
    a = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys)) / sxx
    return a, mean_y - a * mean_x


def evaluate(form: str, a: float, b: float, world: float, param: float) -> float:
    if form == "constant":
        return a
    if form == "bytes":
        return a * param / b
    return a * (math.log2(world) if form == "log" else world) + b


def fit(worlds: Sequence[float], params: Sequence[float], ys: Sequence[float],
        per_param: float = STATE_BYTES) -> dict[str, Any]:
    """Every form's fit of ``ys`` at (world, params) points and the one the rule chooses (module docstring)."""
    n = len(ys)
    candidates: dict[str, dict[str, Any]] = {}
    for form, count in COEFFICIENTS.items():
        if n < count + 1 and not (form == "constant" and n == 1):
            continue
        if form == "bytes" and len(set(params)) < 2:
            continue
        coefficients = fit_form(form, worlds, params, ys, per_param)
        if coefficients is None:
            continue
        a, b = coefficients
        residuals = [y - evaluate(form, a, b, w, q) for w, q, y in zip(worlds, params, ys)]
        held_out = []
        for i in range(n if n > 1 else 0):
            keep = [j for j in range(n) if j != i]
            left = fit_form(form, [worlds[j] for j in keep], [params[j] for j in keep], [ys[j] for j in keep],
                            per_param)
            if left is None:
                break
            held_out.append(ys[i] - evaluate(form, *left, worlds[i], params[i]))
        loo = math.sqrt(sum(r * r for r in held_out) / n) if len(held_out) == n and n > 1 else None
        candidates[form] = {"a": a, "b": b, "residuals": residuals, "rms": math.sqrt(sum(r * r for r in residuals) / n),
                            "loo_rms": loo}
    judged = {form: c for form, c in candidates.items() if c["loo_rms"] is not None}
    if not judged:  # one point: a constant
        chosen = "constant"
    else:
        best = min(c["loo_rms"] for c in judged.values())
        close = [form for form, c in judged.items() if c["loo_rms"] <= (1 + TOLERANCE) * best + 1e-12]
        chosen = min(close, key=lambda form: (COEFFICIENTS[form], judged[form]["loo_rms"]))
    return {"chosen": chosen, "candidates": candidates, "n": n}


def law_text(form: str, a: float, b: float) -> str:
    if form == "constant":
        return f"{a:.4g}"
    if form == "bytes":
        return f"{a:.4g}*params/{b:.4g}"
    return f"{a:.4g}*{'log(p)' if form == 'log' else 'p'}{b:+.4g}"


def load_rows(path: Path) -> list[dict[str, Any]]:
    """The measured points of ``path``; a point measured again is its last line."""
    rows = {(r["strategy"], r["model"], r["world"]): r for r in load_rows_all(path) if r.get("n_failures") and
            "costs" in r}
    return list(rows.values())


def fit_all(rows: list[dict[str, Any]]) -> tuple[dict[str, dict[str, Any]], dict[str, dict[str, Any]]]:
    """(laws in load_costs' format, every fit with its residuals) for every strategy and cost in ``rows``."""
    laws: dict[str, dict[str, Any]] = {}
    fits: dict[str, dict[str, Any]] = {}
    for strategy in dict.fromkeys(row["strategy"] for row in rows):
        mine = [row for row in rows if row["strategy"] == strategy]
        moved = [(model_cost(strategy, "bytes_moved", r) or 0.0) / r["params"] for r in mine]
        per_param = sorted(moved)[len(moved) // 2] or STATE_BYTES
        for cost in LAW_COSTS + COUNT_COSTS:
            points = [(r["world"], r["params"], model_cost(strategy, cost, r), r["model"]) for r in mine]
            points = [p for p in points if p[2] is not None]
            if not points:
                continue
            worlds, params, ys, models = (list(column) for column in zip(*points))
            result = fit(worlds, params, ys, STATE_BYTES if cost == "step_s" else per_param)
            chosen = result["candidates"][result["chosen"]]
            fits.setdefault(strategy, {})[cost] = {
                "law": law_text(result["chosen"], chosen["a"], chosen["b"]), "form": result["chosen"],
                "rms": chosen["rms"], "loo_rms": chosen["loo_rms"], "mean": sum(ys) / len(ys),
                "points": [{"model": m, "world": w, "params": q, "p50": y, "residual": r}
                           for m, w, q, y, r in zip(models, worlds, params, ys, chosen["residuals"])],
                "candidates": {form: {k: c[k] for k in ("a", "b", "rms", "loo_rms")}
                               for form, c in result["candidates"].items()}}
            if cost in LAW_COSTS:
                laws.setdefault(strategy, {})[cost] = {"form": result["chosen"], "a": chosen["a"], "b": chosen["b"]}
    return laws, fits


def missing_points(rows: list[dict[str, Any]]) -> list[str]:
    """The grid's points not in ``rows`` (bench_costs.GRID × STRATEGIES), smallest first."""
    have = {(r["strategy"], r["model"], r["world"]) for r in rows}
    return [f"{model}@{world} {strategy}" for model, world in bench_costs.GRID for strategy in bench_costs.STRATEGIES
            if (strategy, model, world) not in have]


def markdown(fits: dict[str, dict[str, Any]]) -> str:
    """The table of chosen laws: the law, its residual RMS and leave-one-out RMS (and both over the mean)."""
    lines = ["| strategy | cost | law (p: world size) | residual RMS | leave-one-out RMS | points |",
             "|---|---|---|---|---|---|"]
    for strategy, costs in fits.items():
        for cost, f in costs.items():
            scale = abs(f["mean"]) or 1.0
            loo = "–" if f["loo_rms"] is None else f"{f['loo_rms']:.3g} ({100 * f['loo_rms'] / scale:.0f} %)"
            where = ", ".join(sorted({f"{p['model']}@{p['world']}" for p in f["points"]},
                                     key=lambda t: (t.split("@")[0], int(t.split("@")[1]))))
            lines.append(f"| `{strategy}` | {cost} | `{f['law']}` | {f['rms']:.3g} ({100 * f['rms'] / scale:.0f} %) "
                         f"| {loo} | {where} |")
    return "\n".join(lines)


def docs_block(meta: dict[str, Any], fits: dict[str, dict[str, Any]]) -> str:
    """What docs/scale.md shows between its cost-laws markers: where the figures come from, the table, the gaps."""
    dates = " to ".join(dict.fromkeys(d[:10] for d in meta["dates"])) or "none"
    missing = meta["missing"]
    by_point: dict[str, list[str]] = {}
    for item in missing:
        point, strategy = item.split(" ", 1)
        by_point.setdefault(point, []).append(strategy)
    every = len(COST_STRATEGIES)
    gaps = (f"**Points still missing** ({len(missing)}; `python benchmarks/bench_costs.py` runs them, smallest "
            f"first): " + "; ".join(f"{point} {'every strategy and peer' if len(names) == every else ', '.join(names)}"
                                    for point, names in by_point.items()) + ".") if missing else \
        "Every point of the grid is measured."
    unavailable = ("\n\nUnavailable here: " + "; ".join(meta["unavailable"]) + ".") if meta["unavailable"] else ""
    commits = ", ".join(dict.fromkeys(c.split("+")[0] for c in meta["commits"]))  # each line keeps its +dirty
    return (f"Measured {dates}, commits {commits}, on {'; '.join(meta['machines'])}; "
            f"{meta['points']} points; fitted on each point's p50, {meta['clock']}.\n\n"
            f"{markdown(fits)}\n\n{gaps}{unavailable}")


def update_docs(page: Path, block: str) -> None:
    """Replace the text between ``page``'s cost-laws markers with ``block``."""
    text = page.read_text()
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    page.write_text(f"{head}{BEGIN}\n{block}\n{END}{tail}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--costs", default=str(RESULTS / "costs.jsonl"), help="the campaign's JSON lines")
    parser.add_argument("--out", default=str(RESULTS), help="where cost_laws.json and cost_fits.json go")
    parser.add_argument("--markdown", action="store_true", help="print the table of chosen laws")
    parser.add_argument("--docs", metavar="PAGE", help="rewrite PAGE's table between its cost-laws markers")
    args = parser.parse_args(argv)
    path = Path(args.costs)
    if not path.exists():
        parser.exit(2, f"fit_costs: {path}: no such file (run benchmarks/bench_costs.py first)\n")
    rows = load_rows(path)
    laws, fits = fit_all(rows)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "cost_laws.json").write_text(json.dumps(laws, indent=1) + "\n")
    meta = {"rule": RULE,
            "clock": "the rank-time clock where the ranks outnumber the cores, else the wall clock",
            "points": len(rows), "commits": sorted({r["commit"] for r in rows}),
            "machines": sorted({r["machine"] for r in rows}), "dates": [min(r["date"] for r in rows),
                                                                        max(r["date"] for r in rows)] if rows else [],
            "unavailable": [f"{r['model']}@{r['world']} {r['strategy']}: {r['unavailable']}"
                            for r in load_rows_all(path) if r.get("unavailable")],
            "missing": missing_points(rows)}
    (out / "cost_fits.json").write_text(json.dumps({"meta": meta, "fits": fits}, indent=1) + "\n")
    if args.docs:
        update_docs(Path(args.docs), docs_block(meta, fits))
    print(markdown(fits) if args.markdown else json.dumps(meta))
    return 0


def load_rows_all(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


if __name__ == "__main__":
    sys.exit(main())
