"""Wrappers every environment kind may use."""
from __future__ import annotations

import math

import gymnasium as gym
import numpy as np

REWARD_CLIPPING_METHODS = ("abs_one_sign", "abs_one_clamp", "soft_asymmetric")


def clip_reward(reward: float, method: str) -> float:
    if method == "abs_one_sign":
        return float(np.sign(reward))
    if method == "abs_one_clamp":
        return float(min(1.0, max(-1.0, reward)))
    if method == "soft_asymmetric":
        squashed = 5.0 * math.tanh(reward / 5.0)
        return 0.3 * squashed if squashed < 0 else squashed
    raise ValueError(f"unknown reward_clipping_method '{method}'")


class ClipReward(gym.RewardWrapper):
    def __init__(self, env: gym.Env, method: str):
        super().__init__(env)
        self.method = method

    def reward(self, reward):
        return clip_reward(reward, self.method)


class AgentTimeLimit(gym.Wrapper):
    """Truncates an episode after `max_steps` agent steps (counts reset at a real reset)."""

    def __init__(self, env: gym.Env, max_steps: int):
        super().__init__(env)
        self.max_steps = max_steps
        self.steps = 0

    def reset(self, **kwargs):
        self.steps = 0
        return self.env.reset(**kwargs)

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.steps += 1
        if self.steps >= self.max_steps and not terminated:
            truncated = True
        return obs, reward, terminated, truncated, info


class Float32Observation(gym.ObservationWrapper):
    def __init__(self, env: gym.Env):
        super().__init__(env)
        space = env.observation_space
        self.observation_space = gym.spaces.Box(space.low.astype(np.float32), space.high.astype(np.float32),
                                                space.shape, np.float32)

    def observation(self, obs):
        return np.asarray(obs, dtype=np.float32)


class SeedFirstReset(gym.Wrapper):
    """Passes `seed` to the first reset only, so later resets continue the seeded stream."""

    def __init__(self, env: gym.Env, seed: int | None):
        super().__init__(env)
        self.pending_seed = seed
        if seed is not None:
            env.action_space.seed(seed)

    def reset(self, **kwargs):
        if self.pending_seed is not None and kwargs.get("seed") is None:
            kwargs["seed"] = self.pending_seed
        self.pending_seed = None
        return self.env.reset(**kwargs)
