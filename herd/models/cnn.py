"""Convolutional networks for stacked frames: the Nature DQN CNN and the IMPALA ResNet.
Both take uint8 frames [T, B, C, H, W] and scale them to [0, 1] themselves, or normalise
them per pixel (normalize_observations: herd/models/normalize.py FrameNormalizer)."""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from herd.models.base import Heads, ModelOutput, TrainingLayout, frames_of, orthogonal, probe_flat_size
from herd.models.core import CoreInput, LSTMCore, heads_after_core
from herd.models.normalize import FrameNormalizer

RELU_GAIN = 2 ** 0.5


class NatureCNN(nn.Module, TrainingLayout):
    """Mnih et al. 2015: conv 32 8x8/4, 64 4x4/2, 64 3x3/1, fc 512 (the torso) -> Heads."""

    torso_size = 512

    def __init__(self, in_channels: int, num_actions: int, feature_size: Optional[int] = 512,
                 use_feature_layer: bool = True, frame_hw=(84, 84), head: str = "actor_critic", core_size: int = 0,
                 normalize_observations: bool = False):
        super().__init__()
        # Running per-pixel mean/std (herd/models/normalize.py: who updates it).
        self.obs_normalizer = FrameNormalizer(frame_hw) if normalize_observations else None
        self.convs = nn.Sequential(
            orthogonal(nn.Conv2d(in_channels, 32, 8, stride=4), RELU_GAIN), nn.ReLU(),
            orthogonal(nn.Conv2d(32, 64, 4, stride=2), RELU_GAIN), nn.ReLU(),
            orthogonal(nn.Conv2d(64, 64, 3, stride=1), RELU_GAIN), nn.ReLU(),
            nn.Flatten(),
        )
        flat_size = probe_flat_size(self.convs, in_channels, frame_hw, "nature_cnn")   # 3136 at 84x84
        self.fc = nn.Sequential(orthogonal(nn.Linear(flat_size, self.torso_size), RELU_GAIN), nn.ReLU())
        self.core = LSTMCore(self.torso_size, core_size) if core_size else None      # herd/models/core.py
        self.heads = Heads(core_size or self.torso_size, num_actions, feature_size, use_feature_layer, head)
        # On CPU, channels-last activations make a learner update (forward and backward)
        # 1.5-1.6x faster in fp32 (79 -> 49 ms at batch 8 x 20, 332 -> 219 ms at 32 x 20) and
        # 1.1-1.3x in bf16 (2-core Xeon, benchmarks/learner_step.py; README, learner step).
        # Without gradients (actors, elite scoring) they gain nothing and cost up to 5% at
        # actor sizes, so only where gradients flow. Only the input is converted: the
        # weights stay contiguous (weight sync flattens them with view(-1)), and Flatten
        # reads logical (C, H, W) order, so results do not depend on the format. A CPU
        # learner times both (herd/learner/autotune.py): which is faster depends on the CPU.
        self.channels_last_when_training = True

    def forward(self, obs: Tensor, core: Optional[CoreInput] = None) -> ModelOutput:
        """obs: [T, B, C, H, W] uint8 (or float already in [0, 1])."""
        return self.unroll(obs, core)[0]

    def unroll(self, obs: Tensor, core: Optional[CoreInput] = None) -> tuple[ModelOutput, Optional[Tensor]]:
        """forward, plus the LSTM state after the last step [2, L, B, H] (None without a core)."""
        # On a GPU, cudnn's fast bf16 convolutions are NHWC: NCHW input cost 28% of an H100
        # learner's GPU time in layout conversions (shared/gpu/README.md), so there too.
        channels_last = self.channels_last_when_training and torch.is_grad_enabled()
        fmt = torch.channels_last if channels_last else torch.contiguous_format
        frames, T, B = frames_of(obs, "NatureCNN", fmt, self.obs_normalizer)     # [T*B, C, H, W] floats
        return heads_after_core(self.heads, self.core, self.fc(self.convs(frames)), T, B, core)


class ResidualBlock(nn.Module):
    """x + conv(relu(conv(relu(x)))), both 3x3 same-padding, as in the IMPALA paper."""

    def __init__(self, channels: int):
        super().__init__()
        self.conv0 = nn.Conv2d(channels, channels, 3, padding=1)
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1)

    def forward(self, x: Tensor) -> Tensor:
        return x + self.conv1(F.relu(self.conv0(F.relu(x))))


class ImpalaResNet(nn.Module, TrainingLayout):
    """Espeholt et al. 2018 deep network: 3 stages (16, 32, 32 channels) of conv 3x3 +
    max-pool 3x3/2 + 2 residual blocks, ReLU, fc 256 (the torso) -> Heads.

    Convolutions keep PyTorch's default init, as the reference implementations do: orthogonal
    sqrt(2) on both convs of six residual blocks would let the residual stream grow stage by
    stage. The heads are the shared orthogonal ones."""

    torso_size = 256

    def __init__(self, in_channels: int, num_actions: int, feature_size: Optional[int] = 256,
                 use_feature_layer: bool = True, frame_hw=(84, 84), channels=(16, 32, 32),
                 head: str = "actor_critic", core_size: int = 0, normalize_observations: bool = False):
        super().__init__()
        self.obs_normalizer = FrameNormalizer(frame_hw) if normalize_observations else None
        stages, width = [], in_channels
        for out in channels:
            stages += [nn.Conv2d(width, out, 3, padding=1), nn.MaxPool2d(3, stride=2, padding=1),
                       ResidualBlock(out), ResidualBlock(out)]
            width = out
        self.stages = nn.Sequential(*stages, nn.ReLU(), nn.Flatten())
        flat_size = probe_flat_size(self.stages, in_channels, frame_hw, "resnet")      # 3872 at 84x84
        self.fc = nn.Sequential(nn.Linear(flat_size, self.torso_size), nn.ReLU())
        self.core = LSTMCore(self.torso_size, core_size) if core_size else None      # herd/models/core.py
        self.heads = Heads(core_size or self.torso_size, num_actions, feature_size, use_feature_layer, head)

    def forward(self, obs: Tensor, core: Optional[CoreInput] = None) -> ModelOutput:
        """obs: [T, B, C, H, W] uint8 (or float already in [0, 1])."""
        return self.unroll(obs, core)[0]

    def unroll(self, obs: Tensor, core: Optional[CoreInput] = None) -> tuple[ModelOutput, Optional[Tensor]]:
        """forward, plus the LSTM state after the last step [2, L, B, H] (None without a core)."""
        # On CPU, channels-last activations run this network about 2x faster (measured, 1
        # thread: 13 -> 7 ms at B=4, 550 -> 220 ms at B=110). Only the input is converted;
        # the weights stay contiguous because weight sync flattens them with view(-1).
        # Flatten reads logical (C, H, W) order, so the result does not depend on the format.
        # On a GPU, channels-last where gradients flow (cudnn's bf16 convolutions are NHWC).
        # Where gradients flow, channels_last_when_training decides (a CPU learner times both).
        channels_last = self.channels_last_when_training if torch.is_grad_enabled() else not obs.is_cuda
        fmt = torch.channels_last if channels_last else torch.contiguous_format
        frames, T, B = frames_of(obs, "ImpalaResNet", fmt, self.obs_normalizer)  # [T*B, C, H, W] floats
        return heads_after_core(self.heads, self.core, self.fc(self.stages(frames)), T, B, core)
