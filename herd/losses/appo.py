"""APPO: PPO's sample reuse on the V-trace path. Each stored batch is trained for K passes
of M minibatches (herd/learner/reuse.py runs them); this module is the arithmetic.

Two policies besides the actors' behaviour mu: pi_old, the target network (a copy of the
learner synced every target_update_period stored batches; 1, the default, makes it PPO's
"old policy": the learner as the stored batch arrived), and pi, the learner. Once per
stored batch, from the target network's outputs over [T+1, B] (stored_batch_targets):

    w_t   = min(pi_old(a_t|x_t) / mu(a_t|x_t), rho_is)         truncated importance weight
    vs_t, A_t = V-trace with log-rhos log(pi_old / mu), c_t = lambda min(c-bar, rho_t),
            over the target's values (herd/ops/vtrace.py); A_t normalised over the batch
            (mean 0, std 1) when normalize_advantages

and per minibatch step (appo_loss), with r_t = pi(a_t|x_t) / pi_old(a_t|x_t):

    L_pg = -mean_t min(w_t r_t A_t, w_t clip(r_t, 1 - eps, 1 + eps) A_t)   (clipped_surrogate, IMPACT's)
    L_v  = mean_t 0.5 (vs_t - V(x_t))^2, or with value_clip c > 0 PPO's clipped value loss
           mean_t 0.5 max((vs_t - V)^2, (vs_t - V_old - clip(V - V_old, -c, c))^2)
    L_kl = mean_t KL(pi_old || pi)                                           (optional, adaptive beta)
    loss = L_pg + c_v L_v - c_H mean_t H(pi) + beta L_kl

Return normalisation (normalize_returns): the value head learns returns divided by a
running root-mean-square of the V-trace targets (in rewards' units), so that one learning
rate and value weight suit games whose returns are 1 or 10,000: the batch's rewards are
divided by that scale before V-trace (the bootstraps are the networks' own values, already
in its units), and the scale follows the targets with decay RETURN_SCALE_DECAY per stored
batch. Scores in episodes.csv are never scaled.

Everything that changes between updates (the target's weights, the KL coefficient, the
return scale) is a device tensor changed in place, and the target sync is a host-counted
in-place copy made between updates (AppoLoss.end_batch), so a CUDA learner can capture the
whole multi-pass update as one graph and replay it (herd/learner/learner.py)."""
from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from herd.losses.impact import clipped_surrogate
from herd.losses.base import Loss
from herd.losses.impala import ImpalaLossWeights, vtrace_targets
from herd.models import ModelOutput
from herd.models.core import CORE_STATE, core_input_from_batch
from herd.ops.distributions import Categorical

RETURN_SCALE_DECAY = 0.99      # per stored batch: the scale follows about the last 100 batches
ADVANTAGE_EPS = 1e-8

# What stored_batch_targets adds to a batch: every field is [T, B] (old_logits [T, B, P]).
TARGET_FIELDS = ("old_log_prob", "old_logits", "old_value", "weight", "advantage", "vs")


@dataclass(frozen=True)
class AppoLossWeights:
    gamma: float = 0.99
    value: float = 0.5
    entropy: float = 0.01
    rho_const: float = 1.0               # V-trace rho-bar
    c_const: float = 1.0                 # V-trace c-bar
    vtrace_lambda: float = 0.95          # V-trace's lambda (GAE's, on on-policy data)
    clip_param: float = 0.1              # eps of the clipped surrogate
    importance_weight_clip: float = 2.0  # rho_is: truncation of pi_old / mu in the surrogate
    normalize_advantages: bool = True
    value_clip: float = 0.0              # PPO's value clipping around the old value; 0: off
    normalize_returns: bool = False
    use_kl_loss: bool = False
    kl_target: float = 0.01

    def vtrace(self) -> ImpalaLossWeights:
        return ImpalaLossWeights(gamma=self.gamma, rho_const=self.rho_const, c_const=self.c_const,
                                 vtrace_lambda=self.vtrace_lambda)


def stored_batch_targets(batch: dict[str, Tensor], target_out, weights: AppoLossWeights,
                         distribution=Categorical, return_scale: Tensor | float = 1.0) -> dict[str, Tensor]:
    """The fields every minibatch of a stored batch trains against (TARGET_FIELDS, no
    gradient), from the target network's outputs target_out over [T+1, B] (logits
    [T+1, B, P], value [T+1, B]). The batch's rewards are divided by return_scale."""
    with torch.no_grad():
        logits = target_out.logits.float()                                      # [T+1, B, P]
        values = target_out.value.float()                                       # [T+1, B]
        scaled = {**batch, "reward": batch["reward"].float() / return_scale}
        targets = vtrace_targets(scaled, ModelOutput(logits, values, None), weights.vtrace(), distribution)
        advantage = targets.pg_advantages                                       # [T, B]
        if weights.normalize_advantages:
            advantage = (advantage - advantage.mean()) / (advantage.std() + ADVANTAGE_EPS)
        weight = targets.log_rhos.exp().clamp(max=weights.importance_weight_clip)   # [T, B] w_t
        return {"old_log_prob": targets.target_action_log_probs, "old_logits": logits[:-1],
                "old_value": values[:-1], "weight": weight, "advantage": advantage, "vs": targets.vs}


def appo_loss(minibatch: dict[str, Tensor], out, weights: AppoLossWeights, kl_coeff: Tensor | float = 0.0,
              distribution=Categorical) -> tuple[Tensor, dict[str, Tensor]]:
    """The loss of one minibatch step and its metrics (detached 0-dim tensors).

    minibatch: a stored batch's columns with TARGET_FIELDS ([T, b]) and action [T, b];
    out: the learner over the minibatch's observations, [T, b] or [T+1, b] (the last step,
    if there, is not used: the bootstrap came from the target network)."""
    T = minibatch["advantage"].shape[0]
    logits = out.logits[:T]                                                     # [T, b, P]
    values = out.value[:T]                                                      # [T, b]
    log_prob = distribution.log_prob(logits, minibatch["action"])               # [T, b], grad
    ratio = (log_prob - minibatch["old_log_prob"]).exp()                        # [T, b] r_t
    eps = weights.clip_param
    pg_loss = -clipped_surrogate(ratio, minibatch["weight"], minibatch["advantage"], eps).mean()
    vs, old_value = minibatch["vs"], minibatch["old_value"]
    value_error = (vs - values) ** 2                                            # [T, b]
    if weights.value_clip > 0:
        clipped_value = old_value + (values - old_value).clamp(-weights.value_clip, weights.value_clip)
        value_error = torch.maximum(value_error, (vs - clipped_value) ** 2)
    value_loss = 0.5 * value_error.mean()
    entropy = distribution.entropy(logits).mean()
    kl = distribution.kl(minibatch["old_logits"], logits).mean()                # KL(pi_old || pi)
    loss = pg_loss + weights.value * value_loss - weights.entropy * entropy
    if weights.use_kl_loss:
        loss = loss + kl_coeff * kl
    with torch.no_grad():
        clip_fraction = ((ratio - 1).abs() > eps).to(values.dtype).mean()
        metrics = {"loss": loss.detach(), "pg_loss": pg_loss.detach(), "value_loss": value_loss.detach(),
                   "entropy": entropy.detach(), "kl_target": kl.detach(), "clip_fraction": clip_fraction,
                   "mean_rho": minibatch["weight"].mean(), "mean_ratio": ratio.mean()}
    return loss, metrics


class AppoLoss(Loss):
    """The loss with its state: the target network, the stored batches it has seen, the
    adaptive KL coefficient and the return scale, all saved with every checkpoint
    (state_dict) so that a resumed run syncs at the same updates as an uninterrupted one.

    The learner (herd/learner/learner.py) calls begin_batch() and end_batch() on the host
    around every stored batch's update, prepare(batch) once per stored batch and the loss
    once per minibatch; the last two make no host read and change state only in place."""

    def __init__(self, model: nn.Module, weights: AppoLossWeights, target_update_period: int = 1,
                 kl_coeff: float = 1.0, distribution=Categorical):
        self.model = model
        self.target = copy.deepcopy(model).eval().requires_grad_(False)
        self.weights = weights
        self.target_update_period = target_update_period
        self.distribution = distribution
        device = next(model.parameters()).device
        self.kl_coeff = torch.tensor(float(kl_coeff), device=device)
        self.return_second_moment = torch.ones((), device=device)    # EMA of the targets' mean square
        self.stored_batches = 0      # stored batches trained (host count: no read)
        self.target_syncs = 0        # copies of the learner into the target after an update

    def begin_batch(self) -> None:
        """On the host, before the first stored batch: the target is the learner as it
        starts (its weights may have been loaded after this loss was built)."""
        if self.stored_batches == 0:
            self.copy_learner_to_target()

    def end_batch(self) -> None:
        """On the host, after each stored batch's update: every target_update_period
        batches the target becomes the learner again (target_syncs == batches // period)."""
        self.stored_batches += 1
        if self.stored_batches % self.target_update_period == 0:
            self.copy_learner_to_target()
            self.target_syncs += 1

    def copy_learner_to_target(self) -> None:
        """An in-place copy on the device: a captured update keeps reading the same tensors."""
        with torch.no_grad():
            torch._foreach_copy_(list(self.target.state_dict().values()), list(self.model.state_dict().values()))

    @property
    def return_scale(self) -> Tensor:
        return self.return_second_moment.sqrt().clamp(min=1e-4)

    def prepare(self, batch: dict[str, Tensor]) -> dict[str, Tensor]:
        """The stored batch with TARGET_FIELDS added ([T, B]): the target network's one
        forward pass over it. A feed-forward learner's observations are cut to the T it
        trains on (the bootstrap step is the target's); a recurrent one unrolls all T+1."""
        core = core_input_from_batch(batch)
        with torch.no_grad():
            out = self.target(batch["obs"]) if core is None else self.target(batch["obs"], core)
        scale = self.return_scale if self.weights.normalize_returns else 1.0
        fields = stored_batch_targets(batch, out, self.weights, self.distribution, scale)
        if self.weights.normalize_returns:
            with torch.no_grad():
                raw_square = (fields["vs"] * scale).square().mean()
                self.return_second_moment.lerp_(raw_square, 1 - RETURN_SCALE_DECAY)
        stored = {**batch, **fields}
        if CORE_STATE not in batch:
            stored["obs"] = batch["obs"][:-1]                                   # [T, B, ...]
        return stored

    def __call__(self, minibatch: dict[str, Tensor], out) -> tuple[Tensor, dict[str, Tensor]]:
        # A copy into the loss: the coefficient changes in place below, before the backward pass.
        loss, metrics = appo_loss(minibatch, out, self.weights, self.kl_coeff.clone(), self.distribution)
        if self.weights.use_kl_loss:
            kl, target = metrics["kl_target"], self.weights.kl_target
            self.kl_coeff.copy_(torch.where(kl > 2 * target, self.kl_coeff * 1.5,
                                            torch.where(kl < 0.5 * target, self.kl_coeff * 0.5, self.kl_coeff)))
        metrics["kl_coeff"] = self.kl_coeff.detach().clone()
        metrics["return_scale"] = self.return_scale.detach().clone()
        return loss, metrics

    def state_dict(self) -> dict:
        return {"target": self.target.state_dict(), "stored_batches": self.stored_batches,
                "target_syncs": self.target_syncs, "kl_coeff": self.kl_coeff.detach().cpu(),
                "return_second_moment": self.return_second_moment.detach().cpu()}

    def load_state_dict(self, state: dict) -> None:
        self.target.load_state_dict(state["target"])
        self.stored_batches = int(state["stored_batches"])
        self.target_syncs = int(state["target_syncs"])
        self.kl_coeff.copy_(state["kl_coeff"])
        self.return_second_moment.copy_(state["return_second_moment"])
