"""tools/check_structure.py: import cycles (package ``__init__`` modules counted), forbidden reach, private names
across modules, classes spread over files (mixins) and oversized modules/functions, on small synthetic packages and
on the real ``workbench`` package."""

import subprocess
import sys
from pathlib import Path

import pytest
from structure_tool import check

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "tools" / "check_structure.py"


def package(tmp_path: Path, files: dict[str, str]) -> Path:
    """A package ``pkg`` under ``tmp_path`` with the given files (relative path -> source); returns its dir."""
    root = tmp_path / "pkg"
    for name, source in {"__init__.py": "", **files}.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(source)
    return root


def test_an_acyclic_package_passes(tmp_path):
    root = package(tmp_path, {"a.py": "import pkg.b\nfrom pkg.c import x\nimport os\n", "b.py": "import pkg.c\n",
                              "c.py": "x = 1\n", "__init__.py": "from pkg.a import b\n"})
    assert check.find_cycles(root) == []
    assert check.import_graph(root) == {"pkg": {"pkg.a"}, "pkg.a": {"pkg.b", "pkg.c"}, "pkg.b": {"pkg.c"},
                                        "pkg.c": set()}
    assert check.oversized(root) == []
    assert check.main([str(root)]) == 0


def test_a_cycle_is_found_also_through_an_import_inside_a_function(tmp_path):
    root = package(tmp_path, {"a.py": "from pkg.b import f\n",
                              "b.py": "def f():\n    from pkg import a\n    return a\n",
                              "c.py": "import pkg.a\n"})
    assert check.find_cycles(root) == [["pkg.a", "pkg.b", "pkg.a"]]
    assert check.main([str(root)]) == 1


def test_a_type_checking_import_is_a_cycle(tmp_path, capsys):
    root = package(tmp_path, {"a.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.b import B\n",
                              "b.py": "from pkg.a import A\n"})
    assert check.find_cycles(root) == [["pkg.a", "pkg.b", "pkg.a"]]
    assert check.main([str(root)]) == 1
    assert "import cycle: pkg.a -> pkg.b -> pkg.a" in capsys.readouterr().out


def test_relative_imports_and_subpackages_resolve(tmp_path):
    root = package(tmp_path, {"sub/__init__.py": "from . import x\n", "sub/x.py": "from ..y import f\n",
                              "y.py": "from .sub import x\n", "z.py": "from . import y\n"})
    graph = check.import_graph(root)
    assert graph["pkg.sub"] == {"pkg.sub.x"}  # naming itself (``from . import``) is no edge
    assert graph["pkg.sub.x"] == {"pkg.y"} and graph["pkg.z"] == {"pkg", "pkg.y"}
    assert check.find_cycles(root) == [["pkg.sub", "pkg.sub.x", "pkg.y", "pkg.sub"]]  # y imports from sub


def test_a_package_init_importing_its_submodules_is_no_cycle_unless_one_imports_it_back(tmp_path):
    root = package(tmp_path, {"__init__.py": "from pkg.a import A\n", "a.py": "import pkg.b\nA = 1\n",
                              "b.py": "x = 2\n"})
    assert check.find_cycles(root) == []
    (root / "b.py").write_text("from pkg import A\n")
    assert check.find_cycles(root) == [["pkg", "pkg.a", "pkg.b", "pkg"]]


def test_importing_a_submodule_runs_its_package_init_so_a_cycle_through_the_init_is_found(tmp_path, capsys):
    # the shape of main's 15-module cycle: faults/__init__ re-exported a campaign that loads the session, which
    # loads the rank code, which imports faults.bitflip -- and with it faults/__init__
    root = package(tmp_path, {"faults/__init__.py": "from pkg.faults.campaign import campaign\n",
                              "faults/bitflip.py": "def flip():\n    pass\n",
                              "faults/campaign.py": "import pkg.session\ndef campaign():\n    pass\n",
                              "session.py": "from pkg.rank import step\n",
                              "rank.py": "from pkg.faults.bitflip import flip\ndef step():\n    pass\n"})
    assert check.import_graph(root)["pkg.rank"] == {"pkg.faults", "pkg.faults.bitflip"}
    assert check.find_cycles(root) == [["pkg.faults", "pkg.faults.campaign", "pkg.session", "pkg.rank",
                                        "pkg.faults"]]
    assert check.main([str(root)]) == 1
    assert "import cycle: pkg.faults -> pkg.faults.campaign -> pkg.session -> pkg.rank -> pkg.faults" in \
        capsys.readouterr().out
    (root / "faults" / "__init__.py").write_text('"""Imports nothing."""\n')  # the fix: a light __init__
    assert check.find_cycles(root) == []


def test_a_package_init_is_no_edge_from_its_own_modules(tmp_path):
    # faults/__init__ imports its own room, which imports a sibling: faults/__init__ already ran, no cycle
    root = package(tmp_path, {"faults/__init__.py": "from pkg.faults.a import x\n",
                              "faults/a.py": "from pkg.faults.b import y\nx = 1\n", "faults/b.py": "y = 2\n",
                              "other.py": "import pkg.faults.b\n"})
    graph = check.import_graph(root)
    assert graph["pkg.faults.a"] == {"pkg.faults.b"} and graph["pkg.other"] == {"pkg.faults", "pkg.faults.b"}
    assert check.find_cycles(root) == []


@pytest.mark.parametrize("room, first", [("launch/session.py", "launch"), ("launch/sweeps/run.py", "launch"),
                                         ("supervisor/core.py", "supervisor"), ("launch/lab.py", "launch"),
                                         ("campaigns/studies/campaign.py", "campaigns"),
                                         ("campaigns/reproduce/ccgrid22.py", "campaigns")])
@pytest.mark.parametrize("rank_module", ["rank/main.py", "rank/peers/torchft_rank.py"])
def test_rank_code_may_not_reach_the_parent_side(tmp_path, capsys, room, first, rank_module):
    forbidden = "pkg." + room[:-3].replace("/", ".")
    files = {rank_module: "import pkg.helper\n", "helper.py": f"import {forbidden}\n", room: "x = 1\n",
             "rank/__init__.py": "", "strategies/peers/__init__.py": f"import {forbidden}\n"}
    for path in [room, rank_module, "strategies/peers/__init__.py"]:
        for folder in [*Path(path).parents][:-1]:
            files.setdefault(f"{folder}/__init__.py", "")
    root = package(tmp_path, files)
    source = "pkg." + rank_module[:-3].replace("/", ".")
    first = "pkg." + first  # the nearest forbidden module on the way: a forbidden package's __init__ runs first
    problems = check.forbidden_edges(root)
    assert len(problems) == 1, problems  # strategies.peers reaches it too, but is not rank code
    assert problems[0].startswith(f"{source} reaches {first} (code that runs in a rank process may not)")
    assert problems[0].endswith(f": {source} -> pkg.helper -> {first}")
    assert check.main([str(root)]) == 1
    assert f"forbidden: {source} reaches {first}" in capsys.readouterr().out
    (root / "helper.py").write_text("x = 2\n")
    assert check.forbidden_edges(root) == []


def test_a_private_name_imported_from_another_module_fails(tmp_path, capsys):
    root = package(tmp_path, {"a.py": "def _helper():\n    pass\n__version__ = 1\n",
                              "b.py": "from pkg.a import __version__\n",
                              "c.py": "def f():\n    from .a import _helper\n    return _helper\n"})
    assert check.private_imports(root) == [f"{Path('pkg/c.py')}:2 imports _helper from .a"]  # dunders are public
    assert check.main([str(root)]) == 1
    assert "private name: " in capsys.readouterr().out
    (root / "c.py").write_text("from pkg.a import __version__ as v\n")
    assert check.private_imports(root) == []


def test_every_module_of_a_larger_knot_is_on_a_reported_cycle(tmp_path):
    root = package(tmp_path, {"hub.py": "import pkg.x\nimport pkg.y\n", "x.py": "import pkg.hub\n",
                              "y.py": "import pkg.hub\n"})
    assert check.find_cycles(root) == [["pkg.hub", "pkg.x", "pkg.hub"], ["pkg.y", "pkg.hub", "pkg.y"]]


def function(name: str, lines: int, docstring: str = "") -> str:
    body = [f"    \"\"\"{docstring}\"\"\"\n"] if docstring else []
    body += [f"    x{i} = {i}\n" for i in range(lines - 1 - len(body))]
    return f"def {name}():\n{''.join(body)}"


def test_long_modules_and_functions_fail_and_only_a_function_may_be_marked_one_piece(tmp_path, capsys):
    root = package(tmp_path, {"long.py": "x = 1\n" * 1001, "short.py": "x = 1\n" * 1000,
                              "f.py": function("ok", 80) + function("too_long", 81),
                              "m.py": "class C:\n" + "".join("    " + line + "\n"
                                                             for line in function("method", 90).splitlines())})
    problems = check.oversized(root)
    assert len(problems) == 3, problems
    assert problems[0].startswith(str(Path("pkg/f.py")) + ":81 too_long: 81 lines > 80")
    assert problems[1].startswith(str(Path("pkg/long.py")) + ": 1001 lines > 1000")
    assert problems[2].startswith(str(Path("pkg/m.py")) + ":2 method: 90 lines > 80")
    assert check.main([str(root)]) == 1
    out = capsys.readouterr().out
    assert "too large: pkg/long.py: 1001 lines" in out and "3 oversized" in out
    assert check.oversized(root, max_lines=1100, max_function=100) == []
    # a module's marker excuses nothing: what a module holds is judged by reading it, its length only hints
    (root / "long.py").write_text('"""A table.\n\nOne piece: read top to bottom."""\n' + "x = 1\n" * 1001)
    assert str(Path("pkg/long.py")) + ":" in "".join(check.oversized(root))


def test_the_one_piece_marker_exempts_a_function(tmp_path):
    root = package(tmp_path, {
        "f.py": function("whole", 95, "Steps in order.\n\n    One piece: the phases share their locals."),
        "g.py": function("unmarked", 95, "A long function without the marker.")})
    assert [p.split(":")[0] for p in check.oversized(root)] == [str(Path("pkg/g.py"))]
    # a module docstring's marker does not reach its functions
    (root / "long.py").write_text('"""One piece: generated."""\n' + function("inner", 90))
    assert [p.split(" ")[0] for p in check.oversized(root)] == [str(Path("pkg/g.py")) + ":1",
                                                                 str(Path("pkg/long.py")) + ":2"]
    (root / "f.py").write_text(function("whole", 95, "One piece:"))  # the marker needs a reason after it
    assert str(Path("pkg/f.py")) + ":1" in [p.split(" ")[0] for p in check.oversized(root)]


MIXIN = """from typing import Any


class Steps:
    def advance(self) -> None:
        self.step += 1
        self.report(self.config.steps)
"""
HOST = """from pkg.steps import Steps


class Trainer(Steps):
    def __init__(self, config):
        self.config, self.step = config, 0

    def report(self, steps):
        print(self.step, steps)
"""


def test_a_method_typed_self_any_fails(tmp_path, capsys):
    root = package(tmp_path, {"a.py": "from typing import Any\nimport typing\n\n\nclass A:\n"
                                      "    def f(self: Any) -> None:\n        pass\n\n"
                                      "    def g(self: typing.Any, x: Any) -> None:\n        pass\n\n"
                                      "    def h(self, x: Any) -> None:\n        pass\n"})
    problems = check.mixins(root)
    assert [p.split(" ")[0:2] for p in problems] == [[str(Path("pkg/a.py")) + ":6", "f:"],
                                                     [str(Path("pkg/a.py")) + ":9", "g:"]], problems
    assert all("'self: Any'" in p for p in problems)
    assert check.main([str(root)]) == 1
    assert "class not whole: " in capsys.readouterr().out


def test_a_class_reading_attributes_it_never_sets_is_a_mixin_when_a_class_in_another_module_inherits_it(tmp_path,
                                                                                                        capsys):
    root = package(tmp_path, {"steps.py": MIXIN, "trainer.py": HOST})
    (problem,) = check.mixins(root)
    assert problem.startswith(f"{Path('pkg/steps.py')}:4 Steps reads self.step, self.report, self.config, which it "
                              "never sets, and is a base of pkg.trainer.Trainer: a mixin")
    assert check.main([str(root)]) == 1
    assert "1 class(es) not whole" in capsys.readouterr().out
    # a bare annotation declares, it sets nothing: the mixin stays one
    (root / "steps.py").write_text(MIXIN.replace("class Steps:\n", "class Steps:\n    step: int\n    config: Any\n"
                                                 "    def report(self, steps: int) -> None: ...\n"))
    (problem,) = check.mixins(root)
    assert "reads self.step, self.config, which it never sets" in problem  # report is defined now
    # the same class in the module of its one subclass is no mixin: the class is read in one file
    (root / "trainer.py").write_text(MIXIN + HOST.replace("from pkg.steps import Steps\n", ""))
    assert check.mixins(root) == []


def test_a_class_with_its_own_state_and_an_abstract_base_is_no_mixin(tmp_path):
    root = package(tmp_path, {
        "base.py": "from dataclasses import dataclass\n\n\n@dataclass\nclass Point:\n    x: int\n    y: int = 0\n\n"
                   "    def norm(self):\n        return abs(self.x) + abs(self.y) + self.scale()\n\n"
                   "    def scale(self):\n        return 1\n\n\n"
                   "class Base:\n    limit = 3\n\n    def __init__(self):\n        self.step = 0\n\n"
                   "    def run(self):\n        while self.step < self.limit:\n            self.train_step()\n\n"
                   "    def train_step(self):\n        raise NotImplementedError\n\n\n"
                   "class Middle(Base):\n    def more(self):\n        return self.step + self.limit\n",
        "sub.py": "import threading\nfrom pkg import base\nfrom pkg.base import Middle, Point\n\n\n"
                  "class Mode(Middle):\n    def train_step(self):\n        self.step += 1\n\n\n"
                  "class Named(base.Point):\n    pass\n\n\nclass Worker(threading.Thread):\n    pass\n\n\n"
                  "class Other(Point):\n    pass\n",
        # a base from outside the package may set anything: a class built on one is not judged
        "ext.py": "import threading\n\n\nclass Loop(threading.Thread):\n    def go(self):\n"
                  "        return self.name + self.extra\n",
        "use.py": "from pkg.ext import Loop\n\n\nclass Mine(Loop):\n    extra = 'x'\n"})
    assert check.mixins(root) == []
    assert check.main([str(root)]) == 0


def test_a_thirteenth_entry_on_the_top_floor_fails(tmp_path, capsys):
    rooms = {f"room{i}/__init__.py": "" for i in range(9)}
    root = package(tmp_path, {"__main__.py": "x = 1\n", "a.py": "x = 1\n", **rooms})
    (root / "__pycache__").mkdir()  # neither counts
    (root / ".hidden").write_text("")
    assert len([p for p in root.iterdir() if p.name != "__pycache__" and not p.name.startswith(".")]) == 12
    assert check.crowded_top(root) == []
    assert check.main([str(root)]) == 0
    (root / "extra.py").write_text("x = 1\n")  # the 13th
    problems = check.crowded_top(root)
    assert len(problems) == 1 and problems[0].startswith("pkg/: 13 entries > 12 on the top floor")
    assert "extra.py" in problems[0]
    assert check.main([str(root)]) == 1
    out = capsys.readouterr().out
    assert "top floor: pkg/: 13 entries" in out and "1 crowded top floor(s)" in out
    assert check.crowded_top(root, max_top=13) == []


def test_the_script_runs_on_its_own(tmp_path):
    root = package(tmp_path, {"a.py": "import pkg.b\n", "b.py": "x = 1\n"})
    done = subprocess.run([sys.executable, str(SCRIPT), str(root)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.startswith("check_structure OK: 3 modules, 1 import edges, no cycles, no forbidden reach, "
                                  "no private imports, every class whole, a short top floor, names in their rooms; "
                                  "largest module")
    bad = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path)], capture_output=True, text=True)
    assert bad.returncode == 2 and "not a package" in bad.stderr


def test_the_workbench_package_keeps_the_house_rules():
    root = ROOT / "workbench"
    assert check.find_cycles(root) == []
    assert check.forbidden_edges(root) == []
    assert check.private_imports(root) == []
    assert check.mixins(root) == []
    assert check.oversized(root) == []
    assert check.crowded_top(root) == []


def test_a_name_compared_outside_its_room_fails(tmp_path, capsys):
    """A fault kind, an event kind and a dataset compared by name: a problem each, except the fault kind in the
    room that owns it (faults/kinds.py); the names are read from the real registries."""
    root = tmp_path / "workbench"
    planted = ('def f(fault, e, config):\n    return fault.kind == "kill", e["kind"] in ("generation", "end"), '
               'config.dataset == "digits"\n')
    for name, source in {"__init__.py": "", "faults/__init__.py": "", "faults/kinds.py": planted,
                         "planted.py": planted}.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(source)
    found = {}
    for problem in check.compared_names(root):
        where, what = problem.split(":")[0], problem.rsplit("(", 1)[1]
        found.setdefault(Path(where).as_posix(), []).append(what.split(":")[0])
    assert found == {"workbench/planted.py": ["a fault kind", "an event kind", "a model or dataset"],
                     "workbench/faults/kinds.py": ["an event kind", "a model or dataset"]}
    assert check.main([str(root)]) == 1 and "5 name(s) compared outside their room" in capsys.readouterr().out


def test_a_parallel_mode_compared_by_name_in_a_copy_of_the_package_fails(tmp_path):
    """A copy of ``workbench`` passes the modes' rule; planted ``config.parallelism == "pipeline"`` in rank/base.py
    fails it, named, while the same line in the modes' room (base/modes.py) does not."""
    import shutil

    copy = tmp_path / "workbench"
    shutil.copytree(ROOT / "workbench", copy, ignore=shutil.ignore_patterns("__pycache__"))
    rooms = [room for room in check.registered_rooms(copy) if room.what == "a parallel mode"]
    assert len(rooms) == 1 and check.compared_names(copy, rooms) == []
    planted = '\n\ndef planted(config):\n    return config.parallelism == "pipeline"\n'
    for where in ("base/modes.py", "rank/base.py"):
        (copy / where).write_text((copy / where).read_text() + planted)
    (problem,) = check.compared_names(copy, rooms)
    assert problem.startswith("workbench/rank/base.py:")
    assert problem.endswith(': config.parallelism == "pipeline" (a parallel mode: ask its object)')


# -- layers -------------------------------------------------------------------------------------------------------
TOY_FLOORS = [("ground", "leaves", ("low", "low.*")), ("top", "doors", ("", "high"))]


def test_an_import_that_points_up_a_floor_fails_unless_named(tmp_path):
    root = package(tmp_path, {"low/__init__.py": "", "low/a.py": "import pkg.high\n", "high.py": "import pkg.low.a\n",
                              "low/b.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import pkg.high\n"})
    problems = check.layered(root, TOY_FLOORS, {})
    assert problems[0] == ("low.a (ground) imports high (top): an import that points up a floor (move the code, or "
                           "name the back edge with its reason)")
    assert problems[1:] == ["packages high and low import each other (outside the back edges)"]  # low.b: type-only
    assert check.layered(root, TOY_FLOORS, {("low.a", "high"): "why"}) == []
    assert check.layered(root, TOY_FLOORS, {("low.a", "high"): "why", ("low.b", "high"): "gone"}) == [
        "back edge low.b -> high is no import any more: remove it from BACK_EDGES"]
    unplaced = check.layered(root, TOY_FLOORS[:1], {("low.a", "high"): "why"})
    assert unplaced == ["pkg lies on no floor (add it to LAYERS)", "high lies on no floor (add it to LAYERS)"]


def test_a_planted_upward_import_in_the_real_package_fails_the_layers(tmp_path):
    """A copy of ``workbench`` whose floor (base/errors.py) imports the supervisor: refused, named; the copy as
    it is passes."""
    import shutil

    copy = tmp_path / "workbench"
    shutil.copytree(ROOT / "workbench", copy, ignore=shutil.ignore_patterns("__pycache__"))
    rules = (check.LAYERS, check.BACK_EDGES, check.TWO_WAY_PACKAGES)
    assert check.layered(copy, *rules) == []
    errors = copy / "base" / "errors.py"
    errors.write_text(errors.read_text() + "\n\ndef _late():\n    from workbench.supervisor import core\n")
    assert check.layered(copy, *rules) == [
        "base.errors (floor) imports supervisor.core (supervisor): an import that points up a floor (move the "
        "code, or name the back edge with its reason)", "packages base and supervisor import each other (outside "
        "the back edges)"]


def test_the_floor_plan_in_the_docs_is_the_tools():
    text = (ROOT / "docs" / "concepts.md").read_text()
    start = text.index("<!-- floor plan: python tools/check_structure.py --floor-plan -->\n")
    block = text[text.index("\n", start) + 1:text.index("<!-- end of the floor plan -->")]
    assert block == check.floor_plan()
    assert len(check.BACK_EDGES) <= 9 and all(why.strip() for why in check.BACK_EDGES.values())
