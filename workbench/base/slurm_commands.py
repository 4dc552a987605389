"""Slurm's client commands, as the workbench uses them: submit an array (``sbatch``), tell whether a job is still
queued or running (``squeue``), cancel it (``scancel``), read how its tasks ended (``scontrol``, else ``sacct``),
and expand a node list (``node[01-03],gpu7``, through ``scontrol show hostnames``).

Protocol: every command runs with a bounded timeout (``COMMAND_TIMEOUT_S``) and with the caller's environment
(``SLURM_CONF`` included). A command that cannot be run or times out raises ``SlurmUnavailable`` (one line); a
command that runs and refuses (``sbatch`` rejecting an option) raises ``SlurmError`` with Slurm's own first line.
Nothing here parses ``squeue`` for progress: a sweep's progress comes from its points' files; ``squeue`` only says
whether the job has ended.
"""

from __future__ import annotations

import itertools
import re
import shutil
import subprocess
from collections.abc import Sequence

from workbench.base.errors import WorkbenchError

COMMAND_TIMEOUT_S = 30.0
CLIENTS = ("sbatch", "squeue", "scancel")
ACTIVE_STATES = {"PENDING", "RUNNING", "SUSPENDED", "COMPLETING", "CONFIGURING", "REQUEUED", "REQUEUE_HOLD",
                 "REQUEUE_FED", "RESIZING", "SIGNALING", "STAGE_OUT", "STOPPED", "RESV_DEL_HOLD"}


class SlurmError(WorkbenchError):
    """A Slurm command refused what it was asked (its message, one line)."""


class SlurmUnavailable(WorkbenchError):
    """A Slurm command is missing, or did not answer in time."""


def missing_clients(names: Sequence[str] = CLIENTS) -> list[str]:
    """The Slurm client commands among ``names`` that are not on PATH."""
    return [n for n in names if shutil.which(n) is None]


def run(argv: list[str], timeout: float = COMMAND_TIMEOUT_S) -> subprocess.CompletedProcess:
    """Run a Slurm command; ``SlurmUnavailable`` if it cannot be started or does not answer within ``timeout``."""
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    except FileNotFoundError:
        raise SlurmUnavailable(f"{argv[0]} is not on PATH (Slurm's client commands are needed)") from None
    except subprocess.TimeoutExpired:
        raise SlurmUnavailable(f"{argv[0]} did not answer within {timeout:g} s") from None


def first_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[0] if lines else ""


def submit(script: str, options: Sequence[str] = ()) -> str:
    """``sbatch --parsable OPTIONS SCRIPT``; the job id. Options given here override the script's ``#SBATCH``
    lines (``--array=1,3%2``)."""
    done = run(["sbatch", "--parsable", *options, script])
    job = first_line(done.stdout).split(";")[0]
    if done.returncode != 0 or not job.isdigit():
        raise SlurmError(f"sbatch refused the job array: {first_line(done.stderr) or first_line(done.stdout)}")
    return job


def requeue(job: str) -> str | None:
    """``scontrol requeue JOB`` (a job may requeue itself: it is ended, then queued again); None when Slurm took
    it, else why not, in one line."""
    try:
        done = run(["scontrol", "requeue", job])
    except SlurmUnavailable as exc:
        return str(exc)
    return None if done.returncode == 0 else (first_line(done.stderr) or f"scontrol exited with {done.returncode}")


def task_states(job: str) -> dict[str, str] | None:
    """Task id (``J_i``) -> state of every task of the job that Slurm still lists, ended ones included (for
    ``MinJobAge`` seconds); a pending one's with its reason: ``PENDING (Resources)``. ``{}`` once Slurm has
    forgotten the job; None when ``squeue`` did not answer (retry later)."""
    try:
        done = run(["squeue", "-h", "-r", "-t", "all", "-j", job, "-o", "%i %T %r"])
    except SlurmUnavailable:
        return None
    if done.returncode != 0:
        return {} if "Invalid job id" in done.stderr else None
    states = {}
    for line in done.stdout.splitlines():
        words = line.split(None, 2)
        if len(words) >= 2:
            reason = words[2].strip() if len(words) == 3 and words[1] == "PENDING" else ""
            states[words[0]] = f"{words[1]} ({reason})" if reason and reason != "None" else words[1]
    return states


def is_active(state: str) -> bool:
    """Whether a state of :func:`task_states` is one of a task still queued or running."""
    return state.split(" ", 1)[0] in ACTIVE_STATES


def active_tasks(job: str) -> dict[str, str] | None:
    """The tasks of :func:`task_states` still queued or running: ``{}`` once the job has ended (or was
    forgotten); None when ``squeue`` did not answer."""
    states = task_states(job)
    return None if states is None else {task: state for task, state in states.items() if is_active(state)}


def cancel(job: str) -> None:
    """``scancel JOB`` (every task of an array); a job that already ended is no error."""
    done = run(["scancel", job])
    if done.returncode != 0 and "Invalid job id" not in done.stderr and "already completed" not in done.stderr:
        raise SlurmError(f"scancel {job} failed: {first_line(done.stderr)}")


def task_outcomes(job: str) -> dict[int, str]:
    """Array index -> how that task ended, ``STATE (exit X:Y)`` plus Slurm's reason when it gives one, for the
    tasks Slurm still knows: from ``scontrol show job`` (kept ``MinJobAge`` seconds after the end, 300 by
    default), else ``sacct`` (a cluster with accounting). Empty when neither answers."""
    found: dict[int, str] = {}
    try:
        done = run(["scontrol", "-o", "show", "job", job])
    except SlurmUnavailable:
        done = None
    if done is not None and done.returncode == 0:
        for line in done.stdout.splitlines():
            fields = dict(re.findall(r"(\w+)=(\S*)", line))
            reason = fields.get("Reason", "None")
            state, code = fields.get("JobState", "?"), fields.get("ExitCode", "?")
            for index in _indices(fields.get("ArrayTaskId", "")):  # "3", or "1,4-6%2" for tasks never started
                found[index] = f"{state} (exit {code}" + (f", {reason}" if reason not in ("None", "") else "") + ")"
    if found:
        return found
    try:
        done = run(["sacct", "-X", "-n", "-P", "-j", job, "-o", "JobID,State,ExitCode"])
    except SlurmUnavailable:
        return found
    for line in done.stdout.splitlines() if done.returncode == 0 else []:
        words = line.split("|")
        if len(words) == 3 and "_" in words[0] and words[0].rsplit("_", 1)[1].isdigit():
            found[int(words[0].rsplit("_", 1)[1])] = f"{words[1]} (exit {words[2]})"
    return found


def _indices(spec: str) -> list[int]:
    """Array indices of ``3``, ``1,4-6`` or ``1-7:2%4`` (step and throttle as sbatch writes them)."""
    found: list[int] = []
    for item in spec.split("%")[0].split(","):
        match = re.fullmatch(r"(\d+)(?:-(\d+)(?::(\d+))?)?", item)
        if match:
            low, high, step = int(match.group(1)), int(match.group(2) or match.group(1)), int(match.group(3) or 1)
            found += list(range(low, high + 1, step))
    return found


def expand_nodelist(nodelist: str) -> list[str]:
    """Slurm's compressed host list, expanded in order by Slurm itself (``scontrol show hostnames``):
    ``node[01-03,7],gpu1`` -> node01 node02 node03 node7 gpu1, ``rack[1-2]-node[01-02]`` -> rack1-node01
    rack1-node02 rack2-node01 rack2-node02. Where ``scontrol`` is not on PATH (a container inside a job), the same
    syntax is read here (:func:`expand_nodelist_here`). A ``SlurmError`` on a list Slurm cannot read; a
    ``SlurmUnavailable`` when ``scontrol`` does not answer."""
    if shutil.which("scontrol") is None:
        return expand_nodelist_here(nodelist)
    done = run(["scontrol", "show", "hostnames", nodelist])
    names = done.stdout.split()
    # scontrol says "Invalid hostlist" on stderr and still exits 0; an unclosed bracket comes back as a name
    if done.returncode != 0 or not names or done.stderr.strip() or any(c in n for n in names for c in "[],"):
        why = re.sub(r"^(scontrol: error: )?(_\w+: )?", "", first_line(done.stderr))  # no internal function name
        raise SlurmError(f"cannot read the node list {nodelist!r}" + (f": {why}" if why else ""))
    return names


def expand_nodelist_here(nodelist: str) -> list[str]:
    """:func:`expand_nodelist` without Slurm: names separated by commas outside brackets, each bracket a list of
    numbers and ranges (``01-03,7``: zero-padded to the width of the first number), every bracket of a name
    expanded, the first varying slowest. A ``SlurmError`` on a malformed list."""
    name = r"(?:[^\[\],]+|\[[^\[\]]*\])+"
    if not re.fullmatch(rf"{name}(?:,{name})*", nodelist):
        raise SlurmError(f"cannot read the node list {nodelist!r}")
    names: list[str] = []
    for part in re.findall(name, nodelist):
        choices: list[list[str]] = []
        for text, ranges in re.findall(r"([^\[]+)|\[([^\]]*)\]", part):
            choices.append([text] if text else _expand_ranges(ranges, nodelist))
        names += ["".join(pieces) for pieces in itertools.product(*choices)]
    return names


def _expand_ranges(ranges: str, nodelist: str) -> list[str]:
    """``01-03,7`` -> 01 02 03 7 (a bracket of :func:`expand_nodelist_here`)."""
    found: list[str] = []
    for item in ranges.split(","):
        match = re.fullmatch(r"(\d+)(?:-(\d+))?", item)
        if match is None or int(match.group(2) or match.group(1)) < int(match.group(1)):
            raise SlurmError(f"cannot read the node list {nodelist!r}: {item!r} is no number or range")
        low = match.group(1)
        found += [str(k).zfill(len(low)) for k in range(int(low), int(match.group(2) or low) + 1)]
    return found


def expand_tasks_per_node(spec: str) -> list[int]:
    """``SLURM_TASKS_PER_NODE`` expanded: ``2(x3),1`` -> [2, 2, 2, 1]."""
    counts: list[int] = []
    for item in spec.split(","):
        match = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", item.strip())
        if match is None:
            raise SlurmError(f"cannot read SLURM_TASKS_PER_NODE={spec!r}")
        counts += [int(match.group(1))] * int(match.group(2) or 1)
    return counts
