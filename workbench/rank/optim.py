"""The ranks' optimizers: SGD (with momentum) and Adam, the same arithmetic as ``torch.optim`` on the CPU.

Not ``torch.optim`` itself: building or stepping one imports ``torch._dynamo``, which costs a cold start more than
torch's own import, and ranks need no compilation. These classes do what torch's single-tensor CPU path does, op
for op and bitwise (``tests/test_optim.py``), with torch's ``param_groups``/``state``/``state_dict`` layout.
Undoable steps (rollback: ``step(undoable=True)``, then ``undo()``) compute out of place into spare tensors and
swap them in, so the failed step in flight is undone exactly without copying anything. Details and the
measurement behind this choice: docs/internals.md.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from typing import Any

import torch
from torch import nn


class Optimizer:
    """What SGD and Adam share: groups, per-parameter state, zero_grad and the state dict."""

    def __init__(self, params: Iterable[nn.Parameter], defaults: dict[str, Any]) -> None:
        self.defaults = dict(defaults)
        self.param_groups: list[dict[str, Any]] = [{"params": list(params), **self.defaults}]
        self.state: defaultdict[nn.Parameter, dict[str, Any]] = defaultdict(dict)
        # undoable steps: (parameter, its data before the step, its state before the step) of the last step
        self._before: list[tuple[nn.Parameter, torch.Tensor, dict[str, Any]]] = []
        self._undoable = False
        self._spares: dict[nn.Parameter, dict[str, torch.Tensor]] = {}  # recycled outputs, per parameter and key

    def _params(self) -> list[nn.Parameter]:
        return [p for group in self.param_groups for p in group["params"]]

    def _begin(self, undoable: bool) -> None:
        """Start a step: the previous step is committed, so what it kept for an undo becomes spare buffers."""
        for param, data, state in self._before:
            spares = self._spares.setdefault(param, {})
            spares["param"] = data
            spares.update((k, v) for k, v in state.items() if torch.is_tensor(v) and k != "step")
        self._before = []
        self._undoable = undoable

    def _out(self, param: nn.Parameter, key: str, like: torch.Tensor) -> torch.Tensor | None:
        """Where an undoable step writes the new value of ``key`` (None: in place, the step is not undoable)."""
        if not self._undoable:
            return None
        spare = self._spares.get(param, {}).pop(key, None)
        if spare is None or spare.shape != like.shape or spare.dtype != like.dtype or spare is like:
            spare = torch.empty_like(like)
        return spare

    def _keep(self, param: nn.Parameter, state: dict[str, Any]) -> None:
        if self._undoable:
            self._before.append((param, param.data, dict(state)))

    def undo(self) -> None:
        """Put back the parameters and state from before the last step (which must have been undoable)."""
        if not self._undoable:
            raise RuntimeError("undo() after a step that was not undoable")
        with torch.no_grad():
            for param, data, state in reversed(self._before):
                spares = self._spares.setdefault(param, {})
                spares["param"] = param.data
                spares.update((k, v) for k, v in self.state.get(param, {}).items()
                              if torch.is_tensor(v) and k != "step")
                param.data = data
                if state:
                    self.state[param] = state
                else:
                    self.state.pop(param, None)  # it had no history before that step
        self._before = []
        self._undoable = False

    def zero_grad(self, set_to_none: bool = True) -> None:
        for param in self._params():
            if param.grad is None:
                continue
            if set_to_none:
                param.grad = None
            else:
                param.grad.detach_().zero_()  # a gradient that is a view into a bucket stays that view

    def state_dict(self) -> dict[str, Any]:
        """``{"state": {index: {key: value}}, "param_groups": [{..., "params": [index, ...]}]}`` (live tensors)."""
        index = {p: i for i, p in enumerate(self._params())}
        groups = [{**{k: v for k, v in g.items() if k != "params"}, "params": [index[p] for p in g["params"]]}
                  for g in self.param_groups]
        return {"state": {index[p]: s for p, s in self.state.items() if p in index}, "param_groups": groups}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Take a state dict's per-parameter state (copies) and hyper-parameters, matching parameters by index."""
        params = self._params()
        if len(state_dict["param_groups"]) != len(self.param_groups):
            raise ValueError("the state dict has a different number of parameter groups")
        for group, saved in zip(self.param_groups, state_dict["param_groups"]):
            if len(saved["params"]) != len(group["params"]):
                raise ValueError("a parameter group of the state dict has a different number of parameters")
            group.update({k: v for k, v in saved.items() if k != "params"})
        self.state = defaultdict(dict)
        for i, saved in state_dict["state"].items():
            param = params[int(i)]
            self.state[param] = {k: self._cast(param, k, v) for k, v in saved.items()}

    @staticmethod
    def _cast(param: nn.Parameter, key: str, value: Any) -> Any:
        if not torch.is_tensor(value):
            return value
        if key == "step":  # torch keeps Adam's step as a float32 scalar, whatever the parameter's dtype
            return value.detach().clone()
        return value.detach().to(dtype=param.dtype, device=param.device, copy=True)


class SGD(Optimizer):
    """``torch.optim.SGD(params, lr, momentum)``: ``buf = momentum * buf + grad`` (the first step's buffer is the
    gradient itself), ``param -= lr * buf``; without momentum ``param -= lr * grad``."""

    def __init__(self, params: Iterable[nn.Parameter], lr: float, momentum: float = 0.0) -> None:
        super().__init__(params, {"lr": lr, "momentum": momentum, "dampening": 0, "weight_decay": 0,
                                  "nesterov": False, "maximize": False})

    @torch.no_grad()
    def step(self, undoable: bool = False) -> None:
        self._begin(undoable)
        for group in self.param_groups:
            lr, momentum = group["lr"], group["momentum"]
            for param in group["params"]:
                if param.grad is None:
                    continue
                grad = param.grad
                state = self.state[param]
                self._keep(param, state)
                if momentum != 0:
                    buf = state.get("momentum_buffer")
                    if buf is None:
                        buf = grad.detach().clone()
                    else:
                        buf = torch.mul(buf, momentum, out=self._out(param, "momentum_buffer", buf))
                        buf.add_(grad, alpha=1)
                    state["momentum_buffer"] = buf
                    grad = buf
                out = self._out(param, "param", param.data)
                if out is None:
                    param.add_(grad, alpha=-lr)
                else:
                    param.data = torch.add(param.data, grad, alpha=-lr, out=out)


class Adam(Optimizer):
    """``torch.optim.Adam(params, lr)`` with torch's defaults (betas 0.9/0.999, eps 1e-8), its single-tensor path."""

    def __init__(self, params: Iterable[nn.Parameter], lr: float, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8) -> None:
        super().__init__(params, {"lr": lr, "betas": betas, "eps": eps, "weight_decay": 0, "amsgrad": False,
                                  "maximize": False})

    @torch.no_grad()
    def step(self, undoable: bool = False) -> None:
        self._begin(undoable)
        for group in self.param_groups:
            lr, (beta1, beta2), eps = group["lr"], group["betas"], group["eps"]
            for param in group["params"]:
                if param.grad is None:
                    continue
                grad = param.grad
                state = self.state[param]
                self._keep(param, state)
                if not state:
                    state["step"] = torch.tensor(0.0)
                    state["exp_avg"] = torch.zeros_like(param, memory_format=torch.preserve_format)
                    state["exp_avg_sq"] = torch.zeros_like(param, memory_format=torch.preserve_format)
                exp_avg, exp_avg_sq, step_t = state["exp_avg"], state["exp_avg_sq"], state["step"]
                if self._undoable:
                    state["step"] = step_t = step_t + 1
                    state["exp_avg"] = exp_avg = torch.lerp(exp_avg, grad, 1 - beta1,
                                                            out=self._out(param, "exp_avg", exp_avg))
                    state["exp_avg_sq"] = exp_avg_sq = torch.mul(exp_avg_sq, beta2,
                                                                 out=self._out(param, "exp_avg_sq", exp_avg_sq))
                else:
                    step_t += 1
                    exp_avg.lerp_(grad, 1 - beta1)
                    exp_avg_sq.mul_(beta2)
                exp_avg_sq.addcmul_(grad, grad, value=1 - beta2)
                step = step_t.item()
                bias_correction1 = 1 - beta1**step
                bias_correction2 = 1 - beta2**step
                step_size = lr / bias_correction1
                denom = (exp_avg_sq.sqrt() / bias_correction2**0.5).add_(eps)
                out = self._out(param, "param", param.data)
                if out is None:
                    param.addcdiv_(exp_avg, denom, value=-step_size)
                else:
                    param.data = torch.addcdiv(param.data, exp_avg, denom, value=-step_size, out=out)


def make_optimizer(kind: str, params: list[nn.Parameter], lr: float, momentum: float) -> Optimizer:
    """The rank's optimizer by name (``RunConfig.optimizer``): ``adam`` or ``sgd``."""
    if kind == "adam":
        return Adam(params, lr=lr)
    return SGD(params, lr=lr, momentum=momentum)
