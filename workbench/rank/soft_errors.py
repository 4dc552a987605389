"""Rank side of soft errors: live bit flips at exact points of a step, and the detectors that look for them.

Injection points (``flip:target=...``):
  * ``weight`` / ``optimizer``: at the start of the step, in this rank's parameter / optimizer state
    (``momentum_buffer``, ``exp_avg`` ...): this replica diverges from the others.
  * ``buffer``: at the start of the step, in a floating-point buffer of this rank's model (batch norm's
    ``running_mean`` / ``running_var``): used by evaluation, and in data parallel averaged into every replica's
    at the step's update (one replica's corrupt statistics reach all of them, divided by the world size).
  * ``grad``: in the gradient bucket before its allreduce: the corrupted sum reaches every replica.
  * ``grad_local``: in the bucket after its allreduce, on this rank only: replicas diverge.
  * ``activation``: in the output of module ``tensor`` (forward hook) during the step's forward pass.

Detectors (``detect``), with one rule: a decision to recover must be the same on every rank, so it is taken
only on collective information.
  * ``guard``: a non-finite or huge (> ``guard_limit``) loss on this rank raises an alarm that rides in the first
    gradient bucket (no extra collective); gradients are checked after their allreduce, where every rank sees
    the same sum (their min and max, read in place once the step's updates are applied, with the alarms);
    weights every ``detect_every`` steps: the snapshot taken then becomes the verified one only when the next
    step's alarms, whose guard slot carries that weight check, come back clean (no extra collective), so a
    corrupt weight never enters a verified snapshot and is caught within ``detect_every`` steps when neither the
    loss nor a gradient showed it first. A flipped exponent bit can leave the loss finite near 1e35:
    magnitudes count.
  * ``spike``: this rank's loss above ``spike_factor`` x the median of its recent losses; also an alarm slot.
  * ``fingerprint``: every ``detect_every`` steps the replicas allgather a fingerprint of their parameters and
    floating-point buffers; they must be bitwise equal. A strict majority re-broadcasts its parameters to the
    others; without one, all roll back to the last verified snapshot.
On an alarm every rank returns to the last verified in-memory snapshot (taken every ``detect_every`` steps,
after the fingerprint agreed when that detector is on). If the same detector fires at the same step again after
that rollback, the alarm is deterministic (the replay is bit-identical), not a transient error: the step is let
through and the event says so, rather than rolling back forever.
"""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from workbench.config import FaultSpec, RunConfig
from workbench.faults.bitflip import Flip, apply_masks, width
from workbench.rank.state import float_buffers

SPIKE_MARGIN = 1.0  # nats of cross-entropy a spike must also exceed the recent median by


class Detected(Exception):
    """Corruption seen on collective information: every rank raises this at the same point."""

    def __init__(self, detector: str, detail: str) -> None:
        self.detector = detector
        self.detail = detail
        super().__init__(f"{detector}: {detail}")


def flip_in(tensor: torch.Tensor, fault: FaultSpec, target: str, step: int) -> Flip:
    """Apply ``fault`` to ``tensor``; index and bit not given are drawn from (seed, step)."""
    rng = np.random.default_rng((fault.seed or 0, step))
    index = fault.index if fault.index is not None else int(rng.integers(tensor.numel()))
    bit = fault.bit if fault.bit is not None else int(rng.integers(width(tensor.dtype)))
    if index >= tensor.numel():
        raise ValueError(f"flip index {index} is out of range for {fault.tensor} with {tensor.numel()} elements")
    with torch.no_grad():
        data = tensor.detach()
        if not data.is_contiguous():
            raise ValueError(f"{fault.tensor} is not contiguous")
        return apply_masks(data, [index], [1 << bit], target)[0]


class Injector:
    """Holds this rank's pending flips and fires each at its point; ``report`` receives each flip done."""

    def __init__(self, model: torch.nn.Module, report: Callable[[FaultSpec, Flip, int], None]) -> None:
        self.model = model
        self.report = report
        self.pending: list[FaultSpec] = []
        self.params = dict(model.named_parameters())
        self.buffers = dict(float_buffers(model))
        self.modules = dict(model.named_modules())
        self._hooked: dict[str, torch.nn.Module] = {}  # module name -> the module object that carries our hook

    def refresh(self) -> None:
        """Re-read the model after its modules were replaced (apoptosis shrinks layers): parameters by name, and
        the activation hooks moved to the new module objects."""
        self.params = dict(self.model.named_parameters())
        self.buffers = dict(float_buffers(self.model))
        self.modules = dict(self.model.named_modules())
        for name in list(self._hooked):
            if name in self.modules and self.modules[name] is not self._hooked[name]:
                self._hook(name)

    def set(self, faults: list[FaultSpec]) -> None:
        self.pending = [f for f in faults if f.kind == "flip"]
        for f in self.pending:
            if f.target == "activation" and f.tensor in self.modules and self._hooked.get(f.tensor) is not \
                    self.modules[f.tensor]:
                self._hook(f.tensor)

    def _hook(self, name: str) -> None:
        self.modules[name].register_forward_hook(self._activation_hook(name))
        self._hooked[name] = self.modules[name]

    def due(self, target: str, step: int, tensor: str | None = None) -> list[FaultSpec]:
        """Flips of ``target`` due at ``step`` (a live flip with step -1 is due at once); removed when taken."""
        due = [f for f in self.pending if f.target == target and f.step in (step, -1)
               and (tensor is None or f.tensor == tensor)]
        for f in due:
            self.pending.remove(f)
        self.step_now = step
        return due

    def at_step_start(self, step: int, optimizer_state: Callable[[str], dict[str, torch.Tensor]]) -> None:
        self.step_now = step
        for f in self.due("weight", step):
            self.report(f, flip_in(self.params[f.tensor], f, f.tensor, step), step)
        for f in self.due("buffer", step):
            self.report(f, flip_in(self.buffers[f.tensor], f, f.tensor, step), step)
        for f in self.due("optimizer", step):
            state = optimizer_state(f.tensor)
            key = next((k for k, v in state.items() if torch.is_tensor(v) and v.numel() > 1), None)
            if key is None:  # no state yet (first step of SGD): nothing there to corrupt
                continue
            self.report(f, flip_in(state[key], f, f"{f.tensor}/{key}", step), step)

    def into_bucket(self, target: str, step: int, names: list[str], views: list[torch.Tensor]) -> None:
        for name, view in zip(names, views):
            for f in self.due(target, step, name):
                self.report(f, flip_in(view, f, f"{name}.grad", step), step)

    def _activation_hook(self, module_name: str) -> Callable[..., Any]:
        def hook(_module: torch.nn.Module, _inputs: Any, output: Any) -> Any:
            if self.model.training and isinstance(output, torch.Tensor):
                for f in self.due("activation", getattr(self, "step_now", -2), module_name):
                    out = output.detach().contiguous()
                    self.report(f, flip_in(out, f, f"{module_name}:output", self.step_now), self.step_now)
                    return output + (out - output.detach())  # the flipped values, gradients unchanged
            return output

        return hook


class Detectors:
    def __init__(self, config: RunConfig, model: torch.nn.Module) -> None:
        self.on = set(config.detect)
        self.limit = config.guard_limit
        self.spike_factor = config.spike_factor
        self.every = config.detect_every
        self.model = model
        self.params = self._watched()
        self.recent: deque[float] = deque(maxlen=20)
        # this step's reduced-gradient peaks and bucket-0 alarm slots, checked together by ``settle`` (one sync)
        self.pending: list[tuple[torch.Tensor, torch.Tensor, list[str]]] = []
        self.weights_due = False  # check the weights at the next step (its guard slot carries the result)
        # steps whose alarm came back after a rollback: training is deterministic, so such an alarm is not a
        # transient soft error; those steps are let through instead of rolling back forever
        self.suppressed: set[int] = set()

    @property
    def active(self) -> bool:
        return bool(self.on)

    def refresh(self) -> None:
        """Re-read the parameters after the model's layers were replaced (apoptosis)."""
        self.params = self._watched()

    def _watched(self) -> list[torch.Tensor]:
        """What the guard and the fingerprint look at: parameters and floating-point buffers (batch norm's
        running statistics are state every replica must hold alike, and a flipped one can be huge)."""
        return list(self.model.parameters()) + [b for _, b in float_buffers(self.model)]

    def local_alarms(self, loss: float) -> list[float]:
        """[guard, spike] alarms of this rank for this step (1.0 = alarm), sent with the gradients."""
        guard = spike = 0.0
        self.pending = []
        if "guard" in self.on and (not np.isfinite(loss) or abs(loss) > self.limit):
            guard = 1.0
        if self.weights_due:
            self.weights_due = False
            guard = max(guard, self.weights_alarm())
        if "spike" in self.on and np.isfinite(loss):
            median = statistics.median(self.recent) if len(self.recent) >= 5 else None
            # relative AND absolute: late in training a 10x jump of a 1e-3 loss is noise, not corruption
            if median is not None and loss > self.spike_factor * median and loss > median + SPIKE_MARGIN:
                spike = 1.0
            else:
                self.recent.append(loss)
        return [guard, spike]

    def note_reduced(self, bucket_buffer: torch.Tensor, names: list[str]) -> None:
        """Remember a bucket's gradients after their allreduce (identical on every rank) for :meth:`settle`."""
        if "guard" in self.on:
            self.pending.append((bucket_buffer, names))

    def settle(self, step: int, alarms: torch.Tensor) -> None:
        """The step's summed [guard, spike] alarm slots (they came back with the gradients) and the min and max of
        its reduced gradients, once the step's updates are applied; every rank holds the same values, so every rank
        raises the same :class:`Detected` or none. CPU tensors: the gradients are read in place through numpy (no
        copy, no tensor operation to dispatch); what this costs in a training step is the pass over memory that
        gloo's thread just wrote (~10 us per 8k floats here, against ~1 us in a hot loop: bench_bitflip)."""
        pending, self.pending = self.pending, []
        if step in self.suppressed:
            return
        guard, spike = alarms.tolist()
        if guard > 0:
            raise Detected("guard", f"non-finite or > {self.limit:g} loss or weights on {int(guard)} rank(s) at "
                           f"step {step}")
        if spike > 0:
            raise Detected("spike", f"loss spike on {int(spike)} rank(s) at step {step}")
        for gradients, names in pending:
            values = gradients.detach().numpy()
            low, high = float(values.min()), float(values.max())
            if not (-self.limit <= low and high <= self.limit):  # NaN fails "<=" too
                raise Detected("guard", f"non-finite or > {self.limit:g} gradient in {', '.join(names)} at step "
                               f"{step}")

    def check_weights_next(self) -> None:
        """Have the next step's guard alarm include this replica's weights (as they are at that step's start)."""
        self.weights_due = "guard" in self.on

    def weights_alarm(self) -> float:
        """1.0 when a weight or floating-point buffer of this replica is non-finite or > ``guard_limit``."""
        with torch.no_grad():  # min and max of every tensor, one host sync; NaN compares false, hence the "<="s
            low, high = torch.stack([torch.stack(torch.aminmax(p.detach())) for p in self.params]).aminmax(dim=0)
            low, high = low[0].item(), high[1].item()
        return 0.0 if -self.limit <= low and high <= self.limit else 1.0

    def fingerprint(self) -> int:
        """Fingerprint of the parameters' bits: per tensor, the int64 sum of its words read as integers (one
        pass, no copy); any single flipped bit changes it. Replicas must agree exactly."""
        total = 0
        with torch.no_grad():
            for p in self.params:
                words = p.detach().reshape(-1).view(torch.int32 if p.element_size() == 4 else torch.int16)
                total = (total * 1_000_003 + int(words.sum(dtype=torch.int64).item())) % (2**61 - 1)
        return total
