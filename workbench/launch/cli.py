"""Command line: ``workbench run | rank | sweep | report | flip | compare | verify | scale``. Exit codes: 0
completed, 1 failed or stopped, 2 usage or configuration error (one line on stderr, no traceback)."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from workbench.base.errors import ConfigError, WorkbenchError
from workbench.base.interrupts import interrupted_once
from workbench.config.fields import run_flags
from workbench.config.run import RunConfig
from workbench.faults import events as ev
from workbench.launch.cli_files import add_file_parsers, cmd_compare, cmd_flip, cmd_verify, file_errors
from workbench.strategies.scale.command import add_scale_parser, cmd_scale


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit 2
        self.exit(2, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="workbench", description="Fault-tolerance workbench for distributed training")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    run = sub.add_parser("run", help="run one training run", description="Run one multi-process training run.")
    for flag, options in run_flags():  # one per RunConfig field with a flag: workbench/config/fields.py
        run.add_argument(flag, **options)
    run.add_argument("--hosts-file", type=Path, help="one line per host: ADDRESS SLOTS [LAUNCH ...]; the first is "
                     "this machine (docs/sweeps-and-clusters.md: Runs beyond one machine)")
    run.add_argument("--slurm", nargs="?", const=0, type=int, metavar="N", help="inside a Slurm allocation: N "
                     "ranks (default one per task) on its nodes, this node's forked here, the others' started "
                     "through srun (docs/sweeps-and-clusters.md)")
    run.add_argument("--config", type=Path, help="YAML file of run settings (flags override it)")
    run.add_argument("--out", type=_directory, help="output directory (default runs/<timestamp>), this run's alone "
                     "while it runs: one another run holds, or one holding an earlier run, is refused (exit 2; the "
                     "latter unless --overwrite)")
    run.add_argument("--overwrite", action="store_true", help="replace the run in --out (its result.h5, checkpoints "
                     "and logs are removed as the new run starts, but for the checkpoint --resume names; nothing "
                     "else there)")
    run.add_argument("--json", action="store_true", help="print the JSON summary as the last stdout line")
    run.add_argument("--track", metavar="URI",
                     help="log the run to MLflow (http://HOST:PORT, sqlite:///mlflow.db) once it ended")
    add_file_parsers(sub)
    add_scale_parser(sub)
    rank = sub.add_parser("rank", help="join a run started elsewhere as one of its ranks",
                          description="Start one rank process that joins the run whose store listens at --store "
                          "(workbench run --bind ADDRESS --store-port PORT, or a hosts file). It takes rank "
                          "--rank-hint (default $RANK, as set by torchrun), or any free slot of a host whose ranks "
                          "join by themselves; it ends with the run.")
    rank.add_argument("--store", required=True, metavar="HOST:PORT", help="the run's store")
    rank.add_argument("--rank-hint", help="the rank number to take (default: $RANK if set)")
    rank.add_argument("--connect-timeout", default="60", help="seconds (> 0) to wait for the run to answer: "
                      "exit 2 in one line if none does, 130 on Ctrl-C or SIGTERM")
    _add_sweep_parsers(sub)
    return parser


def _directory(text: str) -> Path:
    """An --out: any path but an empty one (which would be the current directory, unasked)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("an empty path is not allowed: give a directory ('.' for the current one)")
    return Path(text)


def _config_from_args(args: argparse.Namespace) -> RunConfig:
    values: dict[str, Any] = RunConfig.from_yaml(args.config).to_dict() if args.config else {}
    for _, options in run_flags():  # the flags given (each defaults to "not given")
        if hasattr(args, options["dest"]):
            values[options["dest"]] = getattr(args, options["dest"])
    if args.hosts_file is not None and args.slurm is not None:
        raise ConfigError("slurm", "give --slurm or --hosts-file, not both")
    if args.hosts_file is not None or args.slurm is not None:
        from workbench.base.hosts_file import read_hosts_file
        from workbench.launch.slurm_allocation import allocation_hosts

        values["hosts"] = (read_hosts_file(args.hosts_file) if args.slurm is None
                           else allocation_hosts(args.slurm or getattr(args, "world_size", None)))
        if not hasattr(args, "bind"):
            values.pop("bind", None)  # the first host's address
        if not hasattr(args, "world_size"):
            values["world_size"] = sum(h["slots"] for h in values["hosts"])
    return RunConfig.from_dict(values)


def _progress(kind: str, payload: dict[str, Any]) -> None:
    if kind == "step" and payload["test_acc"] == payload["test_acc"]:  # not NaN: an evaluation step
        print(f"step {payload['step'] + 1:>6}  loss {payload['loss']:.4f}  test_acc {payload['test_acc']:.4f}  "
              f"world {payload['world_size']}  gen {payload['generation']}", file=sys.stderr, flush=True)
    elif kind == "event" and not ev.get(payload["kind"]).quiet:
        print(f"[{payload['time']:7.2f}s] {payload['kind']}: {payload['detail']}", file=sys.stderr, flush=True)


def _fallbacks(kind: str, payload: dict[str, Any]) -> None:
    """With ``--json`` (stdout is the summary's): a fallback is still said, one warning line on stderr."""
    if kind == "event" and ev.kind_is(payload, ev.FALLBACK):
        print(f"workbench: warning: {payload['detail']}", file=sys.stderr, flush=True)


def cmd_run(args: argparse.Namespace) -> int:
    """``workbench run``: the one door, :func:`workbench.launch.session.start`, as ``workbench.run`` goes through
    it. Its configuration is prepared first (every ConfigError, exit 2, before the rank template starts) and the
    template is started before the session is imported, so that torch's import there overlaps the session's
    here; ``start`` takes the prepared configuration as it is (:func:`~workbench.config.preflight.prepare`)."""
    config = _config_from_args(args)
    from workbench.results.tracking import for_command_line

    track = for_command_line(args.track)  # TrackingUnavailable (exit 2) before any process starts
    from workbench.config.preflight import prepare
    from workbench.results.outdir import fresh

    config = prepare(config)  # every ConfigError (exit 2) before the first process, the rank template included
    out = args.out or fresh(Path("runs") / time.strftime("run-%Y%m%d-%H%M%S"), make=True)
    if config.spawn == "template":
        from workbench.supervisor.template import prewarm

        prewarm()  # the template imports torch while this process imports the session: the two overlap
    from workbench.launch.session import start

    handle = start(config, out=out, on_event=_fallbacks if args.json else _progress, track=track,
                   overwrite=args.overwrite)
    result = handle.wait()
    return _say(_summary_lines(result.summary, args.json), result.summary, 0 if result.completed else 1)


def _summary_lines(summary: dict[str, Any], as_json: bool) -> list[str]:
    if as_json:
        return [json.dumps(summary)]
    acc = summary["final_test_accuracy"]
    lines = [f"outcome: {summary['outcome']} ({summary['reason']})",
             f"steps: {summary['steps_completed']}  test accuracy: {'-' if acc is None else f'{acc:.4f}'}  "
             f"world size: {summary['world_size_initial']} -> {summary['world_size_final']}  "
             f"wall: {summary['wall_s']:.1f} s"]
    for f in summary["failures"]:
        lines.append(f"failure: rank {f['rank']} at step {f['step']} {f['cause']}; detected in "
                     f"{f['detection_s']:.3f} s"
                     + (f", resumed in {f['resume_s']:.3f} s" if f["resume_s"] is not None else "")
                     + (f", world regrown in {f['regrow_s']:.3f} s" if f.get("regrow_s") is not None else "")
                     + f"; steps redone {f['steps_redone']}, samples lost {f['samples_lost']}, "
                       f"world size after {f['world_size_after']}")
    lines.append(f"result: {summary['result_path'] or 'not written'}")
    return lines


def _say(lines: list[str], summary: dict[str, Any], code: int) -> int:
    """Print the run's summary; a stdout that cannot take it (a full device, a closed pipe) is one line on stderr
    and exit 1, the result kept (stdout then goes to /dev/null, so that the exit's flush cannot fail again)."""
    try:
        sys.stdout.write("".join(line + "\n" for line in lines))
        sys.stdout.flush()
        return code
    except OSError as exc:
        from workbench.base.h5files import reason

        try:
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, sys.stdout.fileno())
            os.close(null)
        except (OSError, ValueError, AttributeError):  # a stdout without a descriptor (captured)
            pass
        kept = (f"the result is kept in {summary['result_path']}" if summary["result_path"]
                else f"the result was not written either ({summary.get('result_error') or summary['reason']})")
        print(f"workbench: error: cannot write the summary to stdout: {reason(exc)}; the run {summary['outcome']} "
              f"and {kept}", file=sys.stderr)
        return 1


def _seconds(text: str) -> float:
    """A --timeout: a finite number of seconds > 0 (argparse answers anything else in one line, exit 2)."""
    value = float(text)
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} is not allowed: a finite number of seconds > 0")
    return value


def _add_sweep_parsers(sub: Any) -> None:
    sweep = sub.add_parser("sweep", help="run a notebook over a grid of parameters (papermill), resumable",
                           description="Run NOTEBOOK at every point of the grid that is not complete under --out: "
                           "each point in its own papermill run, at most --jobs at a time; DIR/<point id>/ gets the "
                           "executed notebook and result.h5, DIR/results.h5 the table of all points.")
    sweep.add_argument("notebook", type=Path)
    sweep.add_argument("-p", "--parameter", dest="parameters", nargs="+", action="append", default=[],
                       metavar=("NAME", "VALUE"), help="a parameter and its values (read as YAML: 0 is an int, "
                       "true a bool, [1, 2] a list); repeat for the cartesian product")
    sweep.add_argument("--grid", type=Path, help="YAML file: a mapping name: [values] (cartesian product) or a "
                       "list of mappings (points); combined with every -p point")
    sweep.add_argument("--out", type=_directory, required=True, help="sweep directory (created; re-use it to resume)")
    sweep.add_argument("--emit", choices=["slurm"], help="run nothing; write DIR/sweep.slurm, a Slurm job array "
                       "with one task per point (sbatch it; docs/sweeps-and-clusters.md)")
    sweep.add_argument("--executor", choices=["local", "slurm"], default="local", help="local: worker processes "
                       "here (default); slurm: submit the incomplete points as a job array (sbatch), wait, then "
                       "write the table and DIR/report.html; Ctrl-C cancels the array")
    sweep.add_argument("--sbatch", action="append", default=[], metavar="OPTIONS",
                       help="with --executor slurm or --emit slurm: sbatch options for every task, e.g. "
                       "--sbatch='--partition=cpu --time=00:20:00' (repeatable)")
    sweep.add_argument("--point", type=int, metavar="I", help="run only point I of DIR/array.json (what each "
                       "task of the emitted job array does); NOTEBOOK and -p are taken from DIR")
    sweep.add_argument("--jobs", type=int, help="points at a time (default: min(cores, 2 x cores / the points' "
                       "world_size), at least 1)")
    sweep.add_argument("--skip-failed", action="store_true", help="do not retry points that failed before")
    sweep.add_argument("--timeout", type=_seconds, help="seconds a cell may run before its point fails")
    sweep.add_argument("--kernel", help="Jupyter kernel name (default: the notebook's)")
    sweep.add_argument("--dry-run", action="store_true", help="print the points and which would run, run nothing")
    sweep.add_argument("--no-progress", action="store_true", help="no progress bar")
    sweep.add_argument("--track", metavar="URI", help="log the sweep to MLflow once its points ran (run --track)")
    report = sub.add_parser("report", help="one self-contained HTML page of sweeps' figures and points",
                            description="Render the plotly figures that fit each sweep DIR (strategy trade-off, "
                            "bit sensitivity, gossip vs allreduce, recovery timelines) and its table of points, "
                            "into one page that needs no network.")
    report.add_argument("directories", type=Path, nargs="+", metavar="DIR",
                        help="sweep directories (one section each)")
    report.add_argument("--out", type=Path, help="HTML file (default: report.html in the first DIR)")


def _cmd_sweep(args: argparse.Namespace) -> int:
    from workbench.base.errors import SweepError
    from workbench.launch.sweeps.run import grid_points, is_complete, parse_value, point_id, sweep

    parameters: dict[str, list[Any]] = {}
    for name, *values in args.parameters:
        if name in parameters:
            raise SweepError(f"parameter {name!r} given twice")
        if not values:
            raise SweepError(f"parameter {name!r} has no values (-p {name} V1 V2 ...)")
        parameters[name] = [parse_value(v) for v in values]
    if args.point is not None:
        from workbench.launch.sweeps.run import run_array_task

        if parameters or args.grid or args.emit:
            raise SweepError("--point runs a point of DIR/array.json: give no -p, --grid or --emit with it")
        status = run_array_task(args.out, args.point, kernel_name=args.kernel, timeout=args.timeout)
        print(f"point {args.point} ({status['id']}): "
              + ("already complete" if status["skipped"] else status["status"])
              + (f": {status['error']}" if status.get("error") else ""))
        return 0 if status["status"] == "completed" or status.get("requeued") else 1
    if args.emit:
        from workbench.launch.sweeps.run import emit_slurm

        path = emit_slurm(args.notebook, parameters, grid=args.grid, out=args.out, kernel_name=args.kernel,
                          timeout=args.timeout, sbatch=args.sbatch)
        print(f"job array: {path} (sbatch {path})")
        return 0
    if args.dry_run:
        from workbench.launch.sweeps.run import notebook_parameters

        declared = notebook_parameters(args.notebook)
        points = grid_points(parameters, args.grid)
        unknown = sorted({k for p in points for k in p} - set(declared))
        if unknown:
            raise SweepError(f"{args.notebook.name} has no parameter {', '.join(map(repr, unknown))}")
        for p in points:
            done = is_complete(args.out / point_id(p))
            print(f"{'complete' if done else 'to run  '}  {point_id(p)}  {json.dumps(p)}")
        return 0
    options = dict(grid=args.grid, out=args.out, jobs=args.jobs, retry_failed=not args.skip_failed,
                   progress=False if args.no_progress else None, kernel_name=args.kernel, timeout=args.timeout)
    if args.executor == "slurm":
        from workbench.launch.sweeps.slurm_run import sweep_slurm

        frame = sweep_slurm(args.notebook, parameters, sbatch=args.sbatch, **options)
    else:
        frame = sweep(args.notebook, parameters, **options)
    attrs = frame.attrs
    for pid in attrs["failed"]:
        row = frame[frame.point == pid].iloc[0]
        print(f"failed: {pid}: {row.error}")
    preempted = attrs.get("preempted", [])
    print(f"{len(frame)} points: {len(attrs['executed'])} executed "
          f"({len(attrs['completed'])} completed, {len(attrs['failed'])} failed"
          + (f", {len(preempted)} preempted: run the sweep again to resume them" if preempted else "")
          + f"), {len(attrs['skipped'])} already complete; table: {args.out / 'results.h5'}"
          + (f"; Slurm job {attrs['job']}" if attrs.get("job") else "")
          + (f"; report: {attrs['report']}" if attrs.get("report") else ""))
    return 1 if attrs["failed"] or preempted else 0


def cmd_report(args: argparse.Namespace) -> int:
    from workbench.launch.sweeps.report import report_command

    path = report_command(args.directories, out=args.out)
    print(f"report: {path.resolve()}")
    return 0


def cmd_rank(args: argparse.Namespace) -> int:
    from workbench.rank.join import join_run

    hint = args.rank_hint if args.rank_hint is not None else os.environ.get("RANK")
    try:
        joined = join_run(args.store, args.connect_timeout, hint)  # checked and found before torch is imported
    except KeyboardInterrupt:
        print(f"workbench: interrupted while waiting for the run at {args.store}", file=sys.stderr)
        return 130
    from workbench.rank.main import main as rank_main

    rank_main(["--store", args.store], joined=joined)  # ends the process (os._exit) when the run ends
    return 0


def cmd_sweep(args: argparse.Namespace) -> int:
    from workbench.launch.sweeps.tracking import tracked_command

    return tracked_command(args, _cmd_sweep)  # --track: the sweep logged to MLflow once its points ran


def main(argv: list[str] | None = None) -> int:
    """``workbench ARGV`` (None: this process's command line, whose exit code this is: a signal while it ends is
    then ignored). The first SIGINT, SIGTERM or SIGHUP (a closed terminal) stops the run (every rank, a checkpoint
    being written finished or removed) and makes the exit code 130 (129 for SIGHUP), whatever comes after; more are
    ignored. SIGQUIT (Ctrl-\\) keeps its default: the process aborts at once."""
    parser = build_parser()
    args = parser.parse_args(argv)
    with interrupted_once(process=argv is None) as interrupts:  # run.wait() stops the run on the way out
        commands = {"run": cmd_run, "flip": file_errors(cmd_flip), "compare": file_errors(cmd_compare),
                    "verify": file_errors(cmd_verify), "sweep": file_errors(cmd_sweep),
                    "report": file_errors(cmd_report), "rank": cmd_rank, "scale": cmd_scale}
        try:
            code: int | None = commands[args.command](args)
        except WorkbenchError as exc:
            print(f"workbench: error: {exc}", file=sys.stderr)
            code = 2
        except KeyboardInterrupt:
            code = None  # said below
        if interrupts.signalled or code is None:
            from workbench.base.interrupts import HangUp

            hangup = interrupts.code == 129
            if "workbench.launch.session" in sys.modules:  # a run started before the interrupt reached its wait()
                session = sys.modules["workbench.launch.session"]
                session.stop_all(session.interrupt_reason(HangUp() if hangup else None), wait=30.0)
            if code != 130:  # 130: the command said why itself (workbench rank)
                _tell("workbench: hangup (SIGHUP: the terminal closed); all ranks stopped" if hangup
                      else "workbench: interrupted; all ranks stopped")
            code = interrupts.code if interrupts.signalled else 130
    return code


def _tell(line: str) -> None:
    """``line`` on stderr; one that cannot be written (the terminal of a SIGHUP is gone) is lost, and stdout and
    stderr then go to /dev/null, so that the exit's flush cannot fail and change the exit code."""
    try:
        print(line, file=sys.stderr, flush=True)
    except OSError:
        try:
            null = os.open(os.devnull, os.O_WRONLY)
            for stream in (sys.stdout, sys.stderr):
                os.dup2(null, stream.fileno())
            os.close(null)
        except (OSError, ValueError, AttributeError):  # a stream without a descriptor (captured)
            pass


if __name__ == "__main__":
    sys.exit(main())
