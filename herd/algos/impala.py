"""IMPALA (V-trace actor-critic) with CLEAR's cloning terms and LASER's relevance mask:
herd's first algorithm builder (see herd/algos/base.py for what a builder supplies)."""
from __future__ import annotations

import functools
from typing import Sequence

import torch

from herd.algos.base import describe_optimization as optimizer_and_schedule
from herd.algos.base import one_step_per_batch
from herd.algos.base import trajectory_layout
from herd.losses.impala import ImpalaLossWeights, impala_loss
from herd.models import action_distribution_of
from herd.ops.distributions import get_distribution
from herd.trajectory import Field


def loss_weights(cfg, entropy: float | torch.Tensor | None = None) -> ImpalaLossWeights:
    """entropy: the bonus's weight where it is not --entropy_loss_weight itself (a tensor
    that follows the learning rate, with --entropy_decay)."""
    lo = cfg.loss
    return ImpalaLossWeights(
        gamma=cfg.train.gamma, policy_gradient=lo.policy_gradient_loss_weight, value=lo.value_loss_weight,
        entropy=lo.entropy_loss_weight if entropy is None else entropy, rho_const=lo.rho_const, c_const=lo.c_const,
        vtrace_lambda=lo.vtrace_lambda,
        use_policy_cloning=lo.use_policy_cloning_loss, policy_cloning=lo.policy_cloning_loss_weight,
        use_value_cloning=lo.use_value_cloning_loss, value_cloning=lo.value_cloning_loss_weight,
        use_kl_mask=lo.use_kl_mask, kl_div_threshold=lo.kl_div_threshold)


class Impala:
    name = "impala"
    metric_names = ("loss", "pg_loss", "value_loss", "entropy", "policy_cloning_loss", "value_cloning_loss",
                    "kl_mask_fraction", "mean_rho")
    replay_types = ("queue", "standard", "custom")
    inference_server = True
    capturable_loss = True          # no host-side logic in the loss: the update can be one CUDA graph
    model_options: dict = {}        # the default actor-critic heads
    finish_rollout = None           # nothing to add to a finished rollout
    reuse = staticmethod(one_step_per_batch)
    action_kinds = ("discrete", "continuous")   # a categorical or a diagonal Gaussian policy

    @staticmethod
    def step_fields(num_actions: int, feature_size: int, action_distribution: str = "categorical"
                    ) -> dict[str, Field]:
        """The behaviour policy's parameters, one field each (herd.ops.distributions):
        behaviour_logits [T, A] (categorical), or behaviour_mean and behaviour_log_std
        [T, A] (Gaussian, A action dimensions); then the value and the features."""
        dist = get_distribution(action_distribution)
        policy = {f"behaviour_{name}": Field((num_actions,), "float32", float("nan")) for name in dist.param_names}
        return {
            **policy,
            "behaviour_value": Field((), "float32", float("nan")),               # [T]
            "features": Field((feature_size,), "float32", float("nan")),         # [T, F], for elite replay
        }

    @staticmethod
    def read_fields(replay_types: Sequence[str], action_distribution: str = "categorical") -> tuple[str, ...]:
        """The behaviour policy's parameters (V-trace's ratios) and value (CLEAR's value
        cloning: the loss computes it over every column and keeps the replayed ones, so
        it reads the field in every batch) always; feature vectors only with a custom
        (elite) replay, whose off-policy scorer compares them with the current model's."""
        dist = get_distribution(action_distribution)
        fields = [f"behaviour_{name}" for name in dist.param_names] + ["behaviour_value"]
        if "custom" in replay_types:
            fields.append("features")
        return tuple(fields)

    @staticmethod
    def act(out, generator: torch.Generator, action_distribution: str = "categorical"
            ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Samples from the policy (softmax(logits), or the Gaussian); out is over [1, n]."""
        dist = get_distribution(action_distribution)
        params = out.logits[0]                                                  # [n, P]
        actions = dist.sample(params, generator)                                # [n] or [n, A]
        policy = {f"behaviour_{name}": part for name, part in zip(dist.param_names, dist.split(params))}
        return actions, {**policy, "behaviour_value": out.value[0], "features": out.features[0]}

    @staticmethod
    def actor_options(cfg) -> dict:
        return {}

    @staticmethod
    def act_kwargs(actor_id: int, num_actors: int, options: dict) -> dict:
        # Every actor samples from its policy alike, with the distribution of its network.
        return {"action_distribution": options.get("action_distribution", "categorical")}

    @staticmethod
    def test_act_kwargs(cfg) -> None:
        return None                 # herd test samples from the policy (herd/evaluation.py)

    @staticmethod
    def least_exploring_actor(num_actors: int) -> None:
        return None

    @staticmethod
    def build_loss(cfg, model=None, entropy: float | torch.Tensor | None = None):
        dist = get_distribution(action_distribution_of(model) if model is not None else "categorical")
        return functools.partial(impala_loss, weights=loss_weights(cfg, entropy), distribution=dist)

    @staticmethod
    def describe_optimization(cfg) -> dict:
        lo = cfg.loss
        entropy = (f"{lo.entropy_loss_weight:g} x the learning rate's decay (--entropy_decay)" if lo.entropy_decay
                   else f"{lo.entropy_loss_weight:g}")
        return {**optimizer_and_schedule(cfg), "entropy_bonus": entropy}


IMPALA = Impala()


def impala_layout(unroll_length: int, obs_shape: tuple, obs_dtype: str, num_actions: int, feature_size: int,
                  action_distribution: str = "categorical"):
    """IMPALA's trajectory layout (tests and benchmarks build one without a config)."""
    return trajectory_layout(IMPALA, unroll_length, obs_shape, obs_dtype, num_actions, feature_size,
                             action_distribution)
