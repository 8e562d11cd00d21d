"""What every network returns, and the pieces all networks share: the heads (policy, value,
feature vector), time flattening and frame scaling."""
from __future__ import annotations

from typing import NamedTuple, Optional

import torch
from torch import Tensor, nn

from herd.models.gaussian import GaussianPolicyHead


class TrainingLayout:
    """A convolutional network whose training forward pass (gradients on) can run its
    activations channels-last or NCHW, as `channels_last_when_training` says; the CPU
    learner sets it to what measured faster (herd/learner/autotune.py). The result does
    not depend on it."""
    channels_last_when_training: bool = True


class DeclaredPolicy:
    """A network without herd's Heads that names its action distribution itself."""
    action_distribution: str = "categorical"


class ModelOutput(NamedTuple):
    logits: Tensor      # [T, B, A] unnormalised policy logits (a dueling Q head: the Q values;
    #                     a Gaussian head, continuous actions: [T, B, 2A] = mean and log-std)
    value: Tensor       # [T, B]    state-value estimate (a dueling Q head: max_a Q)
    features: Tensor    # [T, B, F] per-step feature vector that elite replay compares


# What a network's heads compute: a policy and a state value (IMPALA), or Q values with
# the dueling architecture of Wang et al. 2016 (Ape-X), in the same ModelOutput fields.
HEADS = ("actor_critic", "dueling_q")


def orthogonal(layer: nn.Module, gain: float) -> nn.Module:
    """Orthogonal weights, zero bias: with small policy-head gain this is what makes
    CartPole-sized tasks learn in a few thousand updates rather than tens of thousands."""
    nn.init.orthogonal_(layer.weight, gain)
    nn.init.zeros_(layer.bias)
    return layer


class Heads(nn.Module):
    """Policy and value heads reading the torso output, plus the feature vector.

    The feature vector is either the torso output itself or, with `use_feature_layer`, an
    extra linear projection of it to `feature_size` (the seed's "additional scaling FC
    layer"). That projection is a side branch: no loss reads it, so it would never receive a
    gradient anyway. It is frozen (requires_grad=False) to say so explicitly, but kept a
    Parameter rather than a buffer so that weight sync (parameters_to_vector) gives every
    actor the learner's projection instead of each actor's own random one.
    """

    def __init__(self, torso_size: int, num_actions: int, feature_size: Optional[int], use_feature_layer: bool,
                 head: str = "actor_critic", action_distribution: str = "categorical",
                 initial_log_std: float = -1.0, value_size: Optional[int] = None):
        super().__init__()
        if head not in HEADS:
            raise ValueError(f"unknown head '{head}' (use one of {', '.join(HEADS)})")
        self.dueling = head == "dueling_q"
        self.action_distribution = action_distribution     # herd.ops.distributions.DISTRIBUTIONS key
        if feature_size is None:
            feature_size = torso_size
        if not use_feature_layer and feature_size != torso_size:
            # The trajectory buffers are sized by feature_size, so silently using another
            # size would only fail later and further from the cause.
            raise ValueError(f"feature_out_layer_size must be {torso_size} (this network's torso output) when "
                             f"use_additional_scaling_FC_layer is False, got {feature_size}")
        self.feature_size = feature_size
        # Dueling: `policy` is the advantage stream A(s, .) and `value` the state stream V(s).
        # -- continuous control: a Gaussian head for Box actions, `num_actions`
        # being their dimension A (herd/models/gaussian.py says why its log-std is global).
        if action_distribution == "gaussian" and not self.dueling:
            self.policy = GaussianPolicyHead(torso_size, num_actions, initial_log_std)
        elif action_distribution == "categorical":
            self.policy = orthogonal(nn.Linear(torso_size, num_actions), 0.01)
        else:
            raise ValueError(f"head {head} cannot have {action_distribution} actions")
        # -- end continuous control
        # value_size: the value head's input where it differs from the policy's (the MLP's
        # value LSTM beside its value torso, herd/models/mlp.py).
        self.value = orthogonal(nn.Linear(value_size or torso_size, 1), 1.0)
        self.feature = orthogonal(nn.Linear(torso_size, feature_size), 1.0) if use_feature_layer else None
        if self.feature is not None:
            self.feature.requires_grad_(False)

    def forward(self, torso: Tensor, T: int, B: int, value_torso: Optional[Tensor] = None) -> ModelOutput:
        """torso: [T*B, torso_size] -> ModelOutput with [T, B, ...] fields. A network with a
        separate value torso passes its output as value_torso."""
        logits = self.policy(torso).view(T, B, -1)
        value = self.value(torso if value_torso is None else value_torso).view(T, B)
        features = torso if self.feature is None else self.feature(torso)
        if self.dueling:
            # Q = V + A - mean_a A: the mean makes V and A identifiable (Wang et al., eq. 9).
            q = value.unsqueeze(-1) + logits - logits.mean(dim=-1, keepdim=True)
            return ModelOutput(q, q.max(dim=-1).values, features.view(T, B, -1))
        return ModelOutput(logits, value, features.view(T, B, -1))


def action_distribution_of(model: nn.Module) -> str:
    """The action distribution of a network's policy head ("categorical" or "gaussian"):
    what actors sample with and what the loss and elite replay's kl_div compare. A module
    without herd's Heads (a hand-made policy in a test) declares it as a DeclaredPolicy."""
    if isinstance(model, DeclaredPolicy):
        return model.action_distribution
    for module in model.modules():
        if isinstance(module, Heads):
            return module.action_distribution
    raise ValueError(f"{type(model).__name__} has no policy heads")


def flatten_time(obs: Tensor, event_dims: int, name: str) -> tuple[Tensor, int, int]:
    """[T, B, *event] -> ([T*B, *event], T, B); a view when `obs` is contiguous.

    The rank check costs nothing and turns a forgotten time axis (an actor passing [B, ...])
    into one clear line instead of a shape error deep inside a conv or matmul."""
    if obs.dim() != 2 + event_dims:
        raise ValueError(f"{name} takes time-major observations [T, B, {event_dims}-d observation], "
                         f"got shape {tuple(obs.shape)}")
    T, B = obs.shape[0], obs.shape[1]
    return obs.reshape(T * B, *obs.shape[2:]), T, B


def frames_to_float(frames: Tensor, memory_format: torch.memory_format = torch.contiguous_format,
                    normalizer: Optional[nn.Module] = None) -> Tensor:
    """Frames stay uint8 (4x smaller in buffers and queues) until here, where they become
    floats in [0, 1]: float32, or straight the autocast dtype (bfloat16) under autocast,
    which the first convolution would cast them to anyway (one pass over the largest
    tensor of the step instead of two; measured 1.3x on a 600-frame forward pass). Float
    frames are taken as already scaled. Division rather than multiplication by 1/255
    keeps 255 -> exactly 1.0. With a normalizer (herd/models/normalize.py FrameNormalizer,
    --normalize_observations) the frames are normalised per pixel instead."""
    device = frames.device.type
    dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else torch.float32
    if normalizer is not None:
        return normalizer(frames, dtype, memory_format)
    if frames.dtype == torch.uint8:
        return frames.to(dtype, memory_format=memory_format).div_(255.0)
    return frames.to(torch.float32, memory_format=memory_format)


def frames_of(obs: Tensor, name: str, memory_format: torch.memory_format = torch.contiguous_format,
              normalizer: Optional[nn.Module] = None) -> tuple[Tensor, int, int]:
    """[T, B, C, H, W] frames -> (the network's input [T*B, C, H, W] as frames_to_float
    makes it, T, B). Frames strided in time (a batch the on-policy queue lent in place,
    herd/store.py lend) cannot be flattened without copying every frame: they are
    converted straight into [T*B, ...] floats instead, in the pass the conversion makes
    anyway, with the same numbers."""
    if obs.dim() != 5:
        flatten_time(obs, 3, name)          # its one-line error
    T, B = obs.shape[0], obs.shape[1]
    if obs.dtype != torch.uint8 or T == 1 or obs.stride(0) == B * obs.stride(1):
        frames, _, _ = flatten_time(obs, 3, name)                  # a view
        return frames_to_float(frames, memory_format, normalizer), T, B
    device = obs.device.type
    dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else torch.float32
    out = torch.empty((T * B, *obs.shape[2:]), dtype=torch.float32 if normalizer is not None else dtype,
                      device=obs.device, memory_format=memory_format)
    out.view(obs.shape).copy_(obs).div_(255.0)                     # floats in [0, 1], as frames_to_float's
    if normalizer is not None:
        return normalizer(out, dtype, memory_format), T, B         # in place on `out`, then cast
    return out, T, B


def probe_flat_size(body: nn.Module, in_channels: int, frame_hw: tuple, name: str) -> int:
    """Flattened size of `body` on one [in_channels, *frame_hw] frame, so that any resolution
    works without hand-computed sizes; frames too small for the strides fail here, clearly."""
    if len(frame_hw) != 2:
        raise ValueError(f"{name} needs frame_hw = (H, W), got {tuple(frame_hw)}")
    try:
        with torch.no_grad():
            return int(body(torch.zeros(1, in_channels, *frame_hw)).shape[1])
    except RuntimeError:
        raise ValueError(f"{name} cannot take {frame_hw[0]}x{frame_hw[1]} frames: too small for its "
                         "convolutions") from None
