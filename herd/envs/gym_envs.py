"""The per-process gymnasium backend of `ActorEnvs`: E environments built by `make_env`,
stepped one after another in the actor's own process (synchronous: every batch holds all E).
It runs any environment herd runs; Atari has a faster C++ backend in ale_vector.py."""
from __future__ import annotations

import numpy as np

from herd.interfaces import EnvBatch
from herd.envs.registry import make_env
from herd.envs.wrappers import env_action


class GymEnvs:
    def __init__(self, env_id: str, num_envs: int, *, seed: int, **env_kwargs):
        """Env i is seeded with seed + i; env_kwargs are make_env's preprocessing options."""
        self.envs = [make_env(env_id, seed=seed + i, **env_kwargs) for i in range(num_envs)]
        self.num_envs = self.batch_size = num_envs
        self.obs: np.ndarray | None = None          # [E, *obs_shape], the observations to act on
        self.actions: np.ndarray | None = None

    def start(self) -> EnvBatch:
        self.obs = np.stack([env.reset()[0] for env in self.envs])
        E = self.num_envs
        return EnvBatch(np.arange(E), self.obs.copy(), np.zeros(E, np.float32), np.zeros(E, np.bool_))

    def send(self, actions: np.ndarray) -> None:
        self.actions = np.asarray(actions)

    def recv(self) -> EnvBatch:
        """Steps every env with the actions of the last send(), resetting ended episodes."""
        E = self.num_envs
        batch = EnvBatch(np.arange(E), obs=None, reward=np.zeros(E, np.float32), done=np.zeros(E, np.bool_))
        for e, env in enumerate(self.envs):
            obs, reward, terminated, truncated, info = env.step(env_action(self.actions[e]))
            batch.reward[e] = reward
            if "episode_score" in info:
                batch.finished.append((float(info["episode_score"]), int(info["episode_length"])))
            if terminated or truncated:
                batch.done[e] = True
                if truncated and not terminated:
                    batch.truncated_obs[e] = obs
                obs, _ = env.reset()
            self.obs[e] = obs
        batch.obs = self.obs.copy()  # the caller may keep it; self.obs is overwritten next step
        return batch

    def close(self) -> None:
        for env in self.envs:
            env.close()
        self.envs = []
