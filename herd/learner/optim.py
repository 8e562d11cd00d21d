"""Optimizers and the learning-rate schedule of the learner, written so that an update
makes no host read: whether to apply a step is a device flag, and the learning rate a
device tensor computed from a device count of applied updates.

Why not torch.optim as it is: a skipped update (a non-finite loss, gradient or resulting
weight) must change no weight and no optimizer or schedule state. torch's optimizers
always move their running averages, so the old learner cloned every parameter, stepped,
read a flag on the host and copied back. Here each step computes its candidate weights
and state with foreach kernels, checks them on the device, and commits them with
`torch.where(ok, new, old)`: nothing is read on the host, and the whole update can be
captured in one CUDA graph.

The classes subclass torch's RMSprop, Adam and SGD for their constructors, param groups
and state_dict format (state keys "step", "square_avg", "exp_avg", "exp_avg_sq"), so
checkpoints written with torch's optimizers load unchanged, and the other way round.
"""
from __future__ import annotations

import torch
from torch import Tensor


def _commit(olds: list[Tensor], news: list[Tensor], ok: Tensor) -> None:
    """old <- new where ok (a 0-dim bool tensor), per tensor; no host read."""
    for old, new in zip(olds, news):
        old.copy_(torch.where(ok, new, old))


def _all_finite(tensors: list[Tensor]) -> Tensor:
    """One 0-dim bool: every element of every tensor is finite. x * 0 is 0 for a finite x
    and NaN for inf or NaN, and a sum with one NaN is NaN; unlike a norm, this never
    overflows on large finite values."""
    zeros = torch._foreach_mul(tensors, 0.0)
    return torch.isfinite(torch.stack([z.sum() for z in zeros]).sum())


def _one_minus(tensors: list[Tensor]) -> list[Tensor]:
    torch._foreach_neg_(tensors)
    torch._foreach_add_(tensors, 1.0)
    return tensors


class GuardedStep:
    """Mixin: step(ok, lr) -> applied (a 0-dim bool tensor on the parameters' device)."""

    def _params_with_grads(self) -> list[Tensor]:
        if len(self.param_groups) != 1:
            raise ValueError("herd's learner optimizers take one parameter group")
        return [p for p in self.param_groups[0]["params"] if p.grad is not None]

    def _state_tensor(self, param: Tensor, name: str) -> Tensor:
        """A state entry on the parameter's device (a torch checkpoint keeps "step" on the
        CPU): moved once, when first used."""
        value = self.state[param][name]
        if value.device != param.device:
            value = self.state[param][name] = value.to(param.device)
        return value


class GuardedRMSprop(GuardedStep, torch.optim.RMSprop):
    """IMPALA's RMSprop (torch's non-centered form without momentum or weight decay):
    square_avg <- alpha square_avg + (1 - alpha) g^2;  p <- p - lr g / (sqrt(square_avg) + eps)."""

    def __init__(self, params, lr: float, alpha: float = 0.99, eps: float = 1e-8):
        super().__init__(params, lr=lr, alpha=alpha, eps=eps, momentum=0.0, centered=False, weight_decay=0.0)

    @torch.no_grad()
    def step(self, ok: Tensor, lr: Tensor) -> Tensor:  # type: ignore[override]
        group = self.param_groups[0]
        params = self._params_with_grads()
        for p in params:
            if not self.state[p]:
                self.state[p] = {"step": torch.zeros((), device=p.device),
                                 "square_avg": torch.zeros_like(p, memory_format=torch.preserve_format)}
        grads = [p.grad for p in params]
        squares = [self._state_tensor(p, "square_avg") for p in params]
        steps = [self._state_tensor(p, "step") for p in params]
        alpha = group["alpha"]
        new_squares = torch._foreach_mul(squares, alpha)
        torch._foreach_addcmul_(new_squares, grads, grads, value=1.0 - alpha)
        denominators = torch._foreach_sqrt(new_squares)
        torch._foreach_add_(denominators, group["eps"])
        updates = torch._foreach_div(grads, denominators)
        torch._foreach_mul_(updates, lr)
        new_params = torch._foreach_sub(params, updates)
        applied = ok & _all_finite(new_params) & _all_finite(new_squares)
        _commit(params, new_params, applied)
        _commit(squares, new_squares, applied)
        # A list of the flag, not the flag itself: torch's CPU path reads a lone scalar
        # tensor argument of _foreach_add_ on the host (.item()); a list it does not.
        torch._foreach_add_(steps, [applied.float()] * len(steps))
        return applied


class GuardedAdam(GuardedStep, torch.optim.Adam):
    """torch's Adam (no AMSGrad, no weight decay), bias-corrected from a per-parameter
    device step count."""

    def __init__(self, params, lr: float, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8):
        super().__init__(params, lr=lr, betas=betas, eps=eps)

    @torch.no_grad()
    def step(self, ok: Tensor, lr: Tensor) -> Tensor:  # type: ignore[override]
        group = self.param_groups[0]
        beta1, beta2 = group["betas"]
        params = self._params_with_grads()
        for p in params:
            if not self.state[p]:
                self.state[p] = {"step": torch.zeros((), device=p.device),
                                 "exp_avg": torch.zeros_like(p, memory_format=torch.preserve_format),
                                 "exp_avg_sq": torch.zeros_like(p, memory_format=torch.preserve_format)}
        grads = [p.grad for p in params]
        means = [self._state_tensor(p, "exp_avg") for p in params]
        squares = [self._state_tensor(p, "exp_avg_sq") for p in params]
        steps = [self._state_tensor(p, "step") for p in params]
        new_steps = torch._foreach_add(steps, 1.0)
        new_means = torch._foreach_lerp(means, grads, 1.0 - beta1)
        new_squares = torch._foreach_mul(squares, beta2)
        torch._foreach_addcmul_(new_squares, grads, grads, value=1.0 - beta2)
        # step size lr / (1 - beta1^t); denominator sqrt(v) / sqrt(1 - beta2^t) + eps, as torch.
        bias1 = _one_minus(torch._foreach_pow(beta1, new_steps))
        bias2_sqrt = torch._foreach_sqrt(_one_minus(torch._foreach_pow(beta2, new_steps)))
        denominators = torch._foreach_sqrt(new_squares)
        torch._foreach_div_(denominators, bias2_sqrt)
        torch._foreach_add_(denominators, group["eps"])
        updates = torch._foreach_div(new_means, denominators)
        torch._foreach_div_(updates, bias1)
        torch._foreach_mul_(updates, lr)
        new_params = torch._foreach_sub(params, updates)
        applied = ok & _all_finite(new_params) & _all_finite(new_means) & _all_finite(new_squares)
        _commit(params, new_params, applied)
        _commit(means, new_means, applied)
        _commit(squares, new_squares, applied)
        _commit(steps, new_steps, applied)
        return applied


class GuardedSGD(GuardedStep, torch.optim.SGD):
    """Plain gradient descent, p <- p - lr g (tests that check gradients through the weights)."""

    def __init__(self, params, lr: float):
        super().__init__(params, lr=lr)

    @torch.no_grad()
    def step(self, ok: Tensor, lr: Tensor) -> Tensor:  # type: ignore[override]
        params = self._params_with_grads()
        new_params = torch._foreach_sub(params, torch._foreach_mul([p.grad for p in params], lr))
        applied = ok & _all_finite(new_params)
        _commit(params, new_params, applied)
        return applied


def build_optimizer(name: str, params, lr: float, rmsprop_eps: float) -> torch.optim.Optimizer:
    if name == "rmsprop":
        # IMPALA's RMSprop: decay 0.99, no momentum, a large epsilon for stability.
        return GuardedRMSprop(params, lr=lr, alpha=0.99, eps=rmsprop_eps)
    if name == "adam":
        return GuardedAdam(params, lr=lr)
    raise ValueError(f"unknown optimizer '{name}' (use rmsprop or adam)")


class PolynomialSchedule:
    """Polynomial decay from lr to lr_end over `steps` applied updates, then flat:
    lr_end + (lr - lr_end) * (1 - n / steps) ** power, n the applied updates so far. Power 1
    is linear; the seed's (TensorFlow's polynomial_decay) is 2. `lr` is a device tensor
    (the rate for the next update), recomputed on the device after every step; a skipped
    update does not count. state_dict keeps torch's LambdaLR key ("last_epoch": n), so
    checkpoints from before this schedule resume at the same point."""

    def __init__(self, lr: float, lr_end: float, steps: int, power: float = 1.0, device=None):
        if steps < 1:
            raise ValueError(f"the learning-rate schedule needs at least 1 step, got {steps}")
        self.base_lr = lr
        self.end_fraction = min(lr_end / lr, 1.0) if lr > 0 else 1.0
        self.steps = steps
        self.power = power
        self.applied = torch.zeros((), dtype=torch.float64, device=device)
        self.lr = torch.empty((), dtype=torch.float32, device=device)
        self._recompute()

    def _recompute(self) -> None:
        progress = torch.clamp(self.applied / self.steps, max=1.0)
        factor = self.end_fraction + (1.0 - self.end_fraction) * (1.0 - progress) ** self.power
        self.lr.copy_(self.base_lr * factor)

    def step(self, applied: Tensor) -> None:
        """applied: the update's 0-dim bool flag."""
        self.applied.add_(applied.to(self.applied.dtype))
        self._recompute()

    def to(self, device) -> "PolynomialSchedule":
        self.applied = self.applied.to(device)
        self.lr = self.lr.to(device)
        return self

    @property
    def last_epoch(self) -> int:
        """Updates applied so far (a host read: for checkpoints, summaries and tests)."""
        return int(self.applied)

    def state_dict(self) -> dict:
        return {"last_epoch": self.last_epoch}

    def load_state_dict(self, state: dict) -> None:
        self.applied.fill_(int(state["last_epoch"]))
        self._recompute()


def build_scheduler(optimizer: torch.optim.Optimizer, lr: float, lr_end: float, steps: int,
                    power: float = 1.0) -> PolynomialSchedule:
    """The schedule on the device of the optimizer's parameters."""
    device = optimizer.param_groups[0]["params"][0].device
    return PolynomialSchedule(lr, lr_end, steps, power, device=device)
