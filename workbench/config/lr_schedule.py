"""The learning rate over a run (``lr_schedule``): ``constant``; ``cosine``, half a cosine from ``lr`` at step 0
to 0 at the last step (Loshchilov & Hutter's SGDR without restarts); ``step``, ``lr`` divided by 10 at half and
again at three quarters of the run (the ImageNet schedule in short). The factor is a function of the step and the
run's ``steps`` only, so a rolled-back, restarted, resumed or replaced rank takes the rate its step had: nothing
to checkpoint. It multiplies whatever the resize rule gives (:mod:`workbench.config.resize_rule`). Details:
docs/settings.md ("The learning-rate schedule")."""

from __future__ import annotations

import math

SCHEDULES = ("constant", "cosine", "step")


def factor(schedule: str, step: int, steps: int) -> float:
    """What ``lr`` is multiplied by at ``step`` (0-based) of a ``steps``-step run."""
    if schedule == "constant":
        return 1.0
    progress = min(max(step, 0), steps) / max(steps, 1)
    if schedule == "cosine":
        return 0.5 * (1.0 + math.cos(math.pi * progress))
    if schedule == "step":
        return 0.01 if progress >= 0.75 else 0.1 if progress >= 0.5 else 1.0
    raise ValueError(f"unknown lr_schedule {schedule!r}: one of {', '.join(SCHEDULES)}")


def set_lr(optimizers: list, lr: float) -> None:
    """Every parameter group of ``optimizers`` takes ``lr`` (momentum buffers and other state stay)."""
    for optimizer in optimizers:
        for group in optimizer.param_groups:
            group["lr"] = lr
