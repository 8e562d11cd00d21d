"""MLP for vector observations."""
from __future__ import annotations

from typing import Optional

from torch import Tensor, nn

from herd.models.base import Heads, ModelOutput, flatten_time, orthogonal
from herd.models.core import CoreInput, LSTMCore, heads_after_core
from herd.models.normalize import ObservationNormalizer

ACTIVATIONS = {"tanh": nn.Tanh, "relu": nn.ReLU}


def mlp_torso(obs_dim: int, hidden_sizes, activation: str) -> tuple[nn.Sequential, int]:
    layers, width = [], obs_dim
    for size in hidden_sizes:
        layers += [orthogonal(nn.Linear(width, size), 2 ** 0.5), ACTIVATIONS[activation]()]
        width = size
    return nn.Sequential(*layers), width


class MLPNet(nn.Module):
    """obs [T, B, D] -> hidden layers -> torso [T*B, hidden_sizes[-1]] -> Heads.

    The value head has a torso of its own unless `shared_torso`: returns of a few hundred
    make the value loss dwarf the policy gradient in a shared torso, and CartPole then
    learns several times slower. The feature vector comes from the policy torso.
    With use_feature_layer=False the feature vector is the last hidden layer, so
    feature_size must equal hidden_sizes[-1] (or be None). With the dueling Q head, the
    value torso feeds the state stream V and the policy torso the advantage stream.
    With an LSTM core (core_size > 0, herd/models/core.py) the policy torso feeds the core
    and the value torso a value LSTM of its own (in the same state), for the same reason:
    shared, the value loss's gradients steer the recurrent features and the policy on the
    memory task did not learn at all (entropy at ln 2 after 270k steps, README). The value
    head then reads the value LSTM's output and the value torso's side by side (below)."""

    def __init__(self, obs_dim: int, num_actions: int, hidden_sizes=(64, 64), feature_size: Optional[int] = 64,
                 use_feature_layer: bool = True, activation: str = "tanh", shared_torso: bool = False,
                 head: str = "actor_critic", core_size: int = 0, action_distribution: str = "categorical",
                 initial_log_std: float = -1.0, normalize_observations: bool = False):
        super().__init__()
        # Running mean/std of the raw observations (herd/models/normalize.py: who updates it).
        self.obs_normalizer = ObservationNormalizer(obs_dim) if normalize_observations else None
        if activation not in ACTIVATIONS:
            raise ValueError(f"unknown activation '{activation}' (use one of {', '.join(ACTIVATIONS)})")
        self.torso, width = mlp_torso(obs_dim, hidden_sizes, activation)
        self.value_torso = None if shared_torso else mlp_torso(obs_dim, hidden_sizes, activation)[0]
        self.core = LSTMCore(width, core_size, 0 if shared_torso else width) if core_size else None
        # With a value LSTM the value head also reads the value torso (a skip around the
        # core): the LSTM's output o * tanh(c) is a product of two squashed factors, and
        # CartPole's values near 10 drove about 60% of its outputs past |h| = 0.9 (the policy
        # core's: none), where they pass almost no gradient; the values then lagged behind a policy
        # that began to fail and V-trace's negative advantages ran it into one action
        # (docs/lstm.md). The torso's tanh units reach those values unsaturated.
        self.value_skip = self.core is not None and self.value_torso is not None
        self.heads = Heads(core_size or width, num_actions, feature_size, use_feature_layer, head, action_distribution,
                           initial_log_std, value_size=core_size + width if self.value_skip else None)

    def forward(self, obs: Tensor, core: Optional[CoreInput] = None) -> ModelOutput:
        """obs: [T, B, D], any real dtype (float32 normally; converted, never scaled)."""
        return self.unroll(obs, core)[0]

    def unroll(self, obs: Tensor, core: Optional[CoreInput] = None) -> tuple[ModelOutput, Optional[Tensor]]:
        """forward, plus the LSTM state after the last step [2, L, B, H] (None without a core)."""
        flat, T, B = flatten_time(obs, 1, "MLPNet")
        flat = flat.float()
        if self.obs_normalizer is not None:
            flat = self.obs_normalizer(flat)
        value_torso = self.value_torso(flat) if self.value_torso is not None else None
        return heads_after_core(self.heads, self.core, self.torso(flat), T, B, core, value_torso, self.value_skip)
