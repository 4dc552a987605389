"""Render bench_recovery.py's JSON lines as a markdown table (docs/benchmarks.md): python benchmarks/table.py FILE..."""

from __future__ import annotations

import json
import sys


def fmt(value: object) -> str:
    if value is None:
        return "–"
    return f"{value:.3f}" if isinstance(value, float) else str(value)


def main(paths: list[str]) -> None:
    rows = []
    for path in paths:
        with open(path) as f:
            rows += json.loads(f.read().strip().splitlines()[-1])["rows"]
    steps = any("step_ms" in r for r in rows)  # bench_recovery --peers and later: per-step time and outcome
    print("| model (params) | world | strategy | kills | detection s | resume s | regrow s | steps redone "
          "| samples lost | overhead s | final world |" + (" step ms | step × ours | outcome |" if steps else ""))
    print("|---|---|---|---|---|---|---|---|---|---|---|" + ("---|---|---|" if steps else ""))
    for r in rows:
        extra = (f" {fmt(r.get('step_ms'))} | {fmt(r.get('step_vs_ours'))} | {r['outcome']} |" if steps else "")
        print(f"| {r['model']} ({r['params_m']}M) | {r['world_size']} | {r['strategy']} | {r['kills']} | "
              f"{fmt(r['detection_s'])} | {fmt(r['resume_s'])} | {fmt(r['regrow_s'])} | {r['steps_redone']} | "
              f"{r['samples_lost']} | {fmt(r['overhead_s'])} | {r['final_world_size']} |" + extra)


if __name__ == "__main__":
    main(sys.argv[1:])
