"""What every network returns, and the heads all networks share."""
from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor, nn


class ModelOutput(NamedTuple):
    logits: Tensor      # [T, B, A]
    value: Tensor       # [T, B]
    features: Tensor    # [T, B, F] the per-step feature vector used by elite replay


def orthogonal(layer: nn.Module, gain: float) -> nn.Module:
    nn.init.orthogonal_(layer.weight, gain)
    nn.init.zeros_(layer.bias)
    return layer


class Heads(nn.Module):
    """Policy and value heads on a torso output, plus the feature vector: either an extra
    linear layer of `feature_size` (the seed's additional scaling FC layer) or the torso
    output itself."""

    def __init__(self, torso_size: int, num_actions: int, feature_size: int, use_feature_layer: bool):
        super().__init__()
        if not use_feature_layer and feature_size != torso_size:
            raise ValueError(f"feature_out_layer_size must be {torso_size} (the torso's output) when "
                             "use_additional_scaling_FC_layer is False")
        self.policy = orthogonal(nn.Linear(torso_size, num_actions), 0.01)
        self.value = orthogonal(nn.Linear(torso_size, 1), 1.0)
        self.feature = orthogonal(nn.Linear(torso_size, feature_size), 1.0) if use_feature_layer else None

    def forward(self, torso: Tensor, T: int, B: int) -> ModelOutput:
        """torso: [T*B, torso_size] -> ModelOutput with [T, B, ...] fields."""
        logits = self.policy(torso).view(T, B, -1)
        value = self.value(torso).view(T, B)
        features = self.feature(torso) if self.feature is not None else torso
        return ModelOutput(logits, value, features.view(T, B, -1))


def flatten_time(obs: Tensor, event_dims: int) -> tuple[Tensor, int, int]:
    """[T, B, *event] -> ([T*B, *event], T, B)."""
    T, B = obs.shape[:2]
    return obs.reshape(T * B, *obs.shape[2:]), T, B


def as_float_frames(frames: Tensor) -> Tensor:
    """uint8 frames stay uint8 until here, then become floats in [0, 1]."""
    if frames.dtype == torch.uint8:
        return frames.float().mul_(1.0 / 255.0)
    return frames.float()
