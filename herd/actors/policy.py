"""The actor-side policy of the CPU path: the actor's own copy of the model, on the CPU,
with versioned weights pulled from shared memory between rollouts. (Where a GPU serves
many actors at once, herd.inference's client implements the same ActorPolicy.)"""
from __future__ import annotations

import numpy as np
import torch

from herd.actors.interfaces import PolicyStep
from herd.models import build_model
from herd.weights import SharedWeights


class LocalPolicy:
    def __init__(self, model_kwargs: dict, weights: SharedWeights, seed: int):
        self.model = build_model(**model_kwargs)
        self.model.eval()
        self.weights = weights
        self.version = weights.pull(self.model, have_version=-1)
        self.generator = torch.Generator().manual_seed(seed)  # action sampling, reproducible per actor

    def act(self, obs: np.ndarray) -> PolicyStep:
        """obs [n, *obs_shape] -> actions [n], logits [n, A], value [n], features [n, F]."""
        with torch.no_grad():
            out = self.model(torch.from_numpy(obs).unsqueeze(0))           # [1, n, ...]
            logits = out.logits[0]
            actions = torch.multinomial(torch.softmax(logits, dim=-1), 1, generator=self.generator).squeeze(1)
        return PolicyStep(actions.numpy(), logits.numpy(), out.value[0].numpy(), out.features[0].numpy(),
                          self.version)

    def value(self, obs: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            return self.model(torch.from_numpy(obs).unsqueeze(0)).value[0].numpy()

    def refresh(self) -> int:
        self.version = self.weights.pull(self.model, self.version)
        return self.version

    def close(self) -> None:
        pass
