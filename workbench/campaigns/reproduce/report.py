"""``runs/reproduce/report.html``: per seed paper, the finding as the paper states it beside our figures, the
verdict (holds / holds at the ceiling: not evidence / does not hold / inconclusive / not comparable) with every
check's and registered test's numbers, the pre-registration's commit beside the results' and its deviations; first,
every archived registered run of every paper as its history (:mod:`workbench.campaigns.reproduce.history`), and
whether the archive holds records not committed.

Reads what the reproduction notebooks save under ``ROOT/<key>/`` (or in a sweep point directory below it):
``verdict.json``, ``figures/*.json`` and ``table.csv``; a finding without a verdict is *not run*. Self-contained.
``python -m workbench.campaigns.reproduce.report [ROOT] [--out FILE]`` (``make reproduce``'s end): exit 1 when a finding
does not hold or was not run; exit 2 in one line for a ROOT that is a file or an ``--out`` that cannot be written."""

from __future__ import annotations

import html
import os
import sys
import time
from pathlib import Path

from workbench.base.entry import OneLineParser, answer
from workbench.base.errors import WorkbenchError
from workbench.campaigns.reproduce import history
from workbench.campaigns.reproduce.common import (
    FAILS,
    FIGURES_DIR,
    HOLDS,
    INCONCLUSIVE,
    NOT_COMPARABLE,
    VERDICT_FILE,
    Verdict,
)
from workbench.campaigns.reproduce.registry import AT_CEILING, CEILING_GAP

# key -> notebook, in the order of the report
NOTEBOOKS = {
    "ccgrid22": "ccgrid22_resilience.ipynb",
    "jpdc24": "jpdc24_soft_errors.ipynb",
    "europmpi17": "europmpi17_mpi_needs.ipynb",
    "gossipgrad": "gossipgrad.ipynb",
    "apoptosis": "apoptosis.ipynb",
}
_COLOURS = {HOLDS: "#1a7f37", NOT_COMPARABLE: "#9a6700", INCONCLUSIVE: "#9a6700", AT_CEILING: "#9a6700"}


def find_verdict(root: Path, key: str) -> Path | None:
    """The newest ``verdict.json`` under ``root/key`` (a sweep keeps it in its point directory)."""
    found = sorted((root / key).rglob(VERDICT_FILE), key=lambda p: p.stat().st_mtime) if (root / key).is_dir() else []
    return found[-1] if found else None


def _order(key: str, results: str | None) -> str:
    """Whether the results ran under this paper's registration as it reads now, in words."""
    from workbench.campaigns.reproduce import registry

    said = {True: "its registration, as it reads now, was committed before these results",
            False: "<b>its registration changed after these results</b>",
            None: "its registration cannot be checked against these results"}
    return said[registry.registered_at(key, results)]


def _section(key: str, path: Path | None, first_figure: list[bool]) -> str:
    import plotly.io as pio

    if path is None:
        return (f"<section><h2>{html.escape(key)}</h2><p class='status' style='color:#cf222e'>not run</p>"
                f"<p>No verdict under this key: run <code>notebooks/reproduce/{NOTEBOOKS[key]}</code>.</p></section>")
    v = Verdict.load(path)
    colour = _COLOURS.get(v.status, "#cf222e")
    checks = "".join(f"<tr><td>{'✔' if c.ok else '✘'}</td><td>{'mechanism check: ' if c.mechanism else ''}"
                     f"{html.escape(c.name)}</td>"
                     f"<td>{html.escape(c.detail)}</td></tr>" for c in v.checks)
    checks += "".join(f"<tr><td>{html.escape(d['status'])}</td><td>registered"
                      f"{' secondary' if d.get('secondary') else ''}: {html.escape(d['key'])} "
                      f"{html.escape(d['label'])}<br><small>{html.escape(d['claim'])}</small></td>"
                      f"<td>{html.escape(d['detail'])}</td></tr>" for d in v.decisions)
    figures = []
    for fig_path in sorted((path.parent / FIGURES_DIR).glob("*.json")):
        fig = pio.from_json(fig_path.read_text())
        figures.append(fig.to_html(full_html=False, include_plotlyjs=bool(first_figure[0])))
        first_figure[0] = False
    stats = "".join(f"<li><b>{html.escape(str(k))}</b>: {html.escape(str(val))}</li>"
                    for k, val in v.statistics.items())
    reason = f"<p><b>Not comparable:</b> {html.escape(v.reason)}</p>" if not v.comparable else ""
    return (f"<section><h2>{html.escape(v.title)}</h2>"
            f"<p class='status' style='color:{colour}'>{html.escape(v.status)} <small>(scale: "
            f"{html.escape(v.scale)})</small></p>{reason}"
            f"<div class='pair'><div class='paper'><h3>The paper</h3><p>{html.escape(v.paper)}</p>"
            f"<h3>Campaign</h3><ul>{stats}</ul></div><div class='ours'><h3>Ours</h3>{''.join(figures)}</div></div>"
            f"<table><tr><th></th><th>check</th><th>measured</th></tr>{checks}</table>"
            f"<p><small>{html.escape(str(path.parent))}; results from commit {html.escape(str(v.commit))}; "
            f"{_order(key, v.commit)}</small></p></section>")


def write_report(root: str | os.PathLike = "runs/reproduce", out: str | os.PathLike | None = None,
                 archive: str | os.PathLike = history.ARCHIVE_DIR) -> Path:
    """Assemble the report of every finding under ``root`` and of every registered run in ``archive``; returns its
    path (default ``root/report.html``)."""
    root = Path(root)
    out = Path(out) if out is not None else root / "report.html"
    first = [True]
    paths = {key: find_verdict(root, key) for key in NOTEBOOKS}
    studies = {key: find_verdict(root, key) for key in _studies()}  # a later study's, where it ran under root
    sections = [_archived(archive)] + [_section(key, path, first) for key, path in paths.items()]
    sections += [_section(key, path, first) for key, path in studies.items() if path is not None]
    verdicts = {key: Verdict.load(p).status if p else "not run" for key, p in paths.items()}
    summary = ""
    for k, s in verdicts.items():
        summary += (f"<li>{html.escape(k)}: <b>{html.escape(s)}</b> under {html.escape(str(root))}; every "
                    f"registered run: {html.escape(_history(k, archive))}</li>")
        summary += "".join(f"<li>{html.escape(_name(study))}: every registered run: "
                           f"{html.escape(_history(study, archive))}</li>" for study in _studies(k))
    summary += _registration()
    page = (
        "<!doctype html><html><head><meta charset='utf-8'><title>Reproduction of the seed papers</title><style>"
        "body{font-family:system-ui,sans-serif;margin:2em;max-width:1400px} .status{font-size:1.3em;font-weight:bold}"
        " .pair{display:flex;gap:2em} .paper{flex:1} .ours{flex:2} table{border-collapse:collapse}"
        " td,th{border:1px solid #ddd;padding:4px 8px;text-align:left;vertical-align:top}</style></head><body>"
        f"<h1>The seed papers' findings, reproduced</h1><p>Written {time.strftime('%Y-%m-%d %H:%M:%S')} from "
        f"{html.escape(str(root.resolve()))}. A finding holds when every check passes and every registered test "
        f"holds (its interval wholly on the claim's side of the registered margin; inconclusive when it straddles "
        f"it); an accuracy comparison that holds less than {100 * CEILING_GAP:g} pt below its data set's ceiling "
        f"reads '{AT_CEILING}', and so does a verdict resting on one.</p><ul>{summary}</ul>{''.join(sections)}"
        "</body></html>")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    tmp.write_text(page)
    os.replace(tmp, out)
    return out


def _studies(paper: str | None = None) -> list[str]:
    """The later studies registered (of ``paper``, or of every paper), in the report's order."""
    from workbench.campaigns.reproduce import registry

    try:
        reg = registry.load()
    except registry.RegistryError:
        return []
    return [key for key in history.registered_papers() if reg.study(key) > 1 and paper in (None, reg.paper_of(key))]


def _name(key: str) -> str:
    """A registration in words: ``ccgrid22_study2`` is "ccgrid22, study 2 (ccgrid22_study2)"."""
    from workbench.campaigns.reproduce import registry

    try:
        reg = registry.load()
    except registry.RegistryError:
        return key
    return f"{reg.paper_of(key)}, study {reg.study(key)} ({key})" if reg.study(key) > 1 else key


def _history(key: str, archive: str | os.PathLike) -> str:
    """``key``'s registered runs in order (:func:`~.history.history_line`) and how far the last one (else its
    registration) stands from the paper (:func:`~.history.distance`)."""
    kept = history.records(key, archive)
    line = history.history_line(kept, key)
    far = history.distance(key, kept[-1] if kept else None)
    return f"{line} (distance from the paper: {far})" if far else line


def _registration() -> str:
    """The pre-registration's commit (beside each finding's results commit) and its deviations."""
    from workbench.campaigns.reproduce import registry

    try:
        reg = registry.provenance()
    except registry.RegistryError as exc:
        return f"<li>pre-registration: <b>unreadable</b>: {html.escape(str(exc))}</li>"
    edited = " <b>(edited since: uncommitted changes)</b>" if reg["modified"] else ""
    deviations = "".join(f"<li>{html.escape(str(d['date']))} {html.escape(str(d['finding']))}: "
                         f"{html.escape(str(d['change']))} ({html.escape(str(d['why']))})</li>"
                         for d in reg["deviations"]) or "<li>none</li>"
    return (f"<li>pre-registered in <code>workbench/campaigns/reproduce/registry.yaml</code>, commit "
            f"{html.escape(str(reg['commit']))} ({html.escape(str(reg['date']))}){edited}; deviations after "
            f"reporting runs began:<ul>{deviations}</ul></li>")


def _archived(archive: str | os.PathLike) -> str:
    """Every archived registered run, per paper: its history line, then each attempt's verdict at its alpha with
    the condition its claims are made under, its findings' effects and intervals and where its figures come from."""
    pending = history.uncommitted(archive)
    warning = (f"<p class='status' style='color:#cf222e'>The archive has records not committed: "
               f"{html.escape(', '.join(pending))}. Commit them: a reporting run is not done until its record is."
               f"</p>" if pending else "")
    rows = []
    for key in history.registered_papers():  # the replications too, each shown "not run yet" until its record is
        kept = history.records(key, archive)
        rows.append(f"<h3>{html.escape(_name(key))}: {html.escape(history.history_line(kept, key))}</h3>")
        if not kept and history.distance(key):
            rows.append(f"<p><i>Distance from the paper:</i> {html.escape(history.distance(key))}</p>")
        rows += [_attempt(record) for record in kept]
    return (f"<section><h2>Every registered reporting run</h2>{warning}<p>From <code>{html.escape(str(archive))}"
            f"</code>, one record per run; each verdict at the alpha its attempt is given (registry.yaml, "
            f"<code>attempts</code>), the verdict as run beside it where it was decided at another.</p>"
            f"{''.join(rows)}</section>")


def _attempt(record: dict) -> str:
    esc = html.escape

    def finding(f: dict) -> str:
        was = f" (as run: {esc(f['status_run'])})" if f["status"] != f["status_run"] else ""
        second = "secondary (the verdict does not turn on it): " if f.get("secondary") else ""
        ceiling = f"; {esc(f['ceiling']['line'])}" if f.get("ceiling") else ""
        return (f"<li>{esc(f['status'])}{was}: {second}{esc(f['key'])} {esc(f.get('label', ''))}: {f['mean']:.3g} "
                f"[{f['low']:.3g}, {f['high']:.3g}], n = {f['n']}, {esc(f['test'].replace('_', '-'))} margin "
                f"{f['margin']:g}, alpha {f['alpha']:g}{ceiling}</li>")

    checks = "".join(f"<li>{'✔' if c['ok'] else '✘'} {esc(c['name'])}: {esc(c['detail'])}</li>"
                     for c in record.get("checks", []))
    files = ("its verdict, table and seeds kept in the record" if record.get("files") == "kept" else
             f"its files gone: figures as published in {esc(str(record.get('published_in')))}")
    alpha, alpha_run = record.get("alpha"), record.get("alpha_run")
    spent = f"alpha {alpha}" + (f" (run at {alpha_run})" if alpha_run not in (None, alpha) else "")
    spent += ", exploratory: beyond the attempt budget" if record.get("exploratory") else ""
    what = f": {esc(record['description'])}" if record.get("description") else ""
    files += _ceiling_of(record)
    far = history.distance(record["paper"], record)
    claim = f"<br><i>Distance from the paper:</i> {esc(far)}" if far else ""
    claim += f"<br><i>Claim:</i> {esc(record['claim'])}" if record.get("claim") else ""
    claim += f"<br><i>Erratum:</i> {esc(record['erratum'])}" if record.get("erratum") else ""
    return (f"<p><b>attempt {record['attempt']}, design {record.get('design')}</b> ({esc(str(record.get('date')))}"
            f"{what}): "
            f"<b>{esc(history.status(record))}</b>; {spent}; registry {esc(str(record.get('registry_commit')))}, "
            f"results {esc(str(record.get('results_commit')))}; {files}.<br><i>Under:</i> "
            f"{esc(record.get('condition', ''))}{claim}</p><ul>{''.join(map(finding, history.decided(record)))}"
            f"{checks}</ul>")


def _ceiling_of(record: dict) -> str:
    """The registered ceiling of the data set a record's accuracies were measured on, in words."""
    from workbench.campaigns.reproduce import registry

    try:
        ceilings = registry.load().ceilings
    except registry.RegistryError:
        return ""
    dataset = history.dataset_of(record, ceilings)
    ceiling = ceilings.get(dataset)
    if ceiling is None:
        return ""
    return (f"; its accuracies beside {html.escape(dataset)}'s ceiling, {100 * ceiling['accuracy']:.1f} % "
            f"({html.escape(ceiling['method'])})")


class ReportRefused(WorkbenchError):
    """A ROOT that is no directory, or an ``--out`` the page cannot be written to."""


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(prog="python -m workbench.campaigns.reproduce.report",
                           description=__doc__.split("\n")[0])
    parser.add_argument("root", nargs="?", default="runs/reproduce")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    return answer("report", lambda: _report(args.root, args.out), process=argv is None)


def _report(root: str, out: str | None) -> int:
    if not root.strip() or (Path(root).exists() and not Path(root).is_dir()):
        raise ReportRefused(f"ROOT {root!r} is not a directory: give the campaigns' output directory "
                            "(default runs/reproduce)")
    if out is not None and (not out.strip() or Path(out).is_dir()):
        raise ReportRefused(f"--out {out!r} is not allowed: give an HTML file to write (default ROOT/report.html)")
    try:
        path = write_report(root, out)
    except OSError as exc:
        target = out if out is not None else str(Path(root) / "report.html")
        raise ReportRefused(f"cannot write the report {target!r}: {exc.strerror or exc}"
                            + (f" ({exc.filename})" if exc.filename else "")) from None
    missed = []
    for key in [*NOTEBOOKS, *_studies()]:
        found = find_verdict(Path(root), key)
        verdict = Verdict.load(found) if found else None
        if key not in NOTEBOOKS and verdict is None:
            continue  # a later study not run under ROOT: its archived runs are listed below
        print(verdict.summary() if verdict else f"{key}: not run")
        if verdict is None or verdict.status == FAILS:
            missed.append(key)
    for key in history.registered_papers():
        print(f"{key}, every registered run: {_history(key, history.ARCHIVE_DIR)}")
    pending = history.uncommitted()
    if pending:  # said plainly: a reporting run is not done until its record is committed
        print(f"the archive has records not committed (commit them): {', '.join(pending)}", file=sys.stderr)
    print(f"report: {path}")
    if missed:  # after the report: a finding that does not hold (or was not run) fails `make reproduce`
        print(f"does not hold or not run: {', '.join(missed)}", file=sys.stderr)
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
