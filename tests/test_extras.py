"""Optional packages by extra (workbench/base/extras.py): without the package, the part that needs it says in one
line which extra installs it; the core never asks."""

from __future__ import annotations

import sys

import pytest

from workbench.base.errors import ConfigError
from workbench.base.extras import need

MISSING = "studies: the reproductions' statistics need scipy, which is not installed: pip install -e .[studies]"


def without_scipy(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [m for m in sys.modules if m == "scipy" or m.startswith("scipy.")] + ["scipy"]:
        monkeypatch.setitem(sys.modules, name, None)  # an import of it raises ImportError


def test_the_reproductions_without_scipy_name_the_extra(monkeypatch):
    from workbench.campaigns.reproduce import stats

    assert stats.mean_interval([1.0, 2.0, 3.0])[0] == 2.0  # with scipy: an interval
    without_scipy(monkeypatch)
    with pytest.raises(ConfigError) as refused:
        stats.mean_interval([1.0, 2.0, 3.0])
    assert str(refused.value) == MISSING


def test_the_bayes_ceiling_without_scipy_names_the_extra(monkeypatch):
    without_scipy(monkeypatch)
    with pytest.raises(ConfigError, match=r"^studies: the Bayes ceilings need scipy, which is not installed: "):
        need("scipy.special", "studies", "the Bayes ceilings")


def test_a_present_module_is_returned():
    assert need("json", "none", "nothing").dumps([1]) == "[1]"
