"""IMPALA (V-trace actor-critic) with CLEAR's cloning terms and LASER's relevance mask:
herd's first algorithm builder (see herd/algos/base.py for what a builder supplies)."""
from __future__ import annotations

import functools

import torch

from herd.algos.base import describe_optimization as optimizer_and_schedule
from herd.algos.base import trajectory_layout
from herd.losses.impala import ImpalaLossWeights, impala_loss
from herd.trajectory import Field


def loss_weights(cfg) -> ImpalaLossWeights:
    lo = cfg.loss
    return ImpalaLossWeights(
        gamma=cfg.train.gamma, policy_gradient=lo.policy_gradient_loss_weight, value=lo.value_loss_weight,
        entropy=lo.entropy_loss_weight, rho_const=lo.rho_const, c_const=lo.c_const,
        use_policy_cloning=lo.use_policy_cloning_loss, policy_cloning=lo.policy_cloning_loss_weight,
        use_value_cloning=lo.use_value_cloning_loss, value_cloning=lo.value_cloning_loss_weight,
        use_kl_mask=lo.use_kl_mask, kl_div_threshold=lo.kl_div_threshold)


class Impala:
    name = "impala"
    metric_names = ("loss", "pg_loss", "value_loss", "entropy", "policy_cloning_loss", "value_cloning_loss",
                    "kl_mask_fraction", "mean_rho")
    replay_types = ("queue", "standard", "custom")
    inference_server = True
    model_options: dict = {}        # the default actor-critic heads
    finish_rollout = None           # nothing to add to a finished rollout

    @staticmethod
    def step_fields(num_actions: int, feature_size: int) -> dict[str, Field]:
        return {
            "behaviour_logits": Field((num_actions,), "float32", float("nan")),   # [T, A]
            "behaviour_value": Field((), "float32", float("nan")),               # [T]
            "features": Field((feature_size,), "float32", float("nan")),         # [T, F], for elite replay
        }

    @staticmethod
    def act(out, generator: torch.Generator) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Samples from softmax(logits); out is over [1, n]."""
        logits = out.logits[0]                                                  # [n, A]
        actions = torch.multinomial(torch.softmax(logits, dim=-1), 1, generator=generator).squeeze(1)
        return actions, {"behaviour_logits": logits, "behaviour_value": out.value[0], "features": out.features[0]}

    @staticmethod
    def actor_options(cfg) -> dict:
        return {}

    @staticmethod
    def act_kwargs(actor_id: int, num_actors: int, options: dict) -> dict:
        return {}                   # every actor samples from its policy alike

    @staticmethod
    def test_act_kwargs(cfg) -> None:
        return None                 # herd test samples from the policy (herd/evaluate.py)

    @staticmethod
    def least_exploring_actor(num_actors: int) -> None:
        return None

    @staticmethod
    def build_loss(cfg, model=None):
        return functools.partial(impala_loss, weights=loss_weights(cfg))

    @staticmethod
    def describe_optimization(cfg) -> dict:
        return optimizer_and_schedule(cfg)


IMPALA = Impala()


def impala_layout(unroll_length: int, obs_shape: tuple, obs_dtype: str, num_actions: int, feature_size: int):
    """IMPALA's trajectory layout (tests and benchmarks build one without a config)."""
    return trajectory_layout(IMPALA, unroll_length, obs_shape, obs_dtype, num_actions, feature_size)
