"""The IMPALA actor-critic loss with V-trace, plus CLEAR behaviour cloning and the LASER
relevance mask.

Averaging: every term is a MEAN, not TorchBeast's sum.  With means the gradient scale (and
so the learning rate) does not change with batch size or unroll length.
  - policy gradient and value: mean over the transitions kept by the LASER mask (all T x B
    transitions when the mask is off);
  - entropy: mean over all T x B transitions (the mask decides which data is trusted for
    off-policy learning; exploration pressure should not depend on it);
  - CLEAR cloning: mean over the T x R steps of the R replayed columns; exactly 0 when no
    column is replayed.

LASER (use_kl_mask): step t is kept iff KL(pi_target || mu_behaviour)_t <= kl_div_threshold,
computed without gradient.  A dropped step gets importance weight 0 (rho_t = c_t = 0, by
passing log_rho = -inf to V-trace), so
  - its own target is vs_t = V(x_t) and its pg advantage is 0;
  - the trace is cut there: the step before it uses the one-step target r + gamma V(x_t);
  - it is excluded from the pg/value averages (numerator and denominator).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import Tensor

from herd.ops.distributions import Categorical
from herd.ops.vtrace import from_importance_weights


@dataclass(frozen=True)
class ImpalaLossWeights:
    gamma: float = 0.99
    policy_gradient: float = 1.0
    value: float = 0.5
    entropy: float | Tensor = 0.01  # a 0-dim tensor where it follows the learning rate (--entropy_decay)
    rho_const: float = 1.0          # V-trace rho-bar, also the policy-gradient rho-bar
    c_const: float = 1.0            # V-trace c-bar
    vtrace_lambda: float = 1.0      # V-trace's lambda: c_t = lambda min(c-bar, rho_t)
    use_policy_cloning: bool = False
    policy_cloning: float = 0.05    # CLEAR: KL(behaviour || target) on replayed columns
    use_value_cloning: bool = False
    value_cloning: float = 0.005    # CLEAR: (V - V_behaviour)^2 on replayed columns
    use_kl_mask: bool = False       # LASER relevance mask
    kl_div_threshold: float = 0.3


class VTraceTargets(NamedTuple):
    vs: Tensor                       # [T, B] value targets, no grad
    pg_advantages: Tensor            # [T, B] no grad; 0 on masked steps
    target_action_log_probs: Tensor  # [T, B] log pi(a_t|x_t), WITH grad (for the pg loss)
    log_rhos: Tensor                 # [T, B] unmasked log(pi/mu), no grad
    keep: Tensor | None              # [T, B] bool, the LASER mask; None when it is off (all kept)
    discounts: Tensor                # [T, B] gamma * (1 - done)
    rewards: Tensor                  # [T, B] reward, + gamma * trunc_value on truncated steps


def behaviour_params(batch: dict[str, Tensor], distribution=Categorical) -> Tensor:
    """The behaviour policy's parameters [T, B, P] from their trajectory fields (behaviour_logits;
    or behaviour_mean and behaviour_log_std, joined): what the policy head outputs."""
    return distribution.join(*(batch[f"behaviour_{name}"] for name in distribution.param_names))


def _check_shapes(batch: dict[str, Tensor], out, behaviour: Tensor) -> None:
    T, B = batch["reward"].shape
    if out.logits.dim() != 3 or tuple(out.logits.shape[:2]) != (T + 1, B):
        raise ValueError(f"out.logits must be [T+1, B, P] = [{T + 1}, {B}, P], got {tuple(out.logits.shape)}")
    if tuple(out.value.shape) != (T + 1, B):
        raise ValueError(f"out.value must be [T+1, B] = [{T + 1}, {B}], got {tuple(out.value.shape)}")
    if tuple(behaviour.shape) != (T, B, out.logits.shape[2]):
        raise ValueError(f"the behaviour policy's parameters must be [T, B, P] like the target's, got "
                         f"{tuple(behaviour.shape)}")


def vtrace_targets(batch: dict[str, Tensor], out, weights: ImpalaLossWeights,
                   distribution=Categorical) -> VTraceTargets:
    """V-trace targets for a batch: the first half of impala_loss, exposed for tests/tools.
    distribution: herd.ops.distributions.Categorical or DiagGaussian (continuous actions)."""
    behaviour = behaviour_params(batch, distribution)                      # [T, B, P]
    _check_shapes(batch, out, behaviour)
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
        # rho = exp(-inf) = 0 drops the step from the trace (see module docstring).
        trace_log_rhos = torch.where(keep, log_rhos, log_rhos.new_full((), float("-inf")))
    else:
        keep, trace_log_rhos = None, log_rhos       # no mask: nothing computed, nothing dropped

    returns = from_importance_weights(
        trace_log_rhos, discounts, rewards, values.detach(), bootstrap,
        clip_rho_threshold=weights.rho_const,
        clip_pg_rho_threshold=weights.rho_const,
        clip_c_threshold=weights.c_const,
        lambda_=weights.vtrace_lambda,
    )
    return VTraceTargets(returns.vs, returns.pg_advantages, target_alp, log_rhos, keep, discounts, rewards)


def _cloning_losses(batch: dict[str, Tensor], out, distribution=Categorical) -> tuple[Tensor, Tensor]:
    """CLEAR cloning terms, averaged over the replayed columns only; (0, 0) if there are none.

    Computed over every column and then averaged over the replayed ones with torch.where:
    no boolean-mask selection (a `nonzero`, which reads the device from the host, and a
    shape that changes from batch to batch, which no captured graph can hold), and no
    `replayed.any()` read. torch.where, not a multiplication by the mask, so that a NaN in
    a fresh column's cloning term (0 * NaN = NaN) cannot leak into the loss."""
    replayed = batch["replayed"].bool()                                    # [B]
    target_logits = out.logits[:-1]                                        # [T, B, P]
    behaviour_logits = behaviour_params(batch, distribution).to(target_logits.dtype)
    values = out.value[:-1]                                                # [T, B]
    behaviour_values = batch["behaviour_value"].to(values.dtype)
    steps = (replayed.sum() * values.shape[0]).clamp(min=1).to(values.dtype)   # T x R, 1 when R = 0
    # CLEAR's L_policy-cloning = sum_a mu(a|h) log(mu(a|h) / pi(a|h)): the stored behaviour
    # policy is the fixed target distribution, so this is KL(behaviour || target).
    kl = distribution.kl(behaviour_logits, target_logits)                  # [T, B]
    zero = values.new_zeros(())
    policy_cloning = torch.where(replayed, kl, zero).sum() / steps
    value_cloning = torch.where(replayed, (values - behaviour_values) ** 2, zero).sum() / steps
    return policy_cloning, value_cloning


def impala_loss(batch: dict[str, Tensor], out, weights: ImpalaLossWeights,
                distribution=Categorical) -> tuple[Tensor, dict[str, Tensor]]:
    """Scalar loss to minimise, and metrics (detached 0-dim tensors on the loss's device).

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
    targets = vtrace_targets(batch, out, weights, distribution)
    values = out.value[:-1]                                                # [T, B]
    if targets.keep is None:                                               # LASER off: plain means
        def mean_kept(x: Tensor) -> Tensor:
            return x.mean()
        kept_fraction = values.new_ones(())
    else:
        keep = targets.keep.to(values.dtype)                               # [T, B]
        num_kept = keep.sum().clamp(min=1.0)   # all steps masked -> zero losses, not 0/0

        def mean_kept(x: Tensor) -> Tensor:
            return (x * keep).sum() / num_kept
        kept_fraction = keep.mean()

    pg_loss = mean_kept(-targets.target_action_log_probs * targets.pg_advantages)
    value_loss = mean_kept(0.5 * (targets.vs - values) ** 2)
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
        mean_rho = mean_kept(targets.log_rhos.exp())
        advantage_mean = mean_kept(targets.pg_advantages)
    # Detached 0-dim tensors, never Python floats: reading one would stall the device
    # every update. The learner sums them on the device and reads them once per logging
    # interval (herd/learner/step_metrics.py).
    metrics = {
        "loss": loss.detach(),
        "pg_loss": pg_loss.detach(),
        "value_loss": value_loss.detach(),
        "entropy": entropy_mean.detach(),
        "policy_cloning_loss": policy_cloning_loss.detach(),
        "value_cloning_loss": value_cloning_loss.detach(),
        "kl_mask_fraction": kept_fraction.detach(),
        "mean_rho": mean_rho,
        "advantage_mean": advantage_mean,
    }
    return loss, metrics
