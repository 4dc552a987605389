"""What one failure costs a strategy, as laws of world size ``p`` and parameter count: :class:`CostLaw` (a
constant, ``a·log2 p + b``, ``a·p + b``, or bytes over a bandwidth) and :class:`Costs`, one law per cost.

The JSON form (``{"form": "log", "a": 0.01, "b": 0.002}``, or a number for a constant; :func:`load_costs` reads a
file of ``{strategy: {cost: law}}``) is the format measured laws plug into; docs/scale.md lists the costs.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from workbench.base.errors import ConfigError

FORMS = ("constant", "log", "linear", "bytes")
_NUMBER = r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?"
_TEXT = {  # the text form of each law: 0.5 | 0.01*log(p)+0.02 | 2e-6*p+0.1 | 4*params/25e9
    "constant": re.compile(rf"^({_NUMBER})$"),
    "log": re.compile(rf"^({_NUMBER})\*log\(p\)(?:\+({_NUMBER}))?$"),
    "linear": re.compile(rf"^({_NUMBER})\*p(?:\+({_NUMBER}))?$"),
    "bytes": re.compile(rf"^({_NUMBER})\*params/({_NUMBER})$"),
}


@dataclass(frozen=True)
class CostLaw:
    """A cost in seconds (or steps, or samples) as a law of the world size ``p`` and the parameter count:
    ``constant`` a; ``log`` a·log2(p) + b; ``linear`` a·p + b; ``bytes`` a·params / b (a bytes moved per
    parameter over a bandwidth of b bytes/s)."""

    form: str = "constant"
    a: float = 0.0
    b: float = 0.0

    def __post_init__(self) -> None:
        if self.form not in FORMS:
            raise ConfigError("cost law", f"form {self.form!r} is not known: allowed {', '.join(FORMS)}")
        for name in ("a", "b"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise ConfigError("cost law", f"{name}={value!r} is not allowed: a finite number")
        if self.form == "bytes" and self.b <= 0:
            raise ConfigError("cost law", f"a bandwidth of {self.b!r} bytes/s is not allowed: a number > 0")

    def __call__(self, world: float, params: float = 0.0) -> float:
        """The cost at world size ``world`` and ``params`` parameters (never below 0)."""
        if self.form == "constant":
            value = self.a
        elif self.form == "log":
            value = self.a * math.log2(max(world, 1.0)) + self.b
        elif self.form == "linear":
            value = self.a * world + self.b
        else:
            value = self.a * params / self.b
        return max(value, 0.0)

    @classmethod
    def of(cls, value: CostLaw | float | int | str | dict[str, Any]) -> CostLaw:
        """A law from a law, a number (a constant), its text form or its JSON form."""
        if isinstance(value, CostLaw):
            return value
        if isinstance(value, bool):
            raise ConfigError("cost law", f"{value!r} is not allowed: a number, a law's text or its JSON form")
        if isinstance(value, (int, float)):
            return cls("constant", float(value))
        if isinstance(value, dict):
            unknown = sorted(set(value) - {"form", "a", "b"})
            if unknown:
                raise ConfigError("cost law", f"key {unknown[0]!r} is not known: allowed form, a, b")
            return cls(value.get("form", "constant"), value.get("a", 0.0), value.get("b", 0.0))
        if isinstance(value, str):
            text = value.replace(" ", "")
            for form, pattern in _TEXT.items():
                found = pattern.match(text)
                if found:
                    return cls(form, float(found.group(1)), float(found.group(2) or 0.0))
        raise ConfigError("cost law", f"{value!r} is not allowed: a number, a*log(p)+b, a*p+b or a*params/b")

    def to_dict(self) -> dict[str, Any]:
        return {"form": self.form, "a": self.a, "b": self.b}


@dataclass(frozen=True)
class Costs:
    """One strategy's costs (seconds unless said): the failure-free step, a failure's detection, the survivors'
    settle (agreement on the next world), a replacement's join, a whole world's restart and its checkpoint reload,
    the checkpoint stall on the training loop and the checkpoint's write (in the background: checkpoints are
    never closer than a write). ``steps_redone`` and ``samples_lost`` override what the strategy's recovery
    implies (None: implied). Each field takes a :class:`CostLaw`, a number or a law's text."""

    step_s: CostLaw | float | str = 0.19
    detection_s: CostLaw | float | str = 0.015
    settle_s: CostLaw | float | str = 0.04
    join_s: CostLaw | float | str = 0.15
    restart_s: CostLaw | float | str = 0.3
    reload_s: CostLaw | float | str = 0.0
    checkpoint_s: CostLaw | float | str = 0.0004
    write_s: CostLaw | float | str = 0.0
    steps_redone: CostLaw | float | str | None = None
    samples_lost: CostLaw | float | str | None = None

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if value is not None or f.default is not None:
                object.__setattr__(self, f.name, CostLaw.of(value))

    def at(self, world: float, params: float) -> dict[str, float | None]:
        """Every cost evaluated at ``world`` ranks and ``params`` parameters (None: implied by the strategy)."""
        return {f.name: None if getattr(self, f.name) is None else getattr(self, f.name)(world, params)
                for f in fields(self)}

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name).to_dict() for f in fields(self) if getattr(self, f.name) is not None}

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> Costs:
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - names)
        if unknown:
            raise ConfigError("costs", f"{unknown[0]!r} is not a cost: allowed {', '.join(sorted(names))}")
        return cls(**values)


def load_costs(path: str | Path) -> dict[str, Costs]:
    """``{strategy: Costs}`` from a JSON file of ``{strategy: {cost: law}}`` (the measured laws' format)."""
    try:
        data = json.loads(Path(path).read_text())
    except OSError as exc:
        raise ConfigError("costs", f"{path}: cannot be read ({exc.strerror})") from None
    except ValueError as exc:
        raise ConfigError("costs", f"{path}: is not JSON ({exc})") from None
    if not isinstance(data, dict) or not all(isinstance(v, dict) for v in data.values()):
        raise ConfigError("costs", f"{path}: give an object {{strategy: {{cost: law}}}}")
    return {name: Costs.from_dict(values) for name, values in data.items()}
