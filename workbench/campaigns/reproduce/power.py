"""Power before registration: each sampled finding of registry.yaml carries a ``power`` block (the
smallest effect of interest, the spread and where it comes from, the n for 80 % power at its paper's next attempt's
alpha, the n registered) or is declared descriptive; :func:`~.registry.required_n` recomputes the block's n from
its numbers (:mod:`workbench.campaigns.reproduce.stats`), :func:`powered` says an underpowered finding's power
beside its decision (a note: the decision stands), and :func:`table` lists every block for the report and the
docs."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from workbench.campaigns.reproduce.registry import Decision, Finding


def powered(finding: Finding, decision: Decision) -> Decision:
    """A decision of an underpowered or descriptive finding with its power said in its detail (registered n below
    the n its power requires, or declared descriptive); its status stands. Power is the chance of telling an effect
    apart, not a verdict: an interval wholly past the margin does not hold however few values made it, one wholly
    on the claim's side holds at the alpha that made it (a small n widens the interval, it does not make a false
    claim pass more often), and one that straddles the margin is inconclusive (:func:`~.registry.decide`)."""
    if not finding.underpowered:
        return decision
    p = finding.power or {}
    why = (f"descriptive ({p.get('reason')})" if p.get("descriptive") else
           f"underpowered: n = {p.get('n_registered')} registered, {p.get('n_required')} needed for 80 % power")
    return replace(decision, detail=f"{decision.detail}; {why}")


def table(findings: Any = None) -> list[dict[str, Any]]:
    """One row per registered finding: key, kind, test, margin and its power block's figures (``status``:
    powered, underpowered, descriptive or mechanism)."""
    from workbench.campaigns.reproduce import registry

    rows = []
    for f in (findings or registry.load().findings).values():
        p = f.power or {}
        status = ("mechanism" if f.kind == "mechanism" else "descriptive" if p.get("descriptive") else
                  "underpowered" if f.underpowered else "powered" if p else "no power block")
        rows.append({"key": f.key, "kind": f.kind, "test": f.test, "margin": f.margin, "status": status,
                     **{k: p.get(k) for k in ("sesoi", "sd", "alpha", "n_required", "n_registered")},
                     "reason": p.get("reason") or p.get("sd_source", "")})
    return rows
