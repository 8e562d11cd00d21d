"""GameScore: the whole-episode raw score, reported once per real episode end."""
from __future__ import annotations

import gymnasium as gym


class GameScore(gym.Wrapper):
    """Adds info["episode_score"] (sum of raw, unclipped rewards) and info["episode_length"]
    (agent steps) on the step where the real episode ends (terminated or truncated at this
    level), and on no other step. Placed below episodic life and reward clipping."""

    def __init__(self, env: gym.Env):
        super().__init__(env)
        self.score = 0.0
        self.length = 0

    def reset(self, **kwargs):
        self.score, self.length = 0.0, 0
        return self.env.reset(**kwargs)

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.score += float(reward)
        self.length += 1
        if terminated or truncated:
            info = {**info, "episode_score": self.score, "episode_length": self.length}
        return obs, reward, terminated, truncated, info
