"""network "constant": the same policy and value for every observation, learnt (one
logit per action and one value), with no network to compute. What it is for: measuring
herd's data path (actors, inference servers, the learner's loop) without a network's cost
(benchmarks/pipeline.py), and the score a policy that ignores its observations reaches,
which any real network must beat."""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor, nn

from herd.models.base import DeclaredPolicy, ModelOutput


class ConstantPolicy(DeclaredPolicy, nn.Module):
    def __init__(self, num_actions: int, feature_size: Optional[int]):
        nn.Module.__init__(self)
        self.logits = nn.Parameter(torch.zeros(num_actions))        # uniform at the start
        self.value = nn.Parameter(torch.zeros(()))
        self.feature_size = feature_size or 1

    def forward(self, obs: Tensor, core=None) -> ModelOutput:
        """obs [T, B, ...] (only its shape is read) -> logits [T, B, A], value [T, B], zero features [T, B, F]."""
        T, B = obs.shape[:2]
        return ModelOutput(self.logits.expand(T, B, -1).contiguous(), self.value.expand(T, B).contiguous(),
                           torch.zeros((T, B, self.feature_size), device=obs.device))
