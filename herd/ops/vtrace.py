"""V-trace off-policy value targets and policy-gradient advantages (IMPALA, Espeholt et al.
2018, section 4), as pure tensor math.

All inputs are time-major.  With T the unroll length and B the batch:

    log_rhos        [T, B]  log pi(a_t|x_t) - log mu(a_t|x_t)  (target minus behaviour)
    discounts       [T, B]  gamma_t; 0 where the episode ended after step t
    rewards         [T, B]
    values          [T, B]  V(x_t) under the current value function
    bootstrap_value [B]     V(x_T), the value of the observation after the last step

Targets come from the backward recursion (paper, Remark 1)

    vs_t - V(x_t) = delta_t + gamma_t c_t (vs_{t+1} - V(x_{t+1})),   vs_T = V(x_T)
    delta_t       = rho_t (r_t + gamma_t V(x_{t+1}) - V(x_t))

with rho_t = min(rho_bar, pi/mu) and c_t = lambda min(c_bar, pi/mu): lambda (default 1, the
paper's) mixes n-step returns as in TD(lambda); on on-policy data (pi = mu, c_bar >= 1)
vs_t - V(x_t) is then GAE(lambda)'s advantage (tests/ops/test_vtrace.py checks both).  The recursion is exactly the
paper's double sum, re-associated; tests/ops/test_vtrace.py checks that literally. It is computed in closed
form (discounted_trace_sums), not by a loop over time.

Targets are regression targets / advantages, not functions to differentiate: everything
returned by from_importance_weights is computed under no_grad.
"""
from __future__ import annotations

import collections
from typing import Optional

import torch
from torch import Tensor

from herd.ops.distributions import action_log_probs, kl_divergence  # noqa: F401  (re-export)

VTraceReturns = collections.namedtuple("VTraceReturns", ["vs", "pg_advantages"])

VTraceFromLogitsReturns = collections.namedtuple(
    "VTraceFromLogitsReturns",
    ["vs", "pg_advantages", "log_rhos", "behaviour_action_log_probs", "target_action_log_probs"],
)


def _clip(rhos: Tensor, threshold: Optional[float]) -> Tensor:
    # None means "no truncation" (the untruncated importance-sampling estimator).
    return rhos if threshold is None else torch.clamp(rhos, max=threshold)


def _check_shapes(log_rhos: Tensor, discounts: Tensor, rewards: Tensor, values: Tensor,
                  bootstrap_value: Tensor) -> None:
    # Broadcasting would silently turn a [1, B] bootstrap or a [T] reward into wrong
    # targets, so shapes are checked rather than trusted.
    if log_rhos.dim() != 2:
        raise ValueError(f"log_rhos must be [T, B], got {tuple(log_rhos.shape)}")
    for name, tensor in (("discounts", discounts), ("rewards", rewards), ("values", values)):
        if tensor.shape != log_rhos.shape:
            raise ValueError(f"{name} must be {tuple(log_rhos.shape)} like log_rhos, got {tuple(tensor.shape)}")
    if bootstrap_value.shape != log_rhos.shape[1:]:
        raise ValueError(f"bootstrap_value must be [B] = {tuple(log_rhos.shape[1:])}, "
                         f"got {tuple(bootstrap_value.shape)}")


def discounted_trace_sums(deltas: Tensor, decays: Tensor) -> Tensor:
    """acc_t = deltas_t + decays_t * acc_{t+1} (acc_T = 0) for every t, without a loop.

    weights[t, s] = prod_{k=t}^{s-1} decays_k for s >= t (1 on the diagonal), 0 for s < t:
    a cumulative product along s of a matrix holding decays_{s-1} right of the diagonal and
    1 elsewhere, then masked to the upper triangle. A zero decay (an episode end, a step
    LASER dropped) zeroes every product that crosses it, exactly as the recursion does.
    deltas, decays: [T, B] -> [T, B]."""
    T = deltas.shape[0]
    later = torch.ones(T, T, dtype=torch.bool, device=deltas.device).triu(1)   # [T, T] s > t
    shifted = torch.cat([decays.new_ones(1, *decays.shape[1:]), decays[:-1]], dim=0)  # [T, B] decays_{s-1}
    factors = torch.where(later.unsqueeze(-1), shifted.unsqueeze(0), decays.new_ones(()))  # [T(t), T(s), B]
    weights = torch.cumprod(factors, dim=1) * (later | torch.eye(T, dtype=torch.bool, device=deltas.device)
                                               ).unsqueeze(-1)           # [T, T, B], 0 below the diagonal
    return torch.einsum("tsb,sb->tb", weights, deltas)


def from_importance_weights(
    log_rhos: Tensor,
    discounts: Tensor,
    rewards: Tensor,
    values: Tensor,
    bootstrap_value: Tensor,
    clip_rho_threshold: Optional[float] = 1.0,
    clip_pg_rho_threshold: Optional[float] = 1.0,
    clip_c_threshold: Optional[float] = 1.0,
    lambda_: float = 1.0,
) -> VTraceReturns:
    """V-trace targets vs [T, B] and advantages pg_advantages [T, B] (see module docstring).

    pg_advantages_t = min(pg_rho_bar, rho_t) * (r_t + gamma_t vs_{t+1} - V(x_t)), vs_T = bootstrap.
    A threshold of None disables that truncation.  A log_rho of -inf (rho = 0) removes a step
    from the trace: its delta and c are 0, so vs_t = V(x_t) and nothing later flows past it.
    """
    _check_shapes(log_rhos, discounts, rewards, values, bootstrap_value)
    with torch.no_grad():
        rhos = torch.exp(log_rhos)                                             # [T, B]
        clipped_rhos = _clip(rhos, clip_rho_threshold)                         # [T, B]
        cs = lambda_ * _clip(rhos, clip_c_threshold)                           # [T, B]

        # V(x_{t+1}) for every t, with the bootstrap standing in after the last step.
        values_t_plus_1 = torch.cat([values[1:], bootstrap_value.unsqueeze(0)], dim=0)  # [T, B]
        deltas = clipped_rhos * (rewards + discounts * values_t_plus_1 - values)       # [T, B]

        # vs_t - V(x_t) = sum_{s >= t} (prod_{k=t}^{s-1} gamma_k c_k) delta_s: the backward
        # recursion unrolled into one [T, T, B] weight matrix and a batched sum, so the
        # learner launches a handful of kernels instead of 3 per time step (and the whole
        # update can be captured as one CUDA graph). T is tens of steps: T^2 B is small.
        vs_minus_v = discounted_trace_sums(deltas, discounts * cs)             # [T, B]
        vs = vs_minus_v + values                                               # [T, B]

        vs_t_plus_1 = torch.cat([vs[1:], bootstrap_value.unsqueeze(0)], dim=0)  # [T, B]
        clipped_pg_rhos = _clip(rhos, clip_pg_rho_threshold)
        pg_advantages = clipped_pg_rhos * (rewards + discounts * vs_t_plus_1 - values)  # [T, B]

    return VTraceReturns(vs=vs, pg_advantages=pg_advantages)


def from_logits(
    behaviour_policy_logits: Tensor,
    target_policy_logits: Tensor,
    actions: Tensor,
    discounts: Tensor,
    rewards: Tensor,
    values: Tensor,
    bootstrap_value: Tensor,
    clip_rho_threshold: Optional[float] = 1.0,
    clip_pg_rho_threshold: Optional[float] = 1.0,
    clip_c_threshold: Optional[float] = 1.0,
    lambda_: float = 1.0,
) -> VTraceFromLogitsReturns:
    """V-trace from policy logits [T, B, A] and actions [T, B] (int64).

    The log-probabilities (and log_rhos) are returned WITH their autograd history, so a
    caller can reuse target_action_log_probs for the policy-gradient loss; vs and
    pg_advantages carry no gradient, as in from_importance_weights."""
    if behaviour_policy_logits.shape != target_policy_logits.shape or behaviour_policy_logits.dim() != 3:
        raise ValueError(f"logits must both be [T, B, A], got {tuple(behaviour_policy_logits.shape)} "
                         f"and {tuple(target_policy_logits.shape)}")
    target_alp = action_log_probs(target_policy_logits, actions)               # [T, B]
    behaviour_alp = action_log_probs(behaviour_policy_logits, actions)         # [T, B]
    log_rhos = target_alp - behaviour_alp                                      # [T, B]
    returns = from_importance_weights(
        log_rhos, discounts, rewards, values, bootstrap_value,
        clip_rho_threshold=clip_rho_threshold,
        clip_pg_rho_threshold=clip_pg_rho_threshold,
        clip_c_threshold=clip_c_threshold,
        lambda_=lambda_,
    )
    return VTraceFromLogitsReturns(
        vs=returns.vs,
        pg_advantages=returns.pg_advantages,
        log_rhos=log_rhos,
        behaviour_action_log_probs=behaviour_alp,
        target_action_log_probs=target_alp,
    )
