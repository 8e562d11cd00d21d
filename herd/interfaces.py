"""The two seams of an actor: where observations come from (`ActorEnvs`) and who chooses
the actions (`ActorPolicy`). The actor loop (herd/actors/actor.py) only talks to these,
so a C++ vector env, per-process gymnasium envs, a local CPU model or a batched inference
server plug in without touching it.

Both follow envpool's asynchronous shape: the actor receives a batch of rows (some or all
of its environments), acts on exactly those rows, and sends the actions back. A
synchronous backend simply returns every environment in every batch.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Protocol

import numpy as np


@dataclass
class EnvBatch:
    """What `ActorEnvs.start()` / `recv()` return: n rows, each one environment.

    Autoreset is "same step": when a step ends an episode, `obs` already holds the first
    observation of the next one, and the step's own final observation is only kept where
    it is needed (to bootstrap a truncated episode)."""
    env_ids: np.ndarray                  # [n] int64: which of the actor's environments (0..E-1)
    obs: np.ndarray                      # [n, *obs_shape]: the observation to act on next
    reward: np.ndarray                   # [n] float32: reward of the step just taken (after clipping); 0 from start()
    done: np.ndarray                     # [n] bool: that step ended the training episode (terminated,
    #                                      truncated, or a lost life with episodic life); False from start()
    truncated_obs: dict = field(default_factory=dict)  # row index -> final observation [*obs_shape] of an
    #                                      episode that was truncated (time limit), not terminated
    finished: list = field(default_factory=list)       # (score, length) of each whole game that ended
    #                                      in this batch: raw, unclipped score over all lives; agent steps


class ActorEnvs(Protocol):
    """An actor's E environments. Every env of the batch returned by the last recv() (or
    start()) must get an action in the next send(), in the same row order."""
    num_envs: int                        # E
    batch_size: int                      # rows per batch: E when synchronous, fewer when asynchronous

    def start(self) -> EnvBatch:
        """Resets every environment (seeded, see the constructor) and returns the first
        batch_size of them (all of them when synchronous)."""

    def send(self, actions: np.ndarray) -> None:
        """actions [n] int64 for the rows of the last batch, in its order. May return
        before the environments have stepped (asynchronous backends step in threads)."""

    def recv(self) -> EnvBatch:
        """The next batch of environments that finished their step."""

    def close(self) -> None: ...


@dataclass
class PolicyStep:
    """The policy's output for n observations."""
    actions: np.ndarray                  # [n] int64
    fields: dict                         # trajectory field -> [n, ...]: the algorithm's per-step outputs
    #                                      (IMPALA: behaviour_logits [n, A], behaviour_value [n], features [n, F])
    version: int                         # the policy version (learner update count) that acted


class ActorPolicy(Protocol):
    # None, or fn(the finished slot's numpy views [time, E, ...]) that completes a rollout's
    # fields before it is sent (Ape-X: its initial priorities).
    finish_rollout: Callable[[dict], None] | None

    def act(self, obs: np.ndarray, env_ids: np.ndarray | None = None, reset: np.ndarray | None = None) -> PolicyStep:
        """obs [n, *obs_shape] (uint8 frames or float32 vectors) -> PolicyStep. env_ids [n]:
        which environments the rows are (None: 0..n-1); reset [n] bool: an episode starts
        with this observation (the batch's `done`). A recurrent policy (--use_lstm) keeps a
        state per environment with them and adds the state it acted from to the fields."""

    def value(self, obs: np.ndarray, env_ids: np.ndarray | None = None) -> np.ndarray:
        """obs [n, *obs_shape] -> value [n] float32 (bootstraps truncated episodes); a
        recurrent policy values them from env_ids' current states, leaving them unchanged."""

    def refresh(self) -> int:
        """Called between rollouts: take newer weights if any; returns the version now acting."""

    def close(self) -> None: ...
