"""A convolutional network sized for MinAtar's 10x10 frames.

The Nature CNN's first 8x8 stride-4 convolution needs frames of at least 36x36; on a
10x10 grid one cell is one object, so MinAtar's own agents (Young & Tian 2019) use a
single 3x3 stride-1 convolution of 16 channels and a hidden layer of 128 units. We keep
that shape: the games are learnt in minutes with it, and it costs next to nothing on a CPU
(about 0.2 MFLOP per frame)."""
from __future__ import annotations

from typing import Optional

from torch import Tensor, nn

from herd.models.base import Heads, ModelOutput, frames_of, orthogonal, probe_flat_size
from herd.models.core import CoreInput, LSTMCore, heads_after_core

RELU_GAIN = 2 ** 0.5


class MinAtarCNN(nn.Module):
    """conv 16 3x3/1 (no padding), ReLU, fc 128 (the torso), ReLU -> Heads."""

    torso_size = 128

    def __init__(self, in_channels: int, num_actions: int, feature_size: Optional[int] = 128,
                 use_feature_layer: bool = True, frame_hw=(10, 10), head: str = "actor_critic", channels: int = 16,
                 core_size: int = 0):
        super().__init__()
        self.convs = nn.Sequential(orthogonal(nn.Conv2d(in_channels, channels, 3, stride=1), RELU_GAIN), nn.ReLU(),
                                   nn.Flatten())
        flat_size = probe_flat_size(self.convs, in_channels, frame_hw, "minatar_cnn")   # 16 x 8 x 8 = 1024 at 10x10
        self.fc = nn.Sequential(orthogonal(nn.Linear(flat_size, self.torso_size), RELU_GAIN), nn.ReLU())
        self.core = LSTMCore(self.torso_size, core_size) if core_size else None      # herd/models/core.py
        self.heads = Heads(core_size or self.torso_size, num_actions, feature_size, use_feature_layer, head)

    def forward(self, obs: Tensor, core: Optional[CoreInput] = None) -> ModelOutput:
        """obs: [T, B, C, H, W], float in [0, 1] (MinAtar's 0/1 channels) or uint8 frames."""
        return self.unroll(obs, core)[0]

    def unroll(self, obs: Tensor, core: Optional[CoreInput] = None) -> tuple[ModelOutput, Optional[Tensor]]:
        """forward, plus the LSTM state after the last step [2, L, B, H] (None without a core)."""
        frames, T, B = frames_of(obs, "MinAtarCNN")                             # [T*B, C, H, W] floats
        return heads_after_core(self.heads, self.core, self.fc(self.convs(frames)), T, B, core)
