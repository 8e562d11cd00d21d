"""APPO: each stored batch trained for several passes of shuffled minibatches, with a
clipped surrogate on V-trace targets (herd/losses/appo.py; herd/learner/reuse.py runs the
passes inside one learner update). See herd/algos/base.py for what a builder supplies.

The actors are IMPALA's, field for field (the behaviour policy, its value and features):
only the learner differs, so everything IMPALA's actors run on (Atari, vector, MinAtar,
continuous actions, the LSTM core, the inference server, Ray) runs APPO."""
from __future__ import annotations

from herd.algos.base import describe_optimization as optimizer_and_schedule
from herd.algos.impala import IMPALA
from herd.learner.reuse import Reuse
from herd.losses.appo import AppoLoss, AppoLossWeights
from herd.models import action_distribution_of
from herd.ops.distributions import get_distribution


def loss_weights(cfg) -> AppoLossWeights:
    lo = cfg.loss
    return AppoLossWeights(
        gamma=cfg.train.gamma, value=lo.value_loss_weight, entropy=lo.entropy_loss_weight, rho_const=lo.rho_const,
        c_const=lo.c_const, vtrace_lambda=lo.vtrace_lambda, clip_param=lo.clip_param,
        importance_weight_clip=lo.importance_weight_clip, normalize_advantages=lo.normalize_advantages,
        value_clip=lo.value_clip, normalize_returns=lo.normalize_returns, use_kl_loss=lo.use_kl_loss,
        kl_target=lo.kl_target)


class Appo:
    name = "appo"
    metric_names = ("loss", "pg_loss", "value_loss", "entropy", "kl_target", "kl_coeff", "clip_fraction",
                    "mean_rho", "mean_ratio", "return_scale")
    replay_types = ("queue", "standard")     # fresh trajectories; a uniform replay mixed in, V-trace-corrected
    inference_server = True
    # The target syncs and the stored-batch count run on the host between updates; the
    # update itself (target pass, passes, minibatches, KL coefficient) is device-only.
    capturable_loss = True
    model_options: dict = {}
    finish_rollout = None
    action_kinds = IMPALA.action_kinds
    # The actor side is IMPALA's (composition: the same functions, not a subclass).
    step_fields = staticmethod(IMPALA.step_fields)
    read_fields = staticmethod(IMPALA.read_fields)
    act = staticmethod(IMPALA.act)
    actor_options = staticmethod(IMPALA.actor_options)
    act_kwargs = staticmethod(IMPALA.act_kwargs)
    test_act_kwargs = staticmethod(IMPALA.test_act_kwargs)
    least_exploring_actor = staticmethod(IMPALA.least_exploring_actor)

    @staticmethod
    def build_loss(cfg, model) -> AppoLoss:
        return AppoLoss(model, loss_weights(cfg), cfg.train.target_update_period, kl_coeff=cfg.loss.kl_coeff,
                        distribution=get_distribution(action_distribution_of(model)))

    @staticmethod
    def reuse(cfg) -> Reuse:
        return Reuse(cfg.train.passes_per_batch, cfg.train.minibatches_per_pass)

    @staticmethod
    def describe_optimization(cfg) -> dict:
        lo, t = cfg.loss, cfg.train
        return {**optimizer_and_schedule(cfg), "passes_per_batch": t.passes_per_batch,
                "minibatches_per_pass": t.minibatches_per_pass, "target_update_period": t.target_update_period,
                "clip_param": lo.clip_param, "vtrace_lambda": lo.vtrace_lambda,
                "importance_weight_clip": lo.importance_weight_clip, "normalize_advantages": lo.normalize_advantages,
                "value_clip": lo.value_clip, "normalize_returns": lo.normalize_returns,
                "gradient_clip": t.gradient_clip_by_norm_threshold,
                "kl_loss": f"adaptive from {lo.kl_coeff:g} to KL {lo.kl_target:g}" if lo.use_kl_loss else "off"}


APPO = Appo()
