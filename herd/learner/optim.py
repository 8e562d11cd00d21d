"""Optimizers and the learning-rate schedule of the learner, written so that an update
makes no host read: whether to apply a step is a device flag, and the learning rate a
device tensor computed from a device count of applied updates.

Why not torch.optim as it is: a skipped update (a non-finite loss, gradient or resulting
weight) must change no weight and no optimizer or schedule state. torch's optimizers
always move their running averages, so the old learner cloned every parameter, stepped,
read a flag on the host and copied back. Here each step computes its candidate weights
and state with foreach kernels, checks them on the device, and commits them with
`torch.where(ok, new, old)`: nothing is read on the host, and the whole update can be
captured in one CUDA graph. On a CPU, Adam runs aten's fused kernel instead, which skips
a step by its found_inf flag (GuardedAdam._fused_cpu_step).

The classes keep torch.optim's param groups and state_dict format (state keys "step",
"square_avg", "exp_avg", "exp_avg_sq"; torch's hyperparameter names), so checkpoints
written with torch's optimizers load unchanged, and the other way round. They do not
subclass torch.optim.Optimizer: its methods import torch._dynamo when first called, about
as long as importing torch itself, and the first update of every run waited for it.
"""
from __future__ import annotations

from collections import defaultdict

import torch
from torch import Tensor


def _norm(tensors: list[Tensor]) -> Tensor:
    """The 2-norm of all the tensors together (0-dim), inf or NaN if any element is: one
    read pass, no allocation; an upper bound of every |x|."""
    return torch.linalg.vector_norm(torch.stack(torch._foreach_norm(tensors)))


def laid_out_like(param: Tensor, value: Tensor) -> Tensor:
    """value on param's device, in its dtype and memory layout (a checkpoint written by a
    channels-last learner loaded into a contiguous one, or the other way round): the fused
    CPU kernel below walks every tensor of a parameter in memory order."""
    if value.device == param.device and value.dtype == param.dtype and value.stride() == param.stride():
        return value
    return torch.empty_like(param, memory_format=torch.preserve_format).copy_(value)


def same_layouts(params: list[Tensor], *others: list[Tensor]) -> bool:
    """Every tensor of `others` has its parameter's strides (the fused kernel's condition)."""
    return all(p.stride() == t.stride() for tensors in others for p, t in zip(params, tensors))


class GuardedStep:
    """An optimizer over one parameter group: step(ok, lr) -> applied, a 0-dim bool tensor
    on the parameters' device; param_groups, state, zero_grad, state_dict and
    load_state_dict as torch.optim's.

    Each step decides first, then updates in place (fresh tensors of parameter size cost a
    page-faulting allocation each, more than the arithmetic on a CPU):
      1. applied = ok and no weight can leave float32's range. Each optimizer's step is
         bounded, |update| <= lr * MAX_RATIO whatever the gradients (RMSprop:
         1 / sqrt(1 - alpha); Adam: see its class), so ||p|| + lr * MAX_RATIO, a bound of
         every new |p|, decides it on two scalars before anything moves;
      2. the gradients are zeroed where the step is not applied (their non-finite entries
         first: a NaN times 0 would still be NaN), the state's decay factors become 1 and
         the learning rate 0: a skipped step leaves weights and state exactly as they were.
    """
    # _scratch's buffers and the parameters (their ids) they were made for; none before the
    # first step.
    _scratch_key: tuple[int, ...] | None = None
    _scratch_buffers: list[Tensor]

    def __init__(self, params, defaults: dict):
        params = list(params)
        if not params or not all(isinstance(p, Tensor) for p in params):
            raise ValueError("an optimizer takes a non-empty list of parameter tensors")
        self.defaults = defaults
        self.param_groups = [{**defaults, "params": params}]
        self.state: defaultdict[Tensor, dict] = defaultdict(dict)

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.param_groups[0]["params"]:
            if set_to_none:
                p.grad = None
            elif p.grad is not None:
                p.grad.zero_()

    def state_dict(self) -> dict:
        """torch.optim's format: state by parameter index, the group's hyperparameters with
        "params" as the indices. The tensors are the optimizer's own (not copies)."""
        params = self.param_groups[0]["params"]
        index = {id(p): i for i, p in enumerate(params)}
        group = {key: value for key, value in self.param_groups[0].items() if key != "params"}
        return {"state": {index[id(p)]: dict(entries) for p, entries in self.state.items()},
                "param_groups": [{**group, "params": list(range(len(params)))}]}

    def load_state_dict(self, state_dict: dict) -> None:
        """Loads torch.optim's format (herd's or torch's own optimizers'): the saved
        hyperparameters replace the group's, and each state tensor moves to its parameter's
        device and, but for "step", its dtype (as torch's optimizers load them)."""
        params = self.param_groups[0]["params"]
        groups = state_dict["param_groups"]
        if len(groups) != 1 or len(groups[0]["params"]) != len(params):
            raise ValueError(f"the saved optimizer state has {len(groups)} group(s) of "
                             f"{[len(g['params']) for g in groups]} parameters; this model has 1 of {len(params)}")
        by_index = dict(zip(groups[0]["params"], params))
        self.param_groups[0].update({key: value for key, value in groups[0].items() if key != "params"})
        self.state = defaultdict(dict)
        for index, entries in state_dict["state"].items():
            param = by_index[index]
            self.state[param] = {name: (value.to(param.device) if name == "step" else laid_out_like(param, value))
                                 if isinstance(value, Tensor) else value for name, value in entries.items()}

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

    def _scratch(self, params: list[Tensor]) -> list[Tensor]:
        """Buffers shaped like params, kept between steps (not in the state_dict: they hold
        nothing from one step to the next)."""
        key = tuple(id(p) for p in params)
        if self._scratch_key != key:
            self._scratch_key = key
            self._scratch_buffers = [torch.empty_like(p) for p in params]
        return self._scratch_buffers

    def _decide(self, params: list[Tensor], ok: Tensor, lr: Tensor, max_ratio: float) -> tuple[Tensor, list[Tensor]]:
        """(applied, the gradients, zeroed unless applied)."""
        applied = ok & torch.isfinite(_norm(params) + lr * max_ratio)
        grads = [p.grad for p in params]
        # Non-finite entries to 0 (a NaN times 0 would still be NaN), then all of them
        # times the flag: two cheap passes, where masked_fill_ with a 0-dim mask took as
        # long as both on a CPU.
        for grad in grads:
            torch.nan_to_num_(grad, nan=0.0, posinf=0.0, neginf=0.0)
        torch._foreach_mul_(grads, applied.to(grads[0].dtype))
        return applied, grads

    def _square_roots(self, params: list[Tensor], squares: list[Tensor]) -> list[Tensor]:
        """sqrt(squares) into the scratch buffers. On a CPU one pass per tensor (aten runs
        a foreach op tensor by tensor anyway, and a copy then sqrt_ would be two passes);
        on a GPU two foreach kernels for all of them."""
        roots = self._scratch(params)
        if roots[0].device.type == "cpu":
            for square, root in zip(squares, roots):
                torch.sqrt(square, out=root)
        else:
            torch._foreach_copy_(roots, squares)
            torch._foreach_sqrt_(roots)
        return roots


class GuardedRMSprop(GuardedStep):
    """IMPALA's RMSprop (torch's non-centered form without momentum or weight decay):
    square_avg <- alpha square_avg + (1 - alpha) g^2;  p <- p - lr g / (sqrt(square_avg) + eps).
    |g| / sqrt(square_avg) <= |g| / sqrt((1 - alpha) g^2): the step is at most
    lr / sqrt(1 - alpha) (10 lr at alpha 0.99)."""

    def __init__(self, params, lr: float, alpha: float = 0.99, eps: float = 1e-8):
        super().__init__(params, dict(lr=lr, alpha=alpha, eps=eps, momentum=0.0, centered=False, weight_decay=0.0))

    @torch.no_grad()
    def step(self, ok: Tensor, lr: Tensor) -> Tensor:  # type: ignore[override]
        group = self.param_groups[0]
        alpha = group["alpha"]
        params = self._params_with_grads()
        for p in params:
            if not self.state[p]:
                self.state[p] = {"step": torch.zeros((), device=p.device),
                                 "square_avg": torch.zeros_like(p, memory_format=torch.preserve_format)}
        applied, grads = self._decide(params, ok, lr, 1.0 / (1.0 - alpha) ** 0.5)
        squares = [self._state_tensor(p, "square_avg") for p in params]
        steps = [self._state_tensor(p, "step") for p in params]
        torch._foreach_mul_(squares, torch.where(applied, alpha, 1.0))
        torch._foreach_addcmul_(squares, grads, grads, value=1.0 - alpha)
        # p += g / denominator, with denominator = -(sqrt(square_avg) + eps) / lr: a skipped
        # step divides 0 by -inf.
        denominators = self._square_roots(params, squares)
        torch._foreach_add_(denominators, group["eps"])
        torch._foreach_div_(denominators, -(lr * applied))
        torch._foreach_addcdiv_(params, grads, denominators)
        # A list of the flag, not the flag itself: torch's CPU path reads a lone scalar
        # tensor argument of _foreach_add_ on the host (.item()); a list it does not.
        torch._foreach_add_(steps, [applied.to(steps[0].dtype)] * len(steps))
        return applied


class GuardedAdam(GuardedStep):
    """torch's Adam (no AMSGrad, no weight decay), bias-corrected from a per-parameter
    device step count. Its step is bounded: |m_t| <= (1 - b1) sum_k b1^k |g_(t-k)| and
    sqrt(v_t) >= sqrt(1 - b2) b2^(k/2) |g_(t-k)| for every k, so |m_t| / sqrt(v_t) <=
    (1 - b1) / sqrt(1 - b2) / (1 - b1 / sqrt(b2)) (about 32 at the defaults), and the bias
    corrections multiply that by sqrt(1 - b2^t) / (1 - b1^t) <= 1 / (1 - b1)."""

    def __init__(self, params, lr: float, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 fused_on_cpu: bool = True):
        """fused_on_cpu: parameters on a CPU step through aten's fused kernel (False: the
        foreach kernels, as on a GPU, where the step is captured with the update)."""
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=0.0, amsgrad=False))
        self.fused_on_cpu = fused_on_cpu
        b1, b2 = betas
        self.max_ratio = (1 - b1) / (1 - b2) ** 0.5 / (1 - b1 / b2 ** 0.5) / (1 - b1)

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
        means = [self._state_tensor(p, "exp_avg") for p in params]
        squares = [self._state_tensor(p, "exp_avg_sq") for p in params]
        steps = [self._state_tensor(p, "step") for p in params]
        if (self.fused_on_cpu and params[0].device.type == "cpu"
                and same_layouts(params, [p.grad for p in params], means, squares)):
            return self._fused_cpu_step(params, means, squares, steps, ok, lr)
        applied, grads = self._decide(params, ok, lr, self.max_ratio)
        # m <- b1 m + (1 - b1) g (the gradients are 0 where the step is skipped). Not
        # _foreach_lerp_: with a 0-dim tensor weight aten reads it on the host (.item()), a
        # device sync per step that also broke the update's CUDA graph capture.
        torch._foreach_mul_(means, torch.where(applied, beta1, 1.0))
        torch._foreach_add_(means, grads, alpha=1.0 - beta1)
        torch._foreach_mul_(squares, torch.where(applied, beta2, 1.0))
        torch._foreach_addcmul_(squares, grads, grads, value=1.0 - beta2)
        torch._foreach_add_(steps, [applied.to(steps[0].dtype)] * len(steps))
        # As torch: p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps), written as
        # p += m / denominator (every parameter's step count moves together: one is enough).
        t = steps[0].clamp(min=1)
        bias1 = 1 - beta1 ** t
        bias2_sqrt = (1 - beta2 ** t).sqrt()
        denominators = self._square_roots(params, squares)
        torch._foreach_div_(denominators, bias2_sqrt)
        torch._foreach_add_(denominators, group["eps"])
        torch._foreach_div_(denominators, -(lr * applied) / bias1)
        # A skipped step: means and squares as they were, and m / -inf = 0 added.
        torch._foreach_addcdiv_(params, means, denominators)
        return applied

    def _fused_cpu_step(self, params, means, squares, steps, ok: Tensor, lr: Tensor) -> Tensor:
        """The same step through aten's fused CPU kernel: one pass over each parameter for
        the whole update, against a dozen foreach passes, each run tensor by tensor on a
        CPU (CartPole's learner: 944 aten ops an update against 1152;
        tests/learner/test_fused_adam.py checks the two paths agree). A skipped step is the
        kernel's found_inf (it then returns before touching anything; the flag of a CPU
        tensor is read where it lies, no device sync) and a step count that does not move."""
        group = self.param_groups[0]
        beta1, beta2 = group["betas"]
        applied = ok & torch.isfinite(_norm(params) + lr * self.max_ratio)
        torch._foreach_add_(steps, [applied.to(steps[0].dtype)] * len(steps))
        torch._fused_adam_(params, [p.grad for p in params], means, squares, [], steps, lr=lr, beta1=beta1,
                           beta2=beta2, weight_decay=0.0, eps=group["eps"], amsgrad=False, maximize=False,
                           grad_scale=None, found_inf=(~applied).float())
        return applied


class GuardedSGD(GuardedStep):
    """Plain gradient descent, p <- p - lr g (tests that check gradients through the
    weights). Unbounded steps: a gradient's own size is checked (the learner has already
    refused non-finite ones)."""

    def __init__(self, params, lr: float):
        super().__init__(params, dict(lr=lr, momentum=0.0, dampening=0.0, weight_decay=0.0, nesterov=False))

    @torch.no_grad()
    def step(self, ok: Tensor, lr: Tensor) -> Tensor:  # type: ignore[override]
        params = self._params_with_grads()
        ok = ok & torch.isfinite(lr * _norm([p.grad for p in params]))
        applied, grads = self._decide(params, ok, lr, 1.0)
        torch._foreach_add_(params, torch._foreach_mul(grads, -(lr * applied)))
        return applied


def build_optimizer(name: str, params, lr: float, rmsprop_eps: float) -> GuardedStep:
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
    checkpoints written with torch's LambdaLR resume at the same point."""

    def __init__(self, lr: float, lr_end: float, steps: int, power: float = 1.0, device=None):
        if steps < 1:
            raise ValueError(f"the learning-rate schedule needs at least 1 step, got {steps}")
        self.base_lr = lr
        self.end_fraction = min(lr_end / lr, 1.0) if lr > 0 else 1.0
        self.steps = steps
        self.power = power
        self.applied = torch.zeros((), dtype=torch.float64, device=device)
        self.lr = torch.empty((), dtype=torch.float32, device=device)
        self.followers: list[tuple[Tensor, float]] = []      # (tensor, its value at the start)
        self._recompute()

    def follow(self, value: float) -> Tensor:
        """A 0-dim float32 tensor on the schedule's device that is always value x (the rate
        now / the starting rate): another weight decayed with the rate (--entropy_decay),
        updated in place, so a captured update reads it without a host read."""
        tensor = torch.empty((), dtype=torch.float32, device=self.lr.device)
        self.followers.append((tensor, float(value)))
        self._recompute()
        return tensor

    def _recompute(self) -> None:
        progress = torch.clamp(self.applied / self.steps, max=1.0)
        factor = self.end_fraction + (1.0 - self.end_fraction) * (1.0 - progress) ** self.power
        self.lr.copy_(self.base_lr * factor)
        for tensor, value in self.followers:
            tensor.copy_(value * factor)

    def step(self, applied: Tensor) -> None:
        """applied: the update's 0-dim bool flag."""
        self.applied.add_(applied.to(self.applied.dtype))
        self._recompute()

    @property
    def last_epoch(self) -> int:
        """Updates applied so far (a host read: for checkpoints, summaries and tests)."""
        return int(self.applied)

    def state_dict(self) -> dict:
        """LambdaLR's keys: the applied updates, and the rate for the next one."""
        return {"last_epoch": self.last_epoch, "_last_lr": [float(self.lr)]}

    def load_state_dict(self, state: dict) -> None:
        self.applied.fill_(int(state["last_epoch"]))
        self._recompute()


def build_scheduler(optimizer: GuardedStep, lr: float, lr_end: float, steps: int,
                    power: float = 1.0) -> PolynomialSchedule:
    """The schedule on the device of the optimizer's parameters."""
    device = optimizer.param_groups[0]["params"][0].device
    return PolynomialSchedule(lr, lr_end, steps, power, device=device)
