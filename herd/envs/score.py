"""GameScore: the whole-game raw score, reported once, on the step the real game ends.

Actors and evaluation learn that a real game ended (and how it went) only from
info["episode_score"]: episodic life and reward clipping above this wrapper change what
`terminated` and `reward` mean, but never this key."""
from __future__ import annotations

from contextlib import contextmanager

import gymnasium as gym

EPISODE_KEYS = ("episode_score", "episode_length")
# Reward earned inside a wrapper's reset() below GameScore (the no-op reset's raw frames),
# passed up in the reset info so the whole-game score includes it.
RESET_REWARD_KEY = "reset_reward"


def episode_info(info: dict) -> dict:
    """The GameScore keys of `info` (empty if the step did not end a game)."""
    return {key: info[key] for key in EPISODE_KEYS if key in info}


class GameScore(gym.Wrapper):
    """Adds info["episode_score"] (float: sum of the raw, unclipped rewards of the game) and
    info["episode_length"] (int: steps of the game) on the step where the game ends
    (terminated or truncated at this level), and on no other step.

    Place it below episodic life and reward clipping. In herd's Atari stack it sits above
    frame skip, and the steps that wrappers above take inside reset() (FIRE, the no-op after
    a lost life) are excluded with `uncounted()`, so episode_length counts exactly the
    agent's own steps; their rewards still count in the score.

    `max_length`: truncate the game after that many counted steps (herd's agent-step time
    limit lives here because this is where agent steps are counted exactly). A step that
    terminates is never also marked truncated."""

    def __init__(self, env: gym.Env, max_length: int | None = None):
        super().__init__(env)
        self.max_length = max_length
        self.score = 0.0
        self.length = 0
        self.hidden = 0  # > 0 while a wrapper above takes steps the agent does not see

    def reset(self, **kwargs):
        obs, info = self.env.reset(**kwargs)
        self.score, self.length = float(info.get(RESET_REWARD_KEY, 0.0)), 0
        return obs, info

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.score += float(reward)
        self.length += 0 if self.hidden else 1
        if self.max_length and self.length >= self.max_length and not terminated:
            truncated = True
        if terminated or truncated:
            # A new dict: the inner env may reuse its info dict between steps.
            info = {**info, "episode_score": self.score, "episode_length": self.length}
        return obs, reward, terminated, truncated, info


def find_game_score(env: gym.Env) -> GameScore | None:
    """The GameScore below `env` in its wrapper chain, if any."""
    while isinstance(env, gym.Wrapper):
        if isinstance(env, GameScore):
            return env
        env = env.env
    return None


@contextmanager
def uncounted(score: GameScore | None):
    """Steps taken inside this block do not count in episode_length (see GameScore)."""
    if score is None:
        yield
        return
    score.hidden += 1
    try:
        yield
    finally:
        score.hidden -= 1
