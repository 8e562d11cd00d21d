"""Recurrent rollouts for the --use_lstm tests: real CartPoles with the velocities hidden,
stepped synchronously or asynchronously, and an actor acting on them with an LSTM policy."""
from __future__ import annotations

import threading
from collections import deque

import numpy as np
import torch

from herd.actors.actor import act_and_collect
from herd.actors.policy import LocalPolicy
from herd.actors.rollout import RolloutWriter
from herd.algos import trajectory_layout
from herd.algos.impala import IMPALA
from herd.envs import make_env
from herd.interfaces import EnvBatch
from herd.models import build_model
from herd.store import TrajectorySlots
from herd.weights import SharedWeights

T, E, H, F, ROLLOUTS = 8, 3, 16, 8, 6
S = 2 * H                   # the state's last axis: the MLP's policy and value streams
MODEL = dict(network="mlp", obs_shape=(2,), obs_dtype="float32", num_actions=2, feature_size=F, lstm_size=H)
LAYOUT = trajectory_layout(IMPALA, T, (2,), "float32", 2, F, core_state_shape=(2, 1, S))


class CartPoles:
    """E CartPoles without velocities. batch_size < E: asynchronous, each batch a random
    subset of the envs that have stepped (as ale_vector's async mode hands them out)."""

    def __init__(self, batch_size: int, seed: int = 0):
        self.envs = [make_env("CartPole-v1", seed=seed + i, hide_velocity=True) for i in range(E)]
        self.num_envs, self.batch_size = E, batch_size
        self.rng = np.random.default_rng(seed)
        self.ready: deque = deque()
        self.last: np.ndarray | None = None

    def start(self) -> EnvBatch:
        for e, env in enumerate(self.envs):
            self.ready.append((e, env.reset()[0], 0.0, False, []))
        return self.take()

    def take(self) -> EnvBatch:
        items = list(self.ready)
        order = self.rng.permutation(len(items))[: self.batch_size] if self.batch_size < E else range(len(items))
        chosen = [items[i] for i in order]
        for item in chosen:
            self.ready.remove(item)
        self.last = np.array([c[0] for c in chosen], dtype=np.int64)
        return EnvBatch(self.last, np.stack([c[1] for c in chosen]), np.array([c[2] for c in chosen], np.float32),
                        np.array([c[3] for c in chosen], bool), finished=[f for c in chosen for f in c[4]])

    def send(self, actions):
        for e, action in zip(self.last, actions):
            obs, reward, terminated, truncated, info = self.envs[e].step(int(action))
            finished = [(info["episode_score"], info["episode_length"])] if "episode_score" in info else []
            if terminated or truncated:
                obs, _ = self.envs[e].reset()
            self.ready.append((int(e), obs, float(reward), bool(terminated or truncated), finished))

    def recv(self) -> EnvBatch:
        return self.take()

    def close(self):
        for env in self.envs:
            env.close()


def collect(batch_size: int):
    """(the learner's model, the delivered slots' copies in order): ROLLOUTS rollouts of an
    actor acting with the learner's published weights."""
    torch.manual_seed(0)
    model = build_model(**MODEL)
    policy = LocalPolicy(MODEL, SharedWeights(model), seed=3, num_envs=E)
    slots = TrajectorySlots(LAYOUT, 4, E)
    free, copies, stop = list(range(4)), [], threading.Event()

    def send(delivery):
        copies.append({name: view.copy() for name, view in slots.views(delivery.slot).items()})
        slots.reset(delivery.slot)
        free.append(delivery.slot)
        if len(copies) == ROLLOUTS:
            stop.set()

    envs = CartPoles(batch_size)
    act_and_collect(envs, policy, RolloutWriter(slots.views, lambda: free.pop(0), T, E), send, stop)
    envs.close()
    return model, copies
