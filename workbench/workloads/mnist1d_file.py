"""MNIST-1D's file (Greydanus & Kobak, *Scaling down deep learning with MNIST-1D*, ICML 2024): 10 classes of 1-D
signals of 40 points, 4,000 training and 1,000 test examples.

The data is the ``mnist1d`` package's ``make_dataset(get_dataset_args())`` (version 0.0.2.post1, seed 42; equal
to the ``mnist1d_data.pkl`` its repository publishes, to 1e-15), committed as ``data/mnist1d.npz`` (float32) and
checked against :data:`CHECKSUM` before any process starts and at every load: a missing or altered file is an
error, never a rebuild. Regenerate it (the ``dev`` extra installs the package) with
``python -m workbench.workloads.mnist1d_file --write data/mnist1d.npz`` (a path that cannot be written is refused in
one line, exit 2, before the data is made). No torch here: the starting process reads it.
"""

from __future__ import annotations

import hashlib
import io
import sys
import zipfile
from pathlib import Path

import numpy as np

from workbench.base.entry import OneLineParser, answer
from workbench.base.errors import ConfigError

LENGTH = 40  # points per signal
TRAIN, TEST = 4000, 1000
# sha256 of the arrays x, y, x_test, y_test as stored (float32, int64; C order), in that order
CHECKSUM = "b09ad3e22c854bc5a1948b85c373aab653ceb38c9170f5ed05b7d054e4160db9"
PACKAGE = "mnist1d==0.0.2.post1"


def checksum(arrays: dict[str, np.ndarray]) -> str:
    digest = hashlib.sha256()
    for key in ("x", "y", "x_test", "y_test"):
        digest.update(np.ascontiguousarray(arrays[key]).tobytes())
    return digest.hexdigest()


def read(path: Path) -> dict[str, np.ndarray]:
    """The four arrays of ``path``, checked: shapes, types and :data:`CHECKSUM` (ConfigError otherwise)."""
    fix = (f"restore it (git checkout -- data/{path.name}) or regenerate it: "
           f"python -m workbench.workloads.mnist1d_file --write {path}")
    try:
        with np.load(path, allow_pickle=False) as f:
            arrays = {key: f[key] for key in ("x", "y", "x_test", "y_test")}
    except (OSError, ValueError, KeyError, zipfile.BadZipFile, EOFError) as exc:
        raise ConfigError("dataset", f"'mnist1d' cannot read {path} ({type(exc).__name__}: {exc}): {fix}") from None
    shapes = {key: a.shape for key, a in arrays.items()}
    if shapes != {"x": (TRAIN, LENGTH), "y": (TRAIN,), "x_test": (TEST, LENGTH), "y_test": (TEST,)} or \
            arrays["x"].dtype != np.float32 or arrays["y"].dtype != np.int64:
        raise ConfigError("dataset", f"'mnist1d': {path} holds arrays of shapes {shapes}, not MNIST-1D's: {fix}")
    if checksum(arrays) != CHECKSUM:
        raise ConfigError("dataset", f"'mnist1d': {path} was altered (its checksum is not MNIST-1D's): {fix}")
    return arrays


def generate() -> dict[str, np.ndarray]:
    """The data set from the ``mnist1d`` package's defaults (needs ``pip install mnist1d==0.0.2.post1``)."""
    try:
        from mnist1d.data import get_dataset_args, make_dataset
    except ImportError:
        raise ConfigError("dataset", f"regenerating MNIST-1D needs the package: pip install {PACKAGE}") from None
    made = make_dataset(get_dataset_args())
    return {"x": np.asarray(made["x"], dtype=np.float32), "y": np.asarray(made["y"], dtype=np.int64),
            "x_test": np.asarray(made["x_test"], dtype=np.float32),
            "y_test": np.asarray(made["y_test"], dtype=np.int64)}


def write(arrays: dict[str, np.ndarray], path: Path) -> None:
    """``path`` as an uncompressed .npz with fixed member dates: the same arrays give the same bytes."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_STORED) as archive:
        for key in ("x", "y", "x_test", "y_test"):
            member = io.BytesIO()
            np.save(member, np.ascontiguousarray(arrays[key]), allow_pickle=False)
            archive.writestr(zipfile.ZipInfo(f"{key}.npy", date_time=(1980, 1, 1, 0, 0, 0)), member.getvalue())
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        tmp.write_bytes(buffer.getvalue())
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(prog="python -m workbench.workloads.mnist1d_file",
                           description=f"Regenerate MNIST-1D from {PACKAGE} and check it.")
    parser.add_argument("--write", metavar="PATH", required=True, help="where to write the .npz (data/mnist1d.npz)")
    args = parser.parse_args(argv)
    return answer("mnist1d", lambda: _regenerate(args.write), process=argv is None)


def _regenerate(where: str) -> int:
    path = Path(where)
    if not where.strip() or path.is_dir() or not path.parent.is_dir():
        why = "an empty path" if not where.strip() else "a directory" if path.is_dir() else \
            f"in no directory ({path.parent} is {'a file' if path.parent.exists() else 'missing'})"
        raise ConfigError("--write", f"{where!r} is {why}: give a file path in an existing directory, e.g. "
                          "data/mnist1d.npz")
    arrays = generate()
    made = checksum(arrays)
    if made != CHECKSUM:
        print(f"mnist1d: the package made other data (checksum {made}, expected {CHECKSUM}): is it {PACKAGE}?",
              file=sys.stderr)
        return 1
    try:
        write(arrays, path)
    except OSError as exc:
        raise ConfigError("--write", f"cannot write {where!r}: {exc.strerror or exc}") from None
    print(f"wrote {where}: {TRAIN} + {TEST} signals of {LENGTH}, checksum {made}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
