"""What an algorithm builder tells the rest of herd (docs/developer.md, "Where new things plug in").

Backends, actors, replays and the learner loop are shared by every algorithm; a builder
supplies only what differs:

    step_fields(num_actions, feature_size, action_distribution)
                                            the per-step policy outputs actors can record in a
                                            trajectory beside obs/action/reward/done
    read_fields(replay_types, action_distribution)
                                            those of them its loss and the configured replays
                                            (--replay_parameters' types) read: the only ones
                                            actors record (trajectory_layout's `read`)
    action_kinds                            which action spaces it can act in: ("discrete",)
                                            or ("discrete", "continuous")
    act(out, generator, **act_kwargs)       the actor's policy step: model output -> actions
                                            and those per-step fields
    actor_options(cfg)                      what every actor needs from the config (a dict,
                                            carried by the ActorSpec)
    act_kwargs(actor_id, num_actors, options)  actor i's own arguments to act (Ape-X: its epsilon)
    finish_rollout                          None, or fn(slot views, model, options) that
                                            completes a rollout's fields before it is sent
                                            (Ape-X: initial priorities)
    test_act_kwargs(cfg)                    act's arguments in `herd test`; None: sample
                                            from softmax(logits)
    least_exploring_actor(num_actors)       the actor whose games episodes.csv marks, or None
    model_options                           extra build_model arguments (Ape-X: the dueling head)
    replay_types                            which --replay_parameters types it trains from
    build_loss(cfg, model)                  fn(batch, out) -> (loss, metrics): what the
                                            learner minimises; a herd.losses.base.Loss where
                                            it keeps state (a target network), which every
                                            checkpoint saves through its state_dict()
    capturable_loss                         True when the loss has no host-side logic, so a CUDA
                                            learner may capture the whole update as one graph
    metric_names                            the loss metrics written to train.csv and
                                            TensorBoard (the learner adds grad_norm and lr)
    describe_optimization(cfg)              the optimizer and schedule, for summary.json
    reuse(cfg)                              None (one gradient step per batch), or a
                                            herd.learner.reuse.Reuse: passes of minibatch
                                            steps per stored batch, build_loss then giving a
                                            StoredBatchLoss (APPO)

Builders unpack the config into explicit arguments here; nothing below them reads it.
"""
from __future__ import annotations

from typing import Callable, Iterable, Protocol, Sequence

import torch

from herd.learner.reuse import Reuse
from herd.losses.base import Loss, LossFn
from herd.models.core import CORE_STATE
from herd.ops.distributions import get_distribution
from herd.trajectory import Field, TrajectoryLayout



class Algorithm(Protocol):
    name: str
    metric_names: tuple[str, ...]
    replay_types: tuple[str, ...]
    inference_server: bool          # the batched inference server can act for it
    capturable_loss: bool           # the update can be captured as one CUDA graph
    model_options: dict
    finish_rollout: Callable[[dict, torch.nn.Module, dict], None] | None
    action_kinds: tuple[str, ...]   # "discrete", "continuous"

    def step_fields(self, num_actions: int, feature_size: int,
                    action_distribution: str = "categorical") -> dict[str, Field]: ...

    def read_fields(self, replay_types: Sequence[str], action_distribution: str = "categorical") -> tuple[str, ...]:
        ...

    def act(self, out, generator: torch.Generator, **act_kwargs) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """out: ModelOutput over [1, n, ...] -> (actions [n], {step field: [n, ...]})."""

    def actor_options(self, cfg) -> dict: ...

    def act_kwargs(self, actor_id: int, num_actors: int, options: dict) -> dict: ...

    def test_act_kwargs(self, cfg) -> dict | None: ...

    def least_exploring_actor(self, num_actors: int) -> int | None: ...

    def build_loss(self, cfg, model: torch.nn.Module) -> Loss | LossFn: ...

    def describe_optimization(self, cfg) -> dict: ...

    def reuse(self, cfg) -> Reuse | None: ...


def trajectory_layout(algorithm: Algorithm, unroll_length: int, obs_shape: tuple, obs_dtype: str,
                      num_actions: int, feature_size: int, action_distribution: str = "categorical",
                      core_state_shape: tuple | None = None, read: Iterable[str] | None = None) -> TrajectoryLayout:
    """The trajectory an actor of `algorithm` fills: the common fields and its own (only
    those in `read`, the algorithm's read_fields, where given: None keeps them all), plus,
    for a network with an LSTM core, its start state (core_state_shape (2, L, H)).
    action_distribution (herd.ops.distributions): "gaussian" for continuous actions of
    dimension num_actions, whose action field is then float32 [A]."""
    dist = get_distribution(action_distribution)
    fields = algorithm.step_fields(num_actions, feature_size, action_distribution)
    if read is not None:
        read = set(read)
        fields = {name: f for name, f in fields.items() if name in read}
    if core_state_shape is not None:
        fields[CORE_STATE] = Field(tuple(core_state_shape), "float32", float("nan"), start_only=True)
    return TrajectoryLayout(unroll_length, tuple(obs_shape), obs_dtype, tuple(fields.items()),
                            dist.action_shape(num_actions), dist.action_dtype)


def one_step_per_batch(cfg) -> None:
    """reuse(cfg) of the algorithms that train each batch once, in one gradient step."""
    return None


def describe_optimization(cfg) -> dict:
    """The optimizer and LR schedule as summary.json states them (herd's learner builds both
    the same way for every algorithm)."""
    t = cfg.train
    optimizer = f"RMSprop (decay 0.99, no momentum, eps {t.rmsprop_eps:g})" if t.optimizer == "rmsprop" else "Adam"
    return {"optimizer": optimizer,
            "scheduler": f"{'linear' if t.lr_decay_power == 1 else f'power-{t.lr_decay_power:g} polynomial'} decay "
                         f"from {t.lr:g} to {t.lr_end_value:g} over {t.lr_scheduler_steps} updates"}
