"""The learning-rate rule of a resize (``resize_rule``): ``keep`` (the global batch stays ``batch_size``, split over
the live ranks, and so does the learning rate) or ``linear`` (Goyal et al., "Accurate, Large Minibatch SGD": each
rank, or hybrid lane, keeps its batch, the global batch and the learning rate scale with the world). Under ``linear``
a run's :class:`Scale` is the history of its resizes: the step each took effect and the units (ranks; lanes in a
hybrid run) it left. The global batch and the learning rate of step ``s`` are functions of ``s`` and that history
only, and so is where step ``s`` reads the sample stream (:class:`~workbench.workloads.data.BatchSequence`). Details:
docs/permanent-faults.md ("The learning-rate rule")."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from workbench.base.errors import ConfigError
from workbench.faults import kinds

RULES = ("keep", "linear")
ATTRIBUTE = "resize_rule"  # the checkpoint attribute that holds a linear run's history (JSON)


def units(config: Any, world: int) -> int:
    """What the rule counts at world size ``world``: lanes (one replica of every stage) in a hybrid or pipeline
    run, ranks otherwise."""
    if config.mode.staged and config.pipeline_stages:
        return max(1, world // config.pipeline_stages)
    return world


@dataclass
class Scale:
    """A ``linear`` run's resizes: ``history`` holds ``[step, units]`` from ``[0, base]`` on, one entry per change
    (step ascending). ``scales_lr`` is False where each rank steps on its own batch (a mode with ``partitions``:
    gossip)."""

    lr: float
    batch_size: int
    history: list[list[int]] = field(default_factory=list)
    scales_lr: bool = True

    @property
    def base(self) -> int:
        return self.history[0][1]

    def units_at(self, step: int) -> int:
        now = self.base
        for start, n in self.history:
            if start <= step:
                now = n
        return now

    def global_batch(self, step: int) -> int:
        """``batch_size`` x units / base: each unit keeps ``batch_size / base`` samples."""
        return self.batch_size // self.base * self.units_at(step)

    def lr_at(self, step: int) -> float:
        """``lr`` x units / base (``lr`` itself at the base; gossip: always ``lr``)."""
        n = self.units_at(step)
        return self.lr if n == self.base or not self.scales_lr else self.lr * n / self.base

    def segments(self) -> list[tuple[int, int]]:
        """(first step, global batch) of every stretch of constant global batch."""
        return [(start, self.batch_size // self.base * n) for start, n in self.history]

    def resized(self, step: int, n: int) -> Scale:
        """The scale after a resize to ``n`` units at ``step`` (it replaces whatever the history held from there)."""
        history = [entry for entry in self.history if entry[0] < step] or [[0, self.base]]
        if history[-1][1] != n:
            history.append([step, n])
        return Scale(self.lr, self.batch_size, history, self.scales_lr)

    def describe(self, step: int) -> str:
        return f"resize_rule linear: lr {self.lr_at(step):g}, global batch {self.global_batch(step)}"

    def message(self) -> dict[str, Any]:
        """What a generation message carries (``rule``) and a checkpoint keeps."""
        return {"base": self.base, "history": [list(entry) for entry in self.history]}


def start(config: Any) -> Scale | None:
    """The scale a run starts with (None under ``keep``): its own world as the base, or the history of the
    ``linear`` checkpoint it resumes, to which a restart at another size adds a resize at the checkpoint's step."""
    if config.resize_rule != "linear":
        return None
    now = units(config, config.world_size)
    scale = Scale(config.lr, config.batch_size, [[0, now]], not config.mode.partitions)
    saved, step = resumed(config.resume)
    if saved is not None:
        scale = Scale(config.lr, config.batch_size, saved, scale.scales_lr).resized(step, now)
    return scale


def from_message(config: Any, rule: dict[str, Any] | None) -> Scale | None:
    """A rank's scale from its generation message (None under ``keep``)."""
    if rule is None:
        return None
    return Scale(config.lr, config.batch_size, [list(e) for e in rule["history"]], not config.mode.partitions)


def resumed(path: str | None) -> tuple[list[list[int]] | None, int]:
    """(the history a ``linear`` checkpoint holds, its step); (None, step) for a checkpoint written under
    ``keep`` (its global batch was ``batch_size`` throughout: the rule starts at the resuming run's size)."""
    if path is None:
        return None, 0
    import h5py

    with h5py.File(path, "r") as f:
        text, step = f.attrs.get(ATTRIBUTE), int(f.attrs["step"])
    return (json.loads(text)["history"] if text else None), step


def check(config: Any) -> None:
    """``resize_rule`` is one of RULES; under ``linear`` each rank's (hybrid: each lane's) batch is a whole number
    of samples (a resumed checkpoint's base is checked by :func:`check_resumed`)."""
    if config.resize_rule not in RULES:
        raise ConfigError("resize_rule", f"{config.resize_rule!r} is not known: allowed {', '.join(RULES)}")
    if config.resize_rule == "linear" and config.resume is None:
        per_unit(config, units(config, config.world_size))


def per_unit(config: Any, base: int) -> int:
    """The samples each rank (hybrid: each lane) keeps under ``linear``, or a ConfigError if not whole."""
    if config.batch_size % base:
        what = "lanes" if config.mode.staged else "ranks"
        raise ConfigError("resize_rule", f"linear keeps each of the {base} starting {what}' batch, but batch_size "
                          f"{config.batch_size} / {base} is not a whole number of samples: give a multiple of {base}")
    return config.batch_size // base


def check_sizes(config: Any, n_train: int | None, worlds: list[int] | None = None) -> None:
    """Under ``linear``: the global batch at each of ``worlds`` (default: the starting one and every planned
    resize's) fits the ``n_train`` training samples (then a gossip rank's batch fits its partition too), and the
    base of a resumed checkpoint divides ``batch_size``."""
    if config.resize_rule != "linear":
        return
    try:
        saved, _ = resumed(config.resume)
    except (OSError, KeyError, ValueError, TypeError):
        saved = None  # not a readable checkpoint: preflight.check_resume says so
    base = saved[0][1] if saved else units(config, config.world_size)
    batch = per_unit(config, base)
    if worlds is None:
        worlds = [config.world_size] + [f.world for f in config.faults if kinds.of(f).fires is kinds.Fires.BOUNDARY]
    for world in worlds if n_train is not None else []:
        size = batch * units(config, world)
        if size > n_train:
            raise ConfigError("resize_rule", f"linear at world size {world} makes the global batch {size} "
                              f"({batch} per {'lane' if config.mode.lanes else 'rank'} x "
                              f"{units(config, world)}), more than the {n_train} training samples")
