"""The actor-side policy of the CPU path: the actor's own copy of the model, on the CPU,
with versioned weights pulled from shared memory between rollouts. How actions are drawn
from the model's output is the algorithm's (herd/algos). (Where a GPU serves many actors
at once, herd.inference's client implements the same ActorPolicy.)"""
from __future__ import annotations

import numpy as np
import torch

from herd.algos import get_algorithm
from herd.interfaces import PolicyStep
from herd.models import EnvCoreStates, action_distribution_of, build_model
from herd.models.core import CORE_STATE, CoreInput, state_to_rows
from herd.weights import SharedWeights


class LocalPolicy:
    def __init__(self, model_kwargs: dict, weights: SharedWeights, seed: int, algorithm: str = "impala",
                 actor_id: int = 0, num_actors: int = 1, options: dict | None = None, num_envs: int = 0,
                 record: tuple | None = None):
        """actor_id of num_actors and the algorithm's actor options decide this actor's own
        arguments to act (Ape-X: its epsilon). num_envs: the actor's environments, whose
        LSTM states a recurrent model keeps (it grows to more if asked). record: the step
        fields the trajectory holds (None: all the algorithm's); act() returns only those."""
        self.record = None if record is None else set(record)
        self.model = build_model(**model_kwargs)
        self.model.eval()
        self.states = EnvCoreStates.for_model(self.model, num_envs)     # None: feed-forward
        self.algorithm = get_algorithm(algorithm)
        # The network's action distribution (categorical or Gaussian) is the algorithm's to use.
        self.options = {**(options or {}), "action_distribution": action_distribution_of(self.model)}
        self.act_kwargs = self.algorithm.act_kwargs(actor_id, num_actors, self.options)
        self.finish_rollout = self.complete_rollout if self.algorithm.finish_rollout is not None else None
        self.weights = weights
        self.version = weights.pull(self.model, have_version=-1)
        self.generator = torch.Generator().manual_seed(seed)  # action sampling, reproducible per actor

    def act(self, obs: np.ndarray, env_ids: np.ndarray | None = None, reset: np.ndarray | None = None) -> PolicyStep:
        """obs [n, *obs_shape] -> actions [n] and the algorithm's step fields [n, ...]; a
        recurrent model also gives CORE_STATE [n, 2, L, H], the state each row acted from
        (the rollout writer keeps it where the row is its trajectory's step 0)."""
        with torch.no_grad():
            x = torch.from_numpy(obs).unsqueeze(0)                           # over [1, n, ...]
            if self.states is None:
                out = self.model(x)
            else:
                ids = np.arange(len(obs)) if env_ids is None else env_ids
                out, start = self.states.step(self.model, x, ids, reset)
            actions, fields = self.algorithm.act(out, self.generator, **self.act_kwargs)
            if self.states is not None:
                fields[CORE_STATE] = state_to_rows(start)
        return PolicyStep(actions.numpy(), {name: t.numpy() for name, t in fields.items()
                                            if self.record is None or name in self.record or name == CORE_STATE},
                          self.version)

    def complete_rollout(self, views: dict) -> None:
        """views: the finished slot's numpy views [time, E, ...] (shared memory)."""
        self.algorithm.finish_rollout(views, self.model, self.options)

    def value(self, obs: np.ndarray, env_ids: np.ndarray | None = None) -> np.ndarray:
        with torch.no_grad():
            x = torch.from_numpy(obs).unsqueeze(0)
            if self.states is None:
                return self.model(x).value[0].numpy()
            ids = np.arange(len(obs)) if env_ids is None else env_ids
            return self.model(x, CoreInput(self.states.begin(ids), None)).value[0].numpy()   # states unchanged

    def refresh(self) -> int:
        self.version = self.weights.pull(self.model, self.version)
        return self.version

    def close(self) -> None:
        pass
