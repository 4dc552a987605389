"""tools/check_structure.py loaded as a module (it is a script, not part of the package), and its rooms by what
they hold: the scans of names compared outside their room (fault kinds, event kinds, models and datasets,
parallel modes)."""

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("check_structure", ROOT / "tools" / "check_structure.py")
check = sys.modules.setdefault("check_structure", importlib.util.module_from_spec(_spec))  # its dataclasses look it up
_spec.loader.exec_module(check)
ROOMS = {room.what: room for room in check.registered_rooms(ROOT / "workbench")}


def comparisons(what: str, path: Path, root: Path = ROOT) -> list[str]:
    """The comparisons of ``what``'s names (a key of :data:`ROOMS`) in the file ``path``."""
    return check.name_comparisons(path, ROOMS[what], root)
