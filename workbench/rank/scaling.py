"""A rank's side of ``resize_rule`` (:mod:`workbench.config.resize_rule`), a mixin of
:class:`~workbench.rank.base.BaseTrainer`: under ``linear`` every generation message carries the run's history of
resizes (``rule``), from which the rank takes each step's global batch, learning rate (every parameter group; the
momentum buffers stay) and place in the sample stream. Under ``keep`` (``scale`` None) nothing here changes a
thing: the global batch is ``batch_size`` and the learning rate ``lr``."""

from __future__ import annotations

from typing import Any

from workbench.config import lr_schedule, resize_rule
from workbench.workloads.data import BatchSequence


class Scaled:
    """Needs the trainer's ``config``, ``data``, ``step`` and its optimizers (``optimizers``)."""

    scale: resize_rule.Scale | None = None

    def adopt_rule(self: Any, a: dict[str, Any]) -> None:
        """Generation ``a``'s history of resizes (the same in every member's message; newcomers get it here)."""
        scale = resize_rule.from_message(self.config, a.get("rule"))
        if scale is not None and (self.scale is None or scale.history != self.scale.history):
            self.scale = scale
            self.batches = self.batch_sequence()

    def batch_sequence(self: Any) -> BatchSequence:
        """The global batches of every step (read by a sample cursor under ``linear``, once the run has resized)."""
        return BatchSequence(len(self.data.y_train), self.config.batch_size, self.config.seed,
                             self.scale.segments() if self.scale is not None else None)

    def global_batch(self: Any, step: int) -> int:
        return self.config.batch_size if self.scale is None else self.scale.global_batch(step)

    def lr_at(self: Any, step: int) -> float:
        """The resize rule's learning rate at ``step`` times the schedule's factor (``lr_schedule``)."""
        base = self.config.lr if self.scale is None else self.scale.lr_at(step)
        return base * lr_schedule.factor(self.config.lr_schedule, step, self.config.steps)

    def apply_lr(self: Any) -> None:
        """Every parameter group of this rank's optimizers takes the learning rate of the step about to run."""
        if self.scale is None and self.config.lr_schedule == "constant":
            return
        lr_schedule.set_lr(self.optimizers(), self.lr_at(self.step))

    def optimizers(self: Any) -> list[Any]:
        return [self.optimizer]

    def rule_report(self: Any, step: int) -> dict[str, Any]:
        """A step report's ``lr`` (``linear`` or a schedule) and ``global_batch`` (``linear`` only)."""
        if self.scale is None:
            return {} if self.config.lr_schedule == "constant" else {"lr": self.lr_at(step)}
        return {"lr": self.lr_at(step), "global_batch": self.scale.global_batch(step)}

    def rule_record(self: Any) -> dict[str, Any]:
        """What a checkpoint keeps of the rule (``linear`` only): the history (a restart takes it up), and for
        inspection the base, the units, lr and global batch at its step and the sample cursor before it."""
        if self.scale is None:
            return {}
        step = self.step
        record = {"rule": "linear", **self.scale.message(), "units": self.scale.units_at(step),
                  "lr": self.lr_at(step), "global_batch": self.scale.global_batch(step)}
        if self.config.parallelism != "gossip":  # gossip reads its own partitions, not the stream
            epoch, offset, _ = self.batches.cursor(step)
            record["cursor"] = {"epoch": epoch, "offset": offset, "samples": self.batches.samples(step)}
        return record
