"""Rank side of soft errors: live bit flips at exact points of a step, and the detectors that look for them.

Injection points (``flip:target=``): ``weight``, ``optimizer``, ``buffer``, ``grad``, ``grad_local``,
``activation``. Detectors (``detect``): ``guard`` (non-finite or huge losses, gradients and weights), ``spike``
(a loss above ``spike_factor`` x its recent median) and ``fingerprint`` (replicas bitwise equal). A decision to
recover must be the same on every rank, so it is taken only on collective information, riding in the gradient
buckets' alarm slots; on an alarm every rank returns to the last verified snapshot, and an alarm that repeats
after that rollback is let through as deterministic. Details: docs/soft-errors.md and docs/internals.md.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from workbench.base.errors import WorkbenchError
from workbench.config.run import FaultSpec, RunConfig
from workbench.faults import kinds
from workbench.faults.bitflip import Flip, apply_masks, width
from workbench.rank.state import float_buffers

SPIKE_MARGIN = 1.0  # nats of cross-entropy a spike must also exceed the recent median by
DIGESTS = 4  # 8-bit digests of the fingerprint in the alarm slots: h and h^2 of each are exact float32 sums
ALARM_SLOTS = 2 + 2 * DIGESTS  # guard, spike, then the fingerprint's digests
NO_DIGESTS = (0.0,) * (2 * DIGESTS)


class Detected(WorkbenchError):
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
        self.pending = [f for f in faults if kinds.of(f).fires is kinds.Fires.INJECTOR]
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

    def flips_state(self, step: int) -> bool:
        """A flip into the weights, buffers or optimizer state is due at the start of ``step`` (it writes them in
        place: a checkpoint's copy under way must have passed them)."""
        return any(f.target in ("weight", "buffer", "optimizer") and f.step in (step, -1) for f in self.pending)

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
        # this step's reduced gradient buckets (and their parameters' names), checked by ``settle`` with its alarms
        self.pending: list[tuple[torch.Tensor, list[str]]] = []
        self.weights_due = False  # check the weights at the next step (its guard slot carries the result)
        self.fingerprint_due = False  # the next step's alarm slots carry this replica's fingerprint digests
        self.diverged = False  # the last settled step's digests disagreed: the replicas must be compared
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
        """This rank's alarm slots for this step (1.0 = alarm; then the fingerprint's digests, zeros when none is
        due), sent with the gradients."""
        guard = spike = 0.0
        self.pending = []
        if "guard" in self.on and (not math.isfinite(loss) or abs(loss) > self.limit):
            guard = 1.0
        if self.weights_due:
            self.weights_due = False
            guard = max(guard, self.weights_alarm())
        if "spike" in self.on and math.isfinite(loss):
            recent = sorted(self.recent)
            n = len(recent)
            median = None if n < 5 else (recent[n // 2] if n % 2 else (recent[n // 2 - 1] + recent[n // 2]) / 2)
            # relative AND absolute: late in training a 10x jump of a 1e-3 loss is noise, not corruption
            if median is not None and loss > self.spike_factor * median and loss > median + SPIKE_MARGIN:
                spike = 1.0
            else:
                self.recent.append(loss)
        if not self.fingerprint_due:
            return [guard, spike, *NO_DIGESTS]
        self.fingerprint_due = False
        value, slots = self.fingerprint(), [guard, spike]
        for k in range(DIGESTS):
            digest = float((value >> (8 * k)) & 0xFF) + 1.0  # 1..256: a member that sent none shows too
            slots += [digest, digest * digest]
        return slots

    def check_fingerprint_next(self) -> None:
        """Have the next step's alarm slots carry this replica's fingerprint (as it is at that step's start)."""
        self.fingerprint_due = "fingerprint" in self.on

    def forget_due_checks(self) -> None:
        """A generation change or a rollback: checks asked for the next step no longer describe this state."""
        self.weights_due = self.fingerprint_due = self.diverged = False

    def note_reduced(self, bucket_buffer: torch.Tensor, names: list[str]) -> None:
        """Remember a bucket's gradients after their allreduce (identical on every rank) for :meth:`settle`."""
        if "guard" in self.on:
            self.pending.append((bucket_buffer, names))

    def settle(self, step: int, alarms: torch.Tensor, members: int) -> None:
        """The step's summed alarm slots (they came back with the gradients) and its reduced gradients, once the
        step's updates are applied; every rank holds the same values, so every rank raises the same
        :class:`Detected` or none, and sets ``diverged`` alike. Gradients: one pass (their sum of squares) bounds
        every value; only a sum beyond ``guard_limit``^2 (or non-finite) is looked at value by value."""
        pending, self.pending = self.pending, []
        guard, spike, *digests = alarms.tolist()
        if digests[0]:  # somebody fingerprinted: every slot pair is an exact integer sum
            sums = [(round(digests[2 * k]), round(digests[2 * k + 1])) for k in range(DIGESTS)]
            self.diverged = any(members * squares != total * total for total, squares in sums)
        if step in self.suppressed:
            return
        if guard > 0:
            raise Detected("guard", f"non-finite or > {self.limit:g} loss or weights on {int(guard)} rank(s) at "
                           f"step {step}")
        if spike > 0:
            raise Detected("spike", f"loss spike on {int(spike)} rank(s) at step {step}")
        bound = self.limit * self.limit * (1 - 1e-3)  # below it, no |value| can exceed the limit (rounding aside)
        for gradients, names in pending:
            flat = gradients.detach()
            if float(torch.dot(flat, flat)) <= bound:  # NaN and inf fail "<=": they are looked at below
                continue
            values = flat.cpu().numpy()
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
