"""The learner step: batch -> model -> the algorithm's loss -> clipped gradient ->
optimizer and LR-scheduler step. Publishing weights and pacing live in the backend."""
from __future__ import annotations

import logging
import math

import numpy as np
import torch

from herd.models import ModelOutput
from herd.models.core import core_input_from_batch

log = logging.getLogger("herd")

# The metrics the learner adds to the loss's own (train.csv, TensorBoard).
LEARNER_METRICS = ("grad_norm", "lr")


def build_optimizer(name: str, params, lr: float, rmsprop_eps: float) -> torch.optim.Optimizer:
    if name == "rmsprop":
        # IMPALA's RMSprop: decay 0.99, no momentum, a large epsilon for stability.
        return torch.optim.RMSprop(params, lr=lr, alpha=0.99, eps=rmsprop_eps, momentum=0.0)
    if name == "adam":
        return torch.optim.Adam(params, lr=lr)
    raise ValueError(f"unknown optimizer '{name}' (use rmsprop or adam)")


def build_scheduler(optimizer: torch.optim.Optimizer, lr: float, lr_end: float, steps: int, power: float = 1.0):
    """Polynomial decay from lr to lr_end over `steps` updates, then flat:
    lr_end + (lr - lr_end) * (1 - update / steps) ** power. Power 1 is linear; the seed's
    (TensorFlow's polynomial_decay) is 2."""
    end_fraction = min(lr_end / lr, 1.0)

    def factor(update: int) -> float:
        progress = min(update, steps) / steps
        return end_fraction + (1.0 - end_fraction) * (1.0 - progress) ** power

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def to_tensors(batch: dict[str, np.ndarray], replayed: np.ndarray, device: torch.device,
               pin: bool = False) -> dict[str, torch.Tensor]:
    """numpy batch (field -> [time, B, ...]) to torch on the learner device; with `pin`,
    through pinned memory with a non-blocking copy (GPU learners)."""
    arrays = {**batch, "replayed": replayed}
    tensors = {}
    for name, array in arrays.items():
        tensor = torch.from_numpy(np.ascontiguousarray(array))
        if pin:
            tensor = tensor.pin_memory()
        tensors[name] = tensor.to(device, non_blocking=pin)
    return tensors


class Learner:
    def __init__(self, model: torch.nn.Module, optimizer, scheduler, loss_fn, grad_clip_norm: float,
                 precision: str = "fp32", compile_model: bool = False, grad_sync=None):
        """loss_fn(batch, out) -> (scalar loss, metrics): the algorithm's (herd/algos); a
        metric "priorities" [B] (a tensor) comes back as numpy for the replays.
        precision "bf16": the forward pass runs under bfloat16 autocast (the backward
        follows it); parameters, optimizer state and the loss stay float32.
        compile_model: the training forward pass goes through torch.compile (compiled at
        the first update; `model` itself stays a plain module, so checkpoints, weight
        publishing and elite scoring see the usual parameter names).
        grad_sync(): with several learners, averages the gradients in place across them
        (herd.learner.distributed.GroupSync.exchange); False means the learners stopped
        and this update must not be applied. None: one learner."""
        if precision not in ("fp32", "bf16"):
            raise ValueError(f"unknown learner precision '{precision}' (use fp32 or bf16)")
        self.model = model
        self.bf16 = precision == "bf16"
        self.device_type = next(model.parameters()).device.type
        self.forward = torch.compile(model) if compile_model else model
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.loss_fn = loss_fn
        self.grad_clip_norm = grad_clip_norm
        self.trainable = [p for p in model.parameters() if p.requires_grad]
        self.grad_sync = grad_sync

    def run_model(self, obs: torch.Tensor, core=None):
        """The training forward pass; a torch.compile that fails (no C compiler, an
        unsupported op) falls back to the plain model once, with a warning. core: the
        batch's CoreInput for a recurrent model (herd/models/core.py), else None."""
        args = (obs,) if core is None else (obs, core)
        if self.forward is self.model:
            return self.model(*args)
        try:
            return self.forward(*args)
        except Exception as err:  # torch._dynamo / inductor raise many types
            log.warning("torch.compile failed (%s: %s): the learner runs uncompiled", type(err).__name__,
                        str(err).splitlines()[0][:200] if str(err) else "")
            self.forward = self.model
            return self.model(*args)

    def step(self, batch: dict[str, torch.Tensor]) -> dict[str, float]:
        """One update. batch["obs"] is [T+1, B, ...]; returns metrics (floats).
        A non-finite loss skips the update and reports `skipped` = 1."""
        self.model.train()
        with torch.autocast(self.device_type, dtype=torch.bfloat16, enabled=self.bf16):
            # A recurrent model unrolls from each column's stored start state, reset after
            # every done flag (None for a feed-forward model).
            out = self.run_model(batch["obs"], core_input_from_batch(batch))   # logits [T+1, B, A]
        out = ModelOutput(*(field.float() for field in out))              # the loss in float32
        loss, metrics = self.loss_fn(batch, out)
        if "priorities" in metrics:
            metrics["priorities"] = metrics["priorities"].detach().float().cpu().numpy()
        finite = math.isfinite(metrics["loss"])
        if not finite and self.grad_sync is None:
            self.optimizer.zero_grad(set_to_none=True)
            return {**metrics, "skipped": 1.0}
        self.optimizer.zero_grad(set_to_none=True)
        if finite:
            loss.backward()
        else:
            # The others are waiting for our gradients: send NaN, so that every learner sees
            # a non-finite average below and skips this update together with us.
            for p in self.trainable:
                p.grad = torch.full_like(p, float("nan"))
        if self.grad_sync is not None and not self.grad_sync():
            self.optimizer.zero_grad(set_to_none=True)
            return {**metrics, "skipped": 0.0, "stopped": 1.0}
        max_norm = self.grad_clip_norm if self.grad_clip_norm > 0 else float("inf")
        grad_norm = float(torch.nn.utils.clip_grad_norm_(self.trainable, max_norm))
        if not math.isfinite(grad_norm):
            # A finite loss can still overflow in the backward pass: never apply such a step.
            self.optimizer.zero_grad(set_to_none=True)
            return {**metrics, "grad_norm": grad_norm, "skipped": 1.0}
        if not self.apply_step():
            return {**metrics, "grad_norm": grad_norm, "skipped": 1.0}
        self.scheduler.step()
        metrics["grad_norm"] = grad_norm
        metrics["lr"] = self.optimizer.param_groups[0]["lr"]
        metrics["skipped"] = 0.0
        return metrics

    def apply_step(self) -> bool:
        """The optimizer step, undone when it makes a parameter non-finite: finite
        gradients can still overflow in the update itself (a huge --lr, Adam's
        m/sqrt(v) on a tiny v), and such weights must never be published or saved: the
        checkpoint promises the last good ones. Returns whether the step was kept."""
        before = [p.detach().clone() for p in self.trainable]
        self.optimizer.step()
        if bool(torch.stack([torch.isfinite(p).all() for p in self.trainable]).all()):  # one device sync
            return True
        with torch.no_grad():
            for param, old in zip(self.trainable, before):
                param.copy_(old)
        self.drop_nonfinite_optimizer_state()
        return False

    def drop_nonfinite_optimizer_state(self) -> None:
        """An optimizer's running averages that overflowed would poison every later step;
        such a parameter's state starts afresh (as at the first update)."""
        for param in self.trainable:
            state = self.optimizer.state.get(param, {})
            if any(torch.is_tensor(v) and v.is_floating_point() and not bool(torch.isfinite(v).all())
                   for v in state.values()):
                self.optimizer.state[param] = {}
