"""IMPACT (Luo et al., ICLR 2020): IMPALA's actors and V-trace, a target network and a
clipped surrogate (herd/losses/impact.py), trained from a circular buffer that serves each
batch K times (herd/replay/circular.py). See herd/algos/base.py for what a builder supplies.

The actors are IMPALA's, field for field (the behaviour policy, its value and features):
only the learner differs, so everything IMPALA's actors run on (Atari, vector, MinAtar,
continuous actions, the LSTM core, the inference server, Ray) runs IMPACT."""
from __future__ import annotations

from herd.algos.base import describe_optimization as optimizer_and_schedule
from herd.algos.base import one_step_per_batch
from herd.algos.impala import IMPALA
from herd.losses.impact import ImpactLoss, ImpactLossWeights
from herd.models import action_distribution_of
from herd.ops.distributions import get_distribution


def loss_weights(cfg) -> ImpactLossWeights:
    lo = cfg.loss
    return ImpactLossWeights(
        gamma=cfg.train.gamma, value=lo.value_loss_weight, entropy=lo.entropy_loss_weight, rho_const=lo.rho_const,
        c_const=lo.c_const, vtrace_lambda=lo.vtrace_lambda, clip_param=lo.clip_param, importance_weight_clip=lo.importance_weight_clip,
        use_kl_loss=lo.use_kl_loss, kl_target=lo.kl_target)


class Impact:
    name = "impact"
    metric_names = ("loss", "pg_loss", "value_loss", "entropy", "kl_target", "kl_coeff", "clip_fraction",
                    "mean_rho", "mean_ratio")
    replay_types = ("circular", "queue")    # the queue alone: one pass per batch, still against the target
    inference_server = True
    # The target network syncs, and the KL coefficient is kept, on a host-side count of
    # calls: a captured CUDA graph would replay neither (herd/learner/learner.py).
    capturable_loss = False
    model_options: dict = {}
    finish_rollout = None
    reuse = staticmethod(one_step_per_batch)
    action_kinds = IMPALA.action_kinds
    # The actor side is IMPALA's (composition: the same functions, not a subclass).
    step_fields = staticmethod(IMPALA.step_fields)
    read_fields = staticmethod(IMPALA.read_fields)      # the behaviour policy and value; features for elite
    act = staticmethod(IMPALA.act)
    actor_options = staticmethod(IMPALA.actor_options)
    act_kwargs = staticmethod(IMPALA.act_kwargs)
    test_act_kwargs = staticmethod(IMPALA.test_act_kwargs)
    least_exploring_actor = staticmethod(IMPALA.least_exploring_actor)

    @staticmethod
    def build_loss(cfg, model) -> ImpactLoss:
        return ImpactLoss(model, loss_weights(cfg), cfg.train.target_update_period, kl_coeff=cfg.loss.kl_coeff,
                          distribution=get_distribution(action_distribution_of(model)))

    @staticmethod
    def describe_optimization(cfg) -> dict:
        lo = cfg.loss
        return {**optimizer_and_schedule(cfg), "target_update_period": cfg.train.target_update_period,
                "clip_param": lo.clip_param, "importance_weight_clip": lo.importance_weight_clip,
                "kl_loss": f"adaptive from {lo.kl_coeff:g} to KL {lo.kl_target:g}" if lo.use_kl_loss else "off"}


IMPACT = Impact()
