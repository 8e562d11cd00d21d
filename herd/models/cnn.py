"""Convolutional networks for stacked frames: the Nature DQN CNN and the IMPALA ResNet."""
from __future__ import annotations

import torch
from torch import Tensor, nn
import torch.nn.functional as F

from herd.models.base import Heads, ModelOutput, as_float_frames, flatten_time, orthogonal


class NatureCNN(nn.Module):
    def __init__(self, in_channels: int, num_actions: int, feature_size: int = 512, use_feature_layer: bool = True,
                 frame_hw=(84, 84)):
        super().__init__()
        gain = nn.init.calculate_gain("relu")
        self.convs = nn.Sequential(
            orthogonal(nn.Conv2d(in_channels, 32, 8, stride=4), gain), nn.ReLU(),
            orthogonal(nn.Conv2d(32, 64, 4, stride=2), gain), nn.ReLU(),
            orthogonal(nn.Conv2d(64, 64, 3, stride=1), gain), nn.ReLU(),
            nn.Flatten(),
        )
        with torch.no_grad():
            flat_size = self.convs(torch.zeros(1, in_channels, *frame_hw)).shape[1]
        self.fc = nn.Sequential(orthogonal(nn.Linear(flat_size, 512), gain), nn.ReLU())
        self.heads = Heads(512, num_actions, feature_size, use_feature_layer)

    def forward(self, obs: Tensor) -> ModelOutput:
        """obs: [T, B, C, H, W] uint8."""
        frames, T, B = flatten_time(obs, 3)
        return self.heads(self.fc(self.convs(as_float_frames(frames))), T, B)


class ResidualBlock(nn.Module):
    def __init__(self, channels: int):
        super().__init__()
        self.conv0 = nn.Conv2d(channels, channels, 3, padding=1)
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1)

    def forward(self, x: Tensor) -> Tensor:
        return x + self.conv1(F.relu(self.conv0(F.relu(x))))


class ImpalaResNet(nn.Module):
    """The IMPALA paper's deep network: 3 stages of conv + max-pool + 2 residual blocks."""

    def __init__(self, in_channels: int, num_actions: int, feature_size: int = 256, use_feature_layer: bool = True,
                 frame_hw=(84, 84), channels=(16, 32, 32)):
        super().__init__()
        stages, width = [], in_channels
        for out in channels:
            stages += [nn.Conv2d(width, out, 3, padding=1), nn.MaxPool2d(3, stride=2, padding=1),
                       ResidualBlock(out), ResidualBlock(out)]
            width = out
        self.stages = nn.Sequential(*stages, nn.ReLU(), nn.Flatten())
        with torch.no_grad():
            flat_size = self.stages(torch.zeros(1, in_channels, *frame_hw)).shape[1]
        self.fc = nn.Sequential(nn.Linear(flat_size, 256), nn.ReLU())
        self.heads = Heads(256, num_actions, feature_size, use_feature_layer)

    def forward(self, obs: Tensor) -> ModelOutput:
        """obs: [T, B, C, H, W] uint8."""
        frames, T, B = flatten_time(obs, 3)
        return self.heads(self.fc(self.stages(as_float_frames(frames))), T, B)
