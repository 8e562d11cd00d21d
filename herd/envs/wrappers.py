"""Wrappers every environment kind may use: reward clipping, float32 observations and
seeding on the first reset."""
from __future__ import annotations

import math

import gymnasium as gym
import numpy as np

REWARD_CLIPPING_METHODS = ("abs_one_sign", "abs_one_clamp", "soft_asymmetric")


def clip_reward(reward: float, method: str) -> float:
    """abs_one_sign: sign(r); abs_one_clamp: r clipped to [-1, 1];
    soft_asymmetric: 5*tanh(r/5), negatives scaled by 0.3 (punishments count less)."""
    if method == "abs_one_sign":
        return float(np.sign(reward))
    if method == "abs_one_clamp":
        return float(min(1.0, max(-1.0, reward)))
    if method == "soft_asymmetric":
        squashed = 5.0 * math.tanh(reward / 5.0)
        return 0.3 * squashed if squashed < 0 else squashed
    raise ValueError(f"unknown reward_clipping_method '{method}' (one of {', '.join(REWARD_CLIPPING_METHODS)})")


class ClipReward(gym.RewardWrapper):
    """The agent sees clipped rewards; GameScore, below this, still sees raw ones."""

    def __init__(self, env: gym.Env, method: str):
        clip_reward(0.0, method)  # fail now, not on the first step
        super().__init__(env)
        self.method = method

    def reward(self, reward):
        return clip_reward(float(reward), self.method)


class Float32Observation(gym.ObservationWrapper):
    """Vector observations as float32, whatever dtype the env uses (the models expect it)."""

    def __init__(self, env: gym.Env):
        super().__init__(env)
        space = env.observation_space
        self.observation_space = gym.spaces.Box(space.low.astype(np.float32), space.high.astype(np.float32),
                                                space.shape, np.float32)

    def observation(self, obs):
        return np.asarray(obs, dtype=np.float32)


class SeedFirstReset(gym.Wrapper):
    """Passes `seed` to the first reset only: later resets continue the seeded RNG stream
    instead of replaying the same episode. Also seeds the action space, so that
    `action_space.sample()` is reproducible too."""

    def __init__(self, env: gym.Env, seed: int | None):
        super().__init__(env)
        self.pending_seed = seed
        if seed is not None:
            env.action_space.seed(seed)

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        if seed is None:
            seed = self.pending_seed
        self.pending_seed = None
        return self.env.reset(seed=seed, options=options)


class ScaleReward(gym.RewardWrapper):
    """The agent sees rewards times `scale` (continuous-control returns in the hundreds make
    the value loss dwarf the policy gradient under one gradient-norm clip); GameScore,
    below this, still sees raw ones."""

    def __init__(self, env: gym.Env, scale: float):
        super().__init__(env)
        self.scale = float(scale)

    def reward(self, reward):
        return float(reward) * self.scale


class RescaleClipAction(gym.ActionWrapper):
    """Continuous actions: the agent acts in [-1, 1]^A, which this maps linearly onto the
    env's Box [low, high]. Anything outside [-1, 1] is clipped here, in the env step: the
    policy's Gaussian sample itself is what the trajectory stores and what its
    log-probability is of (herd.ops.distributions.DiagGaussian), so clipping never has to
    be undone or accounted for in V-trace. One normalised space also lets one initial
    log-std and one set of defaults serve tasks with bounds of 1 (MuJoCo) or 2 (Pendulum)."""

    def __init__(self, env: gym.Env):
        super().__init__(env)
        space = env.action_space
        self.low, self.high = space.low.astype(np.float64), space.high.astype(np.float64)
        self.action_space = gym.spaces.Box(-1.0, 1.0, space.shape, np.float32)

    def action(self, action):
        unit = np.clip(np.asarray(action, dtype=np.float64), -1.0, 1.0)
        scaled = self.low + (unit + 1.0) * 0.5 * (self.high - self.low)
        return scaled.astype(self.env.action_space.dtype)


def env_action(action):
    """One row of a policy's actions as an env takes it: a Python int for a discrete action
    (a numpy scalar), the float vector [A] itself for a continuous one."""
    return int(action) if np.ndim(action) == 0 else np.asarray(action)
