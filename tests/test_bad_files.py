"""Bad files and bad output places (issue 28): every file verb of the CLI (``flip``, ``compare``, ``verify``,
``report``, ``sweep``) and every public reader (``checkpoint.load``/``verify``/``datasets``, ``load_result``,
``load_results``, ``load_table``, ``load_sweep``, ``alter_checkpoint``, ``replay_checkpoint``,
``compare_checkpoints``, ``float_datasets``) answers a missing, empty, text, truncated, plain-HDF5, newer-format or
other-kind file, a directory, a path under a file, a read-only or full output place and a malformed ``sweep.json``
with one line (exit 2 on the command line, a WorkbenchError in Python), no traceback, and nothing left behind: no
file at ``--out``, no log, no hidden temporary file, the input unchanged.

Read-only and full places are tmpfs mounts (``mount -t tmpfs``: root, as CI runs; chmod does not stop root)."""

import json
import os
import subprocess
from pathlib import Path

import h5py
import pytest
import torch
from sweep_fixtures import fake_result, fake_sweep, fake_trials

from workbench.base import checkpoint
from workbench.base.checkpoint import Checkpoint
from workbench.base.errors import WorkbenchError
from workbench.base.h5files import (
    CHECKPOINT,
    FORMATS,
    RESULT,
    SWEEP_TABLE,
    TABLE,
    FileKindError,
    OutputError,
    inspect,
)
from workbench.campaigns.studies.sensitivity import save_trials
from workbench.faults.hdf5 import (
    NotComparable,
    alter_checkpoint,
    compare_checkpoints,
    float_datasets,
    replay_checkpoint,
)
from workbench.launch import cli
from workbench.launch.sweeps.run import load_sweep
from workbench.results.run_result import RunResult, load_results, load_table

TINY = Path(__file__).parent / "notebooks" / "tiny_sweep.ipynb"
W = "model/fc1.weight"


def make_checkpoint(path, width=8, inputs=4):
    model = {"fc1.weight": torch.full((width, inputs), 0.5), "fc1.bias": torch.full((width,), 0.5)}
    return checkpoint.save(path, Checkpoint(3, model, {}, config={"hidden": [width]}))


def truncated(d):
    data = make_checkpoint(d / "whole.h5").read_bytes()
    (d / "whole.h5").unlink()
    (d / "truncated.h5").write_bytes(data[:len(data) // 2])
    return d / "truncated.h5"


def newer(d):
    path = make_checkpoint(d / "newer.h5")
    with h5py.File(path, "r+") as f:
        f.attrs["format"] = 99
    return path


def plain(d):
    with h5py.File(d / "plain.h5", "w") as f:
        f["x"] = [1.0, 2.0]
    return d / "plain.h5"


def under_a_file(d):
    (d / "afile").write_text("x")
    return d / "afile" / "x.h5"


def _write(path, data):
    path.write_bytes(data)
    return path


def _mkdir(path):
    path.mkdir()
    return path


# name -> (maker in a directory, what the one line says)
BAD = {
    "missing": (lambda d: d / "missing.h5", "missing.h5 does not exist"),
    "empty": (lambda d: _write(d / "empty.h5", b""), "is empty (0 bytes)"),
    "text": (lambda d: _write(d / "text.h5", b"step,loss\n1,0.5\n"), "is not an HDF5 file (it holds text)"),
    "truncated": (truncated, "is a damaged HDF5 file (truncated)"),
    "directory": (lambda d: _mkdir(d / "dir.h5"), "is a directory, not a file"),
    "plain-hdf5": (plain, "is an HDF5 file but no workbench checkpoint, result or table"),
    "newer-format": (newer, "of layout format 99; this workbench reads format 1"),
    "under-a-file": (under_a_file, "afile is a file, not a directory"),
}


def main(capsys, *argv):
    code = cli.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def one_line(err, needle=""):
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("workbench: error: ") and "Traceback" not in err, err
    assert needle in lines[0], (needle, err)
    return lines[0]


def left_behind(root):
    """Hidden temporary files anywhere below ``root``."""
    return sorted(str(p) for p in Path(root).rglob(".*.tmp"))


def snapshot(root):
    return {str(p): p.read_bytes() for p in sorted(Path(root).rglob("*")) if p.is_file()}


@pytest.fixture
def good(tmp_path):
    return make_checkpoint(tmp_path / "good.h5")


@pytest.fixture
def tmpfs():
    """``tmpfs(directory, size="64k", readonly=False)`` mounts a tmpfs there; all are unmounted afterwards."""
    mounted = []

    def mount(directory, size="64k", readonly=False):
        if os.geteuid() != 0:
            pytest.skip("mounting a tmpfs needs root (CI runs as root)")
        directory.mkdir(parents=True, exist_ok=True)
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}" + (",ro" if readonly else ""), "tmpfs",
                        str(directory)], check=True, capture_output=True)
        mounted.append(directory)
        return directory

    yield mount
    for directory in reversed(mounted):
        subprocess.run(["umount", str(directory)], check=False, capture_output=True)


def fill(directory):
    """Fill a (small tmpfs) directory up to its last byte."""
    with open(directory / "filler", "wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * 4096)
        except OSError:
            pass


# ---------------------------------------------------------------------------------------------- inputs, CLI


CHECKPOINT_VERBS = {
    "flip --out": lambda bad, good, d: ["flip", bad, "--count", "1", "--out", d / "out.h5", "--log", d / "log"],
    "flip in place": lambda bad, good, d: ["flip", bad, "--dataset", W, "--index", "0", "--bit", "30"],
    "compare a": lambda bad, good, d: ["compare", bad, good],
    "compare b": lambda bad, good, d: ["compare", good, bad],
    "verify": lambda bad, good, d: ["verify", bad],
}


@pytest.mark.parametrize("case", list(BAD))
def test_checkpoint_verbs_answer_a_bad_file_in_one_line(tmp_path, capsys, good, case):
    make, needle = BAD[case]
    bad = make(tmp_path)
    before = snapshot(tmp_path)
    for verb, argv in CHECKPOINT_VERBS.items():
        code, out, err = main(capsys, *argv(bad, good, tmp_path))
        assert code == 2 and out == "", verb
        one_line(err, needle)
        assert snapshot(tmp_path) == before and not left_behind(tmp_path), verb  # no --out, no log, no change


def sweep_table(d):
    fake_sweep(d / "s")
    load_sweep(d / "s")
    return d / "s" / "results.h5"


OTHER_KINDS = {
    "result": (lambda d: fake_result("shrink", 0, "data").save(d / "run"), "is a run result (result.h5), not a "
               "workbench checkpoint"),
    "sweep table": (lambda d: sweep_table(d), "is a sweep table (results.h5), not a workbench checkpoint"),
    "table": (lambda d: save_trials(fake_trials(), d / "sensitivity.h5"), "is a workbench table (e.g. "
              "sensitivity.h5), not a workbench checkpoint"),
}


@pytest.mark.parametrize("kind", list(OTHER_KINDS))
def test_checkpoint_verbs_refuse_other_workbench_files(tmp_path, capsys, good, kind):
    make, needle = OTHER_KINDS[kind]
    other = make(tmp_path)
    before = snapshot(tmp_path)
    for verb in ("flip --out", "flip in place", "verify"):
        code, out, err = main(capsys, *CHECKPOINT_VERBS[verb](other, good, tmp_path))
        assert code == 2 and out == "", verb
        one_line(err, needle)
        assert snapshot(tmp_path) == before and not left_behind(tmp_path), verb


def test_verify_knows_a_result_from_a_checkpoint(tmp_path, capsys):
    result = fake_result("shrink", 0, "data").save(tmp_path / "run")
    code, _, err = main(capsys, "verify", result)
    assert code == 2
    assert "is a run result (result.h5), not a workbench checkpoint" in one_line(err) and "CORRUPT" not in err


def test_compare_of_unrelated_files_says_so(tmp_path, capsys, good):
    other = make_checkpoint(tmp_path / "other.h5", width=16)  # another model: other shapes
    with h5py.File(other, "r+") as f:
        f["model/fc2.weight"] = f["model/fc1.bias"][()]
    code, out, err = main(capsys, "compare", good, other)
    assert code == 2 and out == "" and "values changed" not in out
    line = one_line(err, "are not two states of one model")
    assert f"only in {other}: model/fc2.weight;" in line and "of another shape or dtype: model/fc1.bias, " \
        "model/fc1.weight" in line
    code, out, err = main(capsys, "compare", good, other, "--json")
    assert code == 2 and out == "" and one_line(err)
    code, out, err = main(capsys, "compare", good, other, "--partial")  # asked for: the rows, each difference named
    assert code == 0 and err == ""
    assert "model/fc2.weight: only in b" in out and "model/fc1.bias: shape or dtype differs" in out
    assert "no dataset in common; 3 datasets not compared" in out and "0 values changed" not in out
    result = fake_result("shrink", 0, "data").save(tmp_path / "run")
    code, out, err = main(capsys, "compare", good, result)
    assert code == 2 and "is a workbench checkpoint and" in one_line(err, "they cannot be compared")
    with pytest.raises(NotComparable, match="not two states of one model"):
        compare_checkpoints(good, other)
    rows = compare_checkpoints(good, other, strict=False)
    assert {r["dataset"]: r["note"] for r in rows if r["changed"] is None} == {
        "model/fc1.weight": "shape or dtype differs", "model/fc1.bias": "shape or dtype differs",
        "model/fc2.weight": "only in b"}


# ------------------------------------------------------------------------------------------- inputs, Python


def _replay(path):
    return replay_checkpoint(path, [{"target": W, "index": 0, "mask": 1, "old": 0.5, "new": 0.5}])


CHECKPOINT_APIS = {
    "checkpoint.load": lambda p, good, d: checkpoint.load(p),
    "checkpoint.load(check=False)": lambda p, good, d: checkpoint.load(p, check=False),
    "checkpoint.verify": lambda p, good, d: checkpoint.verify(p),
    "checkpoint.datasets": lambda p, good, d: checkpoint.datasets(p),
    "alter_checkpoint": lambda p, good, d: alter_checkpoint(p, count=1, out=d / "out.h5"),
    "replay_checkpoint": lambda p, good, d: _replay(p),
    "float_datasets": lambda p, good, d: float_datasets(p),
    "compare_checkpoints a": lambda p, good, d: compare_checkpoints(p, good),
    "compare_checkpoints b": lambda p, good, d: compare_checkpoints(good, p),
}


@pytest.mark.parametrize("case", list(BAD))
def test_checkpoint_apis_raise_one_line(tmp_path, good, case):
    make, needle = BAD[case]
    bad = make(tmp_path)
    before = snapshot(tmp_path)
    for api, call in CHECKPOINT_APIS.items():
        with pytest.raises(FileKindError) as caught:
            call(bad, good, tmp_path)
        assert needle in str(caught.value) and "\n" not in str(caught.value), api
        assert snapshot(tmp_path) == before and not left_behind(tmp_path), api


RESULT_APIS = {
    "RunResult.load": lambda p: RunResult.load(p),
    "load_results": lambda p: load_results(p),
    "load_table": lambda p: load_table(p),
}


@pytest.mark.parametrize("case", [*BAD, "checkpoint"])
def test_result_and_table_loaders_raise_one_line(tmp_path, case):
    if case == "checkpoint":
        bad, needle = make_checkpoint(tmp_path / "c.h5"), "is a workbench checkpoint, not a"
    else:
        make, needle = BAD[case]
        bad = make(tmp_path)
    for api, call in RESULT_APIS.items():
        expected = needle
        if api == "load_results" and case in ("missing", "directory", "under-a-file"):
            expected = "no result.h5 found"  # a folder or glob without any result
        if api == "RunResult.load" and case == "directory":
            expected = "dir.h5/result.h5 does not exist"  # a run's directory stands for its result.h5
        with pytest.raises(WorkbenchError) as caught:
            call(bad)
        assert expected in str(caught.value) and "\n" not in str(caught.value), api


def test_inspect_tells_each_kind(tmp_path, good):
    ids = fake_sweep(tmp_path / "s")
    load_sweep(tmp_path / "s")
    kinds = {CHECKPOINT: good, RESULT: tmp_path / "s" / ids[0] / "result.h5",
             SWEEP_TABLE: tmp_path / "s" / "results.h5", TABLE: tmp_path / "s" / ids[0] / "sensitivity.h5"}
    for kind, path in kinds.items():
        info = inspect(path)
        assert info.kind == kind and info.format == FORMATS[kind]
    assert inspect(good).datasets == {W: ((8, 4), "float32"), "model/fc1.bias": ((8,), "float32")}
    assert inspect(good).config == {"hidden": [8]}
    with h5py.File(kinds[RESULT], "r+") as f:  # a column of another length: a damaged layout
        del f["metrics/loss"]
        f["metrics/loss"] = [1.0]
    with pytest.raises(FileKindError, match="not 1-D columns of one length"):
        RunResult.load(kinds[RESULT])


# ------------------------------------------------------------------------------------------------ flip writes


REFUSED = {
    "bit out of range": (["--dataset", W, "--index", "0", "--bit", "99"], "allowed 0..31"),
    "index out of range": (["--dataset", W, "--index", "32", "--bit", "1"], "index 32 is out of range"),
    "negative index": (["--dataset", W, "--index", "-1", "--bit", "1"], "index -1 is out of range"),
    "unknown dataset": (["--dataset", "model/nope", "--count", "1"], "'model/nope' is not a float dataset"),
    "count too large": (["--count", "41"], "count 41 is out of range"),
    "negative count": (["--count", "-1"], "count -1 is out of range"),
    "probability": (["--probability", "2"], "probability 2.0 must be in [0, 1]"),
    "bits": (["--count", "1", "--bits", "x"], "bits 'x' must be a range"),
    "bit list": (["--count", "1", "--bits", "23-40"], "bit 32 is out of range"),
    "burst": (["--count", "1", "--burst", "0"], "burst 0 must be"),
    "exact and random": (["--dataset", W, "--index", "0", "--bit", "1", "--count", "1"], "not both"),
    "nothing": ([], "nothing to flip"),
    "exact, two datasets": (["--index", "0", "--bit", "1"], "an exact flip needs one dataset"),
}


@pytest.mark.parametrize("where", ["--out", "in place"])
def test_a_refused_flip_writes_nothing(tmp_path, capsys, good, where):
    out = ["--out", tmp_path / "out.h5"] if where == "--out" else []
    before = snapshot(tmp_path)
    for case, (options, needle) in REFUSED.items():
        code, stdout, err = main(capsys, "flip", good, *options, *out, "--log", tmp_path / "flips.jsonl")
        assert code == 2 and stdout == "", case
        one_line(err, needle)
        assert snapshot(tmp_path) == before and not left_behind(tmp_path), case  # no copy, no log, good unchanged


@pytest.mark.parametrize("where", ["--out", "in place"])
def test_an_unwritable_log_is_refused_before_any_flip(tmp_path, capsys, tmpfs, good, where):
    readonly = tmpfs(tmp_path / "ro", readonly=True)
    out = ["--out", tmp_path / "out.h5"] if where == "--out" else []
    for log, needle in ((tmp_path / "afile" / "flips.jsonl", "afile is a file, not a directory"),
                        (readonly / "flips.jsonl", "Read-only file system"), (tmp_path, "it is a directory")):
        (tmp_path / "afile").write_text("x")
        before = snapshot(tmp_path)
        code, stdout, err = main(capsys, "flip", good, "--count", "3", "--seed", "1", *out, "--log", log)
        assert code == 2 and stdout == ""
        assert f"cannot write {log}" in one_line(err, needle)
        assert snapshot(tmp_path) == before and not left_behind(tmp_path)


def test_flip_writes_the_log_and_the_copy(tmp_path, capsys, good):
    code, out, err = main(capsys, "flip", good, "--dataset", W, "--index", "5", "--bit", "30", "--out",
                          tmp_path / "sub" / "out.h5", "--log", tmp_path / "flips.jsonl")
    assert code == 0 and err == "" and "1 flips in" in out
    (entry,) = [json.loads(line) for line in (tmp_path / "flips.jsonl").read_text().splitlines()]
    assert entry["target"] == W and entry["index"] == 5 and entry["bits"] == [30]
    assert checkpoint.verify(good) == [] and checkpoint.verify(tmp_path / "sub" / "out.h5") == [W]
    assert not left_behind(tmp_path)
    copy = make_checkpoint(tmp_path / "copy.h5")  # the log replays onto a fresh copy, in place
    replay_checkpoint(copy, [entry])
    assert compare_checkpoints(copy, tmp_path / "sub" / "out.h5")[0]["changed"] == 0
    with pytest.raises(WorkbenchError, match=r"model/fc1.weight\[32\]"):
        replay_checkpoint(copy, [{**entry, "index": 32}])


OUT_PLACES = ["under a file", "directory", "read-only", "full"]


def out_place(tmp_path, tmpfs, place, name):
    """An output path that cannot be written, and what the one line says."""
    if place == "under a file":
        (tmp_path / "afile").write_text("x")
        return tmp_path / "afile" / name, "afile is a file, not a directory"
    if place == "directory":
        (tmp_path / name).mkdir()
        return tmp_path / name, "it is a directory"
    if place == "read-only":
        return tmpfs(tmp_path / "ro", readonly=True) / name, "Read-only file system"
    full = tmpfs(tmp_path / "full")
    fill(full)
    return full / name, "No space left on device"


@pytest.mark.parametrize("place", OUT_PLACES)
def test_flip_out_to_a_bad_place(tmp_path, capsys, tmpfs, good, place):
    out, needle = out_place(tmp_path, tmpfs, place, "out.h5")
    before = snapshot(tmp_path)
    code, stdout, err = main(capsys, "flip", good, "--count", "2", "--out", out, "--log", tmp_path / "flips.jsonl")
    assert code == 2 and stdout == ""
    assert f"cannot write {out}" in one_line(err, needle)
    assert snapshot(tmp_path) == before and not left_behind(tmp_path)  # no log either: it goes with the flips
    with pytest.raises(OutputError, match=needle):
        alter_checkpoint(good, count=2, out=out)


def test_an_in_place_flip_on_a_full_disk_leaves_the_file_whole(tmp_path, capsys, tmpfs):
    full = tmpfs(tmp_path / "full", size="64k")
    path = make_checkpoint(full / "big.h5", width=2000)  # ~40 kB: a second copy does not fit
    before = path.read_bytes()
    code, out, err = main(capsys, "flip", path, "--count", "100", "--seed", "1")
    assert code == 2 and out == ""
    one_line(err, "No space left on device")
    assert path.read_bytes() == before and not left_behind(full) and sorted(os.listdir(full)) == ["big.h5"]


# ------------------------------------------------------------------------------------- sweeps and the report


def bad_sweep(d, case):
    """A sweep directory that is no sweep, or whose sweep.json is malformed; the one line."""
    s = d / "s"
    if case == "missing":
        return s, "s is not a sweep directory (missing)"
    if case == "a file":
        s.write_text("x")
        return s, "s is not a sweep directory (a file)"
    s.mkdir()
    if case == "no sweep.json":
        return s, "s is not a sweep directory (no sweep.json)"
    if case == "sweep.json a directory":
        (s / "sweep.json").mkdir()
        return s, "sweep.json is a directory, not a sweep record"
    text = {"malformed JSON": '{"notebook": "nb.ipynb", "points": [', "not a mapping": "[1, 2]",
            "points not a list": '{"notebook": "nb.ipynb", "points": 3}', "empty": ""}[case]
    (s / "sweep.json").write_text(text)
    return s, ("is not a valid sweep record: malformed JSON" if case in ("malformed JSON", "empty")
               else "is not a valid sweep record: it needs 'notebook' and 'points'")


SWEEP_CASES = ["missing", "a file", "no sweep.json", "sweep.json a directory", "malformed JSON", "empty",
               "not a mapping", "points not a list"]


@pytest.mark.parametrize("case", SWEEP_CASES)
def test_report_and_load_sweep_answer_a_bad_sweep_in_one_line(tmp_path, capsys, case):
    s, needle = bad_sweep(tmp_path, case)
    before = snapshot(tmp_path)
    code, out, err = main(capsys, "report", s, "--out", tmp_path / "r.html")
    assert code == 2 and out == ""
    one_line(err, needle)
    assert snapshot(tmp_path) == before and not left_behind(tmp_path)
    with pytest.raises(FileKindError) as caught:
        load_sweep(s)
    assert needle in str(caught.value) and "\n" not in str(caught.value)


@pytest.mark.parametrize("case", ["sweep.json a directory", "malformed JSON", "empty", "not a mapping",
                                  "points not a list"])
def test_sweep_into_a_directory_with_a_bad_record_runs_nothing(tmp_path, capsys, case):
    s, needle = bad_sweep(tmp_path, case)
    before = snapshot(tmp_path)
    code, out, err = main(capsys, "sweep", TINY, "-p", "a", "1", "--out", s)
    assert code == 2 and out == ""
    one_line(err, needle)
    assert snapshot(tmp_path) == before and not left_behind(tmp_path) and not list(s.glob("a=*"))


@pytest.mark.parametrize("place", ["under a file", "a file", "read-only", "full"])
def test_sweep_to_a_bad_place(tmp_path, capsys, tmpfs, place):
    if place == "a file":
        out, needle = tmp_path / "s", "it is a file, not a directory"
        out.write_text("x")
    else:
        out, needle = out_place(tmp_path, tmpfs, place, "s")
    before = snapshot(tmp_path)
    code, stdout, err = main(capsys, "sweep", TINY, "-p", "a", "1", "--out", out)
    assert code == 2 and stdout == ""
    one_line(err, needle)
    assert snapshot(tmp_path) == before and not left_behind(tmp_path)
    assert place == "a file" or not out.exists()  # no directory made for it either


def test_point_of_a_malformed_job_array(tmp_path, capsys):
    s, _ = bad_sweep(tmp_path, "malformed JSON")
    (s / "sweep.json").write_text(json.dumps({"notebook": str(TINY), "points": []}))
    (s / "array.json").write_text("{")
    code, out, err = main(capsys, "sweep", TINY, "--out", s, "--point", "0")
    assert code == 2 and one_line(err, "array.json is not a valid job array record: malformed JSON")


@pytest.mark.parametrize("place", OUT_PLACES)
def test_report_to_a_bad_place(tmp_path, capsys, tmpfs, place):
    s = tmp_path / "s"
    s.mkdir()
    (s / "sweep.json").write_text(json.dumps({"notebook": str(TINY), "points": [{"id": "a=1-x", "parameters":
                                                                                 {"a": 1}}]}))
    load_sweep(s)  # the sweep's own table, written before the test looks
    out, needle = out_place(tmp_path, tmpfs, place, "r.html")
    before = snapshot(tmp_path)
    code, stdout, err = main(capsys, "report", s, "--out", out)
    assert code == 2 and stdout == ""
    assert f"cannot write {out}" in one_line(err, needle)
    assert snapshot(tmp_path) == before and not left_behind(tmp_path)


def test_report_and_load_sweep_on_damaged_files_of_a_sweep(tmp_path, capsys):
    ids = fake_sweep(tmp_path / "s")
    (tmp_path / "s" / "results.h5").write_text("not a table")  # the table is rebuilt from the points
    (tmp_path / "s" / ids[1] / "result.h5").write_bytes(b"")  # a point whose result is damaged: failed, said why
    frame = load_sweep(tmp_path / "s").set_index("point")
    assert frame.loc[ids[1], "status"] == "failed" and "is empty (0 bytes)" in frame.loc[ids[1], "error"]
    assert inspect(tmp_path / "s" / "results.h5").kind == SWEEP_TABLE
    (tmp_path / "s" / ids[0] / "sensitivity.h5").write_text("x")  # a damaged trials file: one line
    code, out, err = main(capsys, "report", tmp_path / "s", "--out", tmp_path / "r.html")
    assert code == 2 and one_line(err, "sensitivity.h5 is not an HDF5 file")
    assert not (tmp_path / "r.html").exists() and not left_behind(tmp_path)
