"""IMPACT's loss (Luo et al., ICLR 2020): a clipped surrogate on V-trace advantages, with
a target network between the behaviour policy and the learner.

Three policies: mu, the actors' behaviour policy (recorded in the trajectory); pi_tgt, the
target network (a hard copy of the learner, synced every target_update_period updates);
pi, the learner. Per step t of a batch:

    w_t   = min(pi_tgt(a_t|x_t) / mu(a_t|x_t), rho_is)           truncated importance weight
    r_t   = pi(a_t|x_t) / pi_tgt(a_t|x_t)                         the learner against the target
    A_t   = V-trace advantage with log-rhos log(pi_tgt / mu)      (r + gamma v_{t+1} - V(x_t))
    vs_t  = V-trace value target, same rhos
    L_pg  = -mean_t min(w_t r_t A_t, w_t clip(r_t, 1 - eps, 1 + eps) A_t)
    L_v   = mean_t 0.5 (vs_t - V(x_t))^2
    L_kl  = mean_t KL(pi_tgt(.|x_t) || pi(.|x_t))                 (optional)
    loss  = L_pg + c_v L_v - c_H mean_t H(pi(.|x_t)) + beta L_kl

V-trace's own rho-bar and c-bar (--rho_const, --c_const) clip its traces as in IMPALA;
episode ends and truncations are IMPALA's (herd/losses/impala.py: vtrace_targets). With
the KL term on, beta adapts after every update as in PPO's adaptive-KL variant the paper
uses: x1.5 when the KL exceeds twice --kl_target, x0.5 when it is below half of it; it is
a device tensor (no host read in an update) and is saved with the target network.

Metrics are detached 0-dim tensors on the loss's device (the learner reads them once per
logging interval).

The target network's outputs are computed once per stored batch, as in the paper: the
circular buffer serves a batch K times, and the session tells the loss which stored batch
comes next (`expect_batch`, the mixer's reuse_key); later passes reuse the outputs of the
first, even after a target sync in between. They are not checkpointed: a resumed run
computes them again on the first pass it trains."""
from __future__ import annotations

import copy
from dataclasses import dataclass
from types import SimpleNamespace

import torch
from torch import Tensor, nn

from herd.losses.base import Loss
from herd.losses.impala import ImpalaLossWeights, vtrace_targets
from herd.models.core import core_input_from_batch
from herd.ops.distributions import Categorical


@dataclass(frozen=True)
class ImpactLossWeights:
    gamma: float = 0.99
    value: float = 0.5
    entropy: float = 0.01
    rho_const: float = 1.0           # V-trace rho-bar (its targets and advantages)
    c_const: float = 1.0             # V-trace c-bar
    vtrace_lambda: float = 1.0       # V-trace's lambda
    clip_param: float = 0.4          # eps of the clipped surrogate
    importance_weight_clip: float = 2.0   # rho_is: truncation of pi_tgt / mu in the surrogate
    use_kl_loss: bool = False
    kl_target: float = 0.01

    def vtrace(self) -> ImpalaLossWeights:
        return ImpalaLossWeights(gamma=self.gamma, rho_const=self.rho_const, c_const=self.c_const,
                                 vtrace_lambda=self.vtrace_lambda)


def clipped_surrogate(ratio: Tensor, weight: Tensor, advantages: Tensor, eps: float) -> Tensor:
    """min(w r A, w clip(r, 1 - eps, 1 + eps) A) per step: the objective to maximise (IMPACT's
    and APPO's, herd/losses/appo.py). All [T, B]; ratio carries the gradient."""
    return torch.minimum(weight * ratio * advantages, weight * ratio.clamp(1 - eps, 1 + eps) * advantages)


def impact_loss(batch: dict[str, Tensor], out, target_logits: Tensor, weights: ImpactLossWeights,
                kl_coeff: Tensor | float = 0.0, distribution=Categorical) -> tuple[Tensor, dict[str, Tensor]]:
    """The loss to minimise and its metrics (detached 0-dim tensors).

    batch: as impala_loss's (action [T, B], reward, done, trunc_value [T, B], behaviour
    policy fields [T, B, P]); out: the learner over [T+1, B] (logits [T+1, B, P], value
    [T+1, B]); target_logits [T+1, B, P]: the target network's, no gradient."""
    target_logits = target_logits.detach().to(out.logits.dtype)
    # V-trace from the target policy's ratios over the learner's (detached) values.
    targets = vtrace_targets(batch, SimpleNamespace(logits=target_logits, value=out.value), weights.vtrace(),
                             distribution)
    logits = out.logits[:-1]                                                   # [T, B, P]
    values = out.value[:-1]                                                    # [T, B]
    learner_alp = distribution.log_prob(logits, batch["action"])              # [T, B], grad
    target_alp = targets.target_action_log_probs                               # [T, B], no grad
    weight = targets.log_rhos.exp().clamp(max=weights.importance_weight_clip)  # [T, B] w_t
    ratio = (learner_alp - target_alp).exp()                                   # [T, B] r_t
    advantages = targets.pg_advantages                                         # [T, B]
    eps = weights.clip_param
    pg_loss = -clipped_surrogate(ratio, weight, advantages, eps).mean()
    value_loss = (0.5 * (targets.vs - values) ** 2).mean()
    entropy = distribution.entropy(logits).mean()
    kl = distribution.kl(target_logits[:-1], logits).mean()                  # KL(pi_tgt || pi)
    loss = pg_loss + weights.value * value_loss - weights.entropy * entropy
    if weights.use_kl_loss:
        loss = loss + kl_coeff * kl
    with torch.no_grad():
        clipped = ((ratio - 1).abs() > eps).to(values.dtype).mean()
        metrics = {"loss": loss.detach(), "pg_loss": pg_loss.detach(), "value_loss": value_loss.detach(),
                   "entropy": entropy.detach(), "kl_target": kl.detach(), "clip_fraction": clipped,
                   "mean_rho": targets.log_rhos.exp().mean(), "mean_ratio": ratio.mean()}
    return loss, metrics


class ImpactLoss(Loss):
    """The loss with its state: the target network, the updates it has seen and the
    adaptive KL coefficient. The training session saves all three with every checkpoint
    (state_dict), so a resumed run syncs at the same updates as an uninterrupted one."""

    def __init__(self, model: nn.Module, weights: ImpactLossWeights, target_update_period: int,
                 kl_coeff: float = 1.0, distribution=Categorical):
        self.model = model
        self.target = copy.deepcopy(model).eval().requires_grad_(False)
        self.weights = weights
        self.target_update_period = target_update_period
        self.distribution = distribution
        self.kl_coeff = torch.tensor(float(kl_coeff), device=next(model.parameters()).device)
        self.calls = 0
        self.next_key: tuple | None = None       # the stored batch the next call trains on
        # ((replay, slot), ...) -> (generations, target logits [T+1, B, P]): one entry per
        # slot of the circular buffer, replaced when the slot holds a new batch.
        self.target_cache: dict[tuple, tuple[tuple, Tensor]] = {}
        self.target_passes = 0                   # target forward passes run (each batch once)

    def expect_batch(self, reuse_key: tuple | None) -> None:
        """The next call's batch: a reuse key (herd/replay/mixer.py MixedBatch.reuse_key) of
        stored data served several times, or None for data seen once."""
        self.next_key = reuse_key

    def cached_target_logits(self, batch: dict[str, Tensor]) -> Tensor:
        key, self.next_key = self.next_key, None
        if key is None:
            return self.target_logits(batch)
        slots = tuple((replay, slot) for replay, slot, _ in key)
        generations = tuple(generation for _, _, generation in key)
        hit = self.target_cache.get(slots)
        if hit is not None and hit[0] == generations:
            return hit[1]
        logits = self.target_logits(batch)
        self.target_cache[slots] = (generations, logits)
        return logits

    def target_logits(self, batch: dict[str, Tensor]) -> Tensor:
        """The target network's policy over the batch's [T+1, B] observations (an LSTM
        target unrolls from the same stored start states as the learner)."""
        core = core_input_from_batch(batch)
        self.target_passes += 1
        with torch.no_grad():
            out = self.target(batch["obs"]) if core is None else self.target(batch["obs"], core)
        return out.logits.float()                                               # [T+1, B, P]

    def __call__(self, batch: dict[str, Tensor], out) -> tuple[Tensor, dict[str, Tensor]]:
        if self.calls == 0:
            # The first update's target is the learner as it starts: its weights may have
            # come after this loss was built (a loaded model, several learners' broadcast).
            self.target.load_state_dict(self.model.state_dict())
        loss, metrics = impact_loss(batch, out, self.cached_target_logits(batch), self.weights, self.kl_coeff,
                                    self.distribution)
        if self.weights.use_kl_loss:
            kl, target = metrics["kl_target"], self.weights.kl_target
            self.kl_coeff = torch.where(kl > 2 * target, self.kl_coeff * 1.5,
                                        torch.where(kl < 0.5 * target, self.kl_coeff * 0.5, self.kl_coeff))
        metrics["kl_coeff"] = self.kl_coeff.detach().clone()
        self.calls += 1
        if self.calls % self.target_update_period == 0:
            # Synced before this update's optimizer step: the next update's target is the
            # learner as it was after the previous one.
            self.target.load_state_dict(self.model.state_dict())
        return loss, metrics

    def state_dict(self) -> dict:
        return {"target": self.target.state_dict(), "calls": self.calls, "kl_coeff": self.kl_coeff.detach().cpu()}

    def load_state_dict(self, state: dict) -> None:
        self.target.load_state_dict(state["target"])
        self.calls = int(state["calls"])
        self.kl_coeff = state["kl_coeff"].to(self.kl_coeff.device).clone()
