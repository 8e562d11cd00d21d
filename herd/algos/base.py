"""What an algorithm builder tells the rest of herd (design.md, "Where new things plug in").

Backends, actors, replays and the learner loop are shared by every algorithm; a builder
supplies only what differs:

    step_fields(num_actions, feature_size)  the per-step policy outputs actors record in a
                                            trajectory beside obs/action/reward/done
    act(out, generator)                     the actor's policy step: model output -> actions
                                            and those per-step fields
    replay_types                            which --replay_parameters types it trains from
    build_loss(cfg)                         fn(batch, out) -> (loss, metrics): what the
                                            learner minimises
    metric_names                            the loss metrics written to train.csv and
                                            TensorBoard (the learner adds grad_norm and lr)
    describe_optimization(cfg)              the optimizer and schedule, for summary.json

Builders unpack the config into explicit arguments here; nothing below them reads it.
"""
from __future__ import annotations

from typing import Callable, Protocol

import torch

from herd.trajectory import Field, TrajectoryLayout

# fn(batch: field -> tensor [T(+1), B, ...], model output over [T+1, B]) -> (scalar loss, metrics)
LossFn = Callable[[dict, object], tuple[torch.Tensor, dict[str, float]]]


class Algorithm(Protocol):
    name: str
    metric_names: tuple[str, ...]
    replay_types: tuple[str, ...]
    inference_server: bool          # the batched inference server can act for it

    def step_fields(self, num_actions: int, feature_size: int) -> dict[str, Field]: ...

    def act(self, out, generator: torch.Generator) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """out: ModelOutput over [1, n, ...] -> (actions [n], {step field: [n, ...]})."""

    def build_loss(self, cfg) -> LossFn: ...

    def describe_optimization(self, cfg) -> dict: ...


def trajectory_layout(algorithm: Algorithm, unroll_length: int, obs_shape: tuple, obs_dtype: str,
                      num_actions: int, feature_size: int) -> TrajectoryLayout:
    """The trajectory an actor of `algorithm` fills: the common fields and its own."""
    fields = algorithm.step_fields(num_actions, feature_size)
    return TrajectoryLayout(unroll_length, tuple(obs_shape), obs_dtype, tuple(fields.items()))
