"""Match-v0: show one of N lights, reward 1 for pressing its button.

A contextual bandit with a vector observation (the one-hot light, float32 [N]) and N
discrete actions; an episode is 20 presses (the registered step limit truncates it). A
random player scores 20 / N on average, a trained one 20, so learning is easy to tell
from chance in a few thousand steps.
"""
from __future__ import annotations

import gymnasium as gym
import numpy as np


class MatchEnv(gym.Env):
    metadata = {"render_modes": []}

    def __init__(self, lights: int = 4, render_mode: str | None = None):
        self.lights = lights
        self.render_mode = render_mode
        self.observation_space = gym.spaces.Box(0.0, 1.0, (lights,), np.float32)
        self.action_space = gym.spaces.Discrete(lights)
        self.lit = 0

    def observe(self) -> np.ndarray:
        obs = np.zeros(self.lights, np.float32)
        obs[self.lit] = 1.0
        return obs

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self.lit = int(self.np_random.integers(self.lights))
        return self.observe(), {}

    def step(self, action):
        reward = 1.0 if int(action) == self.lit else 0.0
        self.lit = int(self.np_random.integers(self.lights))
        return self.observe(), reward, False, False, {}
