"""MLP for vector observations."""
from __future__ import annotations

from torch import Tensor, nn

from herd.models.base import Heads, ModelOutput, flatten_time, orthogonal

ACTIVATIONS = {"tanh": nn.Tanh, "relu": nn.ReLU}


class MLPNet(nn.Module):
    def __init__(self, obs_dim: int, num_actions: int, hidden_sizes=(64, 64), feature_size: int = 64,
                 use_feature_layer: bool = True, activation: str = "tanh"):
        super().__init__()
        layers, width = [], obs_dim
        for size in hidden_sizes:
            layers += [orthogonal(nn.Linear(width, size), 2 ** 0.5), ACTIVATIONS[activation]()]
            width = size
        self.torso = nn.Sequential(*layers)
        self.heads = Heads(width, num_actions, feature_size, use_feature_layer)

    def forward(self, obs: Tensor) -> ModelOutput:
        """obs: [T, B, D] float32."""
        flat, T, B = flatten_time(obs.float(), 1)
        return self.heads(self.torso(flat), T, B)
