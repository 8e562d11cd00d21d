"""The learner step with host reads, the reference the fast step is checked against:
tests/learner/test_fast_step.py (same parameters after 50 updates) and
benchmarks/learner_step.py (the old step and the new one side by side). It lives beside
the benchmark, outside the herd package: nothing in a run uses it.

What it does that the fast step does not: torch's RMSprop/Adam with a host-side LambdaLR
schedule, nine float() reads of the loss metrics, bool(replayed.any()) and boolean-mask
selection of the replayed columns, a Python loop over time in V-trace, float() of the
gradient norm, and a clone of every parameter with a bool() to undo a step that
overflowed: 12 host reads per update."""
from __future__ import annotations

import logging
import math

import torch
from torch import Tensor

from typing import Optional

from herd.losses.impala import ImpalaLossWeights, VTraceTargets, behaviour_params
from herd.models import ModelOutput
from herd.models.core import core_input_from_batch
from herd.ops.distributions import Categorical
from herd.ops.vtrace import VTraceReturns


def _clip(rhos: Tensor, threshold: Optional[float]) -> Tensor:
    return rhos if threshold is None else torch.clamp(rhos, max=threshold)

log = logging.getLogger("herd")


def reference_optimizer(name: str, params, lr: float, rmsprop_eps: float) -> torch.optim.Optimizer:
    if name == "rmsprop":
        # IMPALA's RMSprop: decay 0.99, no momentum, a large epsilon for stability.
        return torch.optim.RMSprop(params, lr=lr, alpha=0.99, eps=rmsprop_eps, momentum=0.0)
    if name == "adam":
        return torch.optim.Adam(params, lr=lr)
    raise ValueError(f"unknown optimizer '{name}' (use rmsprop or adam)")


def reference_scheduler(optimizer: torch.optim.Optimizer, lr: float, lr_end: float, steps: int, power: float = 1.0):
    """Polynomial decay from lr to lr_end over `steps` updates, then flat:
    lr_end + (lr - lr_end) * (1 - update / steps) ** power. Power 1 is linear; the seed's
    (TensorFlow's polynomial_decay) is 2."""
    end_fraction = min(lr_end / lr, 1.0)

    def factor(update: int) -> float:
        progress = min(update, steps) / steps
        return end_fraction + (1.0 - end_fraction) * (1.0 - progress) ** power

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def loop_from_importance_weights(
    log_rhos: Tensor,
    discounts: Tensor,
    rewards: Tensor,
    values: Tensor,
    bootstrap_value: Tensor,
    clip_rho_threshold: Optional[float] = 1.0,
    clip_pg_rho_threshold: Optional[float] = 1.0,
    clip_c_threshold: Optional[float] = 1.0,
) -> VTraceReturns:
    """V-trace targets vs [T, B] and advantages pg_advantages [T, B] (see module docstring).

    pg_advantages_t = min(pg_rho_bar, rho_t) * (r_t + gamma_t vs_{t+1} - V(x_t)), vs_T = bootstrap.
    A threshold of None disables that truncation.  A log_rho of -inf (rho = 0) removes a step
    from the trace: its delta and c are 0, so vs_t = V(x_t) and nothing later flows past it.
    """
    with torch.no_grad():
        rhos = torch.exp(log_rhos)                                             # [T, B]
        clipped_rhos = _clip(rhos, clip_rho_threshold)                         # [T, B]
        cs = _clip(rhos, clip_c_threshold)                                     # [T, B]

        # V(x_{t+1}) for every t, with the bootstrap standing in after the last step.
        values_t_plus_1 = torch.cat([values[1:], bootstrap_value.unsqueeze(0)], dim=0)  # [T, B]
        deltas = clipped_rhos * (rewards + discounts * values_t_plus_1 - values)       # [T, B]

        # Backward accumulation of vs_t - V(x_t).  A Python loop over T (tens of steps) is
        # cheap next to the network, and keeps the recursion readable.
        acc = torch.zeros_like(bootstrap_value)                                # [B]
        vs_minus_v = [None] * log_rhos.shape[0]
        for t in reversed(range(log_rhos.shape[0])):
            acc = deltas[t] + discounts[t] * cs[t] * acc
            vs_minus_v[t] = acc
        vs = torch.stack(vs_minus_v, dim=0) + values                           # [T, B]

        vs_t_plus_1 = torch.cat([vs[1:], bootstrap_value.unsqueeze(0)], dim=0)  # [T, B]
        clipped_pg_rhos = _clip(rhos, clip_pg_rho_threshold)
        pg_advantages = clipped_pg_rhos * (rewards + discounts * vs_t_plus_1 - values)  # [T, B]

    return VTraceReturns(vs=vs, pg_advantages=pg_advantages)



def reference_vtrace_targets(batch: dict[str, Tensor], out, weights: ImpalaLossWeights,
                   distribution=Categorical) -> VTraceTargets:
    """V-trace targets for a batch: the first half of impala_loss, exposed for tests/tools.
    distribution: herd.ops.distributions.Categorical or DiagGaussian (continuous actions)."""
    behaviour = behaviour_params(batch, distribution)                      # [T, B, P]
    target_logits = out.logits[:-1]                                        # [T, B, P]
    values = out.value[:-1]                                                # [T, B]
    bootstrap = out.value[-1].detach()                                     # [B]
    dtype = values.dtype
    done = batch["done"].bool()                                            # [T, B]
    gamma = weights.gamma

    # Episode ends get discount 0.  A truncated episode still deserves a bootstrap, which the
    # actor recorded as trunc_value (behaviour V of the real final observation; the next obs
    # in the unroll already belongs to a new episode): fold gamma * trunc_value into that
    # step's reward.  torch.where (not a plain add) so garbage in trunc_value on non-final
    # steps -- it should be 0 there -- can never leak in.
    reward = batch["reward"].to(dtype)
    trunc_value = batch["trunc_value"].to(dtype)
    rewards = torch.where(done, reward + gamma * trunc_value, reward)      # [T, B]
    discounts = gamma * (~done).to(dtype)                                  # [T, B]

    target_alp = distribution.log_prob(target_logits, batch["action"])    # [T, B], grad
    behaviour_alp = distribution.log_prob(behaviour.to(dtype), batch["action"])
    log_rhos = (target_alp - behaviour_alp).detach()                       # [T, B]

    if weights.use_kl_mask:
        with torch.no_grad():
            kl = distribution.kl(target_logits, behaviour.to(dtype))      # [T, B]
            keep = kl <= weights.kl_div_threshold
    else:
        keep = torch.ones_like(done)
    # rho = exp(-inf) = 0 drops the step from the trace (see module docstring).
    trace_log_rhos = torch.where(keep, log_rhos, torch.full_like(log_rhos, float("-inf")))

    returns = loop_from_importance_weights(
        trace_log_rhos, discounts, rewards, values.detach(), bootstrap,
        clip_rho_threshold=weights.rho_const,
        clip_pg_rho_threshold=weights.rho_const,
        clip_c_threshold=weights.c_const,
    )
    return VTraceTargets(returns.vs, returns.pg_advantages, target_alp, log_rhos, keep, discounts, rewards)


def _cloning_losses(batch: dict[str, Tensor], out, distribution=Categorical) -> tuple[Tensor, Tensor]:
    """CLEAR cloning terms, averaged over the replayed columns only; (0, 0) if there are none."""
    replayed = batch["replayed"].bool()                                    # [B]
    if not bool(replayed.any()):
        zero = out.value.new_zeros(())
        return zero, zero
    # Select columns rather than multiply by a mask: 0 * NaN would still be NaN.
    target_logits = out.logits[:-1][:, replayed]                           # [T, R, P]
    behaviour_logits = behaviour_params(batch, distribution)[:, replayed].to(target_logits.dtype)
    values = out.value[:-1][:, replayed]                                   # [T, R]
    behaviour_values = batch["behaviour_value"][:, replayed].to(values.dtype)
    # CLEAR's L_policy-cloning = sum_a mu(a|h) log(mu(a|h) / pi(a|h)): the stored behaviour
    # policy is the fixed target distribution, so this is KL(behaviour || target).
    policy_cloning = distribution.kl(behaviour_logits, target_logits).mean()
    value_cloning = ((values - behaviour_values) ** 2).mean()
    return policy_cloning, value_cloning


def reference_impala_loss(batch: dict[str, Tensor], out, weights: ImpalaLossWeights,
                distribution=Categorical) -> tuple[Tensor, dict[str, float]]:
    """Scalar loss to minimise, and metrics (python floats).

    batch (time-major): action [T, B] int64, reward [T, B], done [T, B] bool, trunc_value [T, B],
    behaviour_logits [T, B, A], behaviour_value [T, B], replayed [B] bool.
    Continuous actions (distribution=DiagGaussian): action [T, B, A] float32 and
    behaviour_mean, behaviour_log_std [T, B, A] in place of behaviour_logits; out.logits
    is then [T+1, B, 2A]. Every policy term below goes through `distribution`.
    out: anything with .logits [T+1, B, A] and .value [T+1, B] -- the current model over all
    T+1 observations; the last step only provides the (detached) bootstrap value.

    loss =  policy_gradient * mean_kept(-log pi(a_t|x_t) * pg_adv_t)
          + value           * mean_kept(0.5 * (vs_t - V(x_t))^2)
          - entropy         * mean(H(pi(.|x_t)))
          + policy_cloning  * mean_replayed(KL(mu || pi))       [if use_policy_cloning]
          + value_cloning   * mean_replayed((V - V_mu)^2)       [if use_value_cloning]
    The cloning metrics are reported even when their terms are off: they measure how far
    the learner has drifted from the replayed behaviour.
    """
    targets = reference_vtrace_targets(batch, out, weights, distribution)
    values = out.value[:-1]                                                # [T, B]
    keep = targets.keep.to(values.dtype)                                   # [T, B]
    num_kept = keep.sum().clamp(min=1.0)   # all steps masked -> zero losses, not 0/0

    pg_loss = -(targets.target_action_log_probs * targets.pg_advantages * keep).sum() / num_kept
    value_loss = (0.5 * (targets.vs - values) ** 2 * keep).sum() / num_kept
    entropy_mean = distribution.entropy(out.logits[:-1]).mean()
    policy_cloning_loss, value_cloning_loss = _cloning_losses(batch, out, distribution)

    loss = (weights.policy_gradient * pg_loss
            + weights.value * value_loss
            - weights.entropy * entropy_mean)
    if weights.use_policy_cloning:
        loss = loss + weights.policy_cloning * policy_cloning_loss
    if weights.use_value_cloning:
        loss = loss + weights.value_cloning * value_cloning_loss

    with torch.no_grad():
        # Unclipped rho over the steps V-trace actually used: how off-policy the data was.
        mean_rho = (targets.log_rhos.exp() * keep).sum() / num_kept
        advantage_mean = (targets.pg_advantages * keep).sum() / num_kept
    metrics = {
        "loss": float(loss.detach()),
        "pg_loss": float(pg_loss.detach()),
        "value_loss": float(value_loss.detach()),
        "entropy": float(entropy_mean.detach()),
        "policy_cloning_loss": float(policy_cloning_loss.detach()),
        "value_cloning_loss": float(value_cloning_loss.detach()),
        "kl_mask_fraction": float(targets.keep.float().mean()),
        "mean_rho": float(mean_rho),
        "advantage_mean": float(advantage_mean),
    }
    return loss, metrics


class ReferenceLearner:
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
