"""tools/check_docstrings.py: short module docstrings that cite no design document, on the real ``workbench``
package and on small planted offenders."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "tools" / "check_docstrings.py"


def check(root: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), str(root)], capture_output=True, text=True, timeout=60)


def package(tmp_path: Path, files: dict[str, str]) -> Path:
    root = tmp_path / "pkg"
    for name, source in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(source, encoding="utf-8")
    return root


def test_the_workbench_package_passes():
    proc = check(ROOT / "workbench")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "check_docstrings:" in proc.stdout


def test_a_planted_long_docstring_and_design_references_fail(tmp_path):
    long = '"""' + "\n".join(f"line {i}" for i in range(10)) + '\n"""\nx = 1\n'  # 11 lines with the quotes
    root = package(tmp_path, {
        "__init__.py": '"""A package."""\n',
        "ok.py": '"""' + "\n".join(f"line {i}" for i in range(9)) + '\n"""\n',  # exactly 10 lines: allowed
        "long.py": long,
        "sub/design.py": '"""Protocol (DESIGN section 3)."""\n',
        "sub/section.py": '"""See §4 of the plan."""\n',
        "nodoc.py": "x = '§ DESIGN'\n",  # not a docstring: not checked
    })
    proc = check(root)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert any(line.startswith("pkg/long.py: module docstring of 11 lines") for line in lines), lines
    assert any(line.startswith("pkg/sub/design.py:") and "'DESIGN'" in line for line in lines), lines
    assert any(line.startswith("pkg/sub/section.py:") and "'§'" in line for line in lines), lines
    assert not [line for line in lines if "ok.py" in line or "nodoc.py" in line or "__init__" in line], lines


def test_a_clean_planted_package_passes(tmp_path):
    root = package(tmp_path, {"__init__.py": '"""A package."""\n', "a.py": '"""Short.\n\nTwo more lines.\n"""\n'})
    proc = check(root)
    assert proc.returncode == 0, proc.stdout + proc.stderr
