"""Our own ALE preprocessing, as gymnasium wrappers (DeepMind's recipe, seed flags):

    raw ALE (grayscale or RGB) -> NoopReset -> MaxAndSkip -> AgentTimeLimit -> GameScore
    -> EpisodicLife -> FireReset -> ResizeFrame -> FrameStack -> ClipReward

GameScore sits below episodic life and reward clipping, so it reports whole-game raw
scores; the time limit sits below it, so a truncated game is reported too."""
from __future__ import annotations

from collections import deque

import cv2
import gymnasium as gym
import numpy as np

from herd.envs.score import GameScore
from herd.envs.wrappers import AgentTimeLimit, ClipReward


class NoopReset(gym.Wrapper):
    """After a real reset, 1..noop_max no-op actions (uniform, from the env's seeded RNG)."""

    def __init__(self, env: gym.Env, noop_max: int):
        super().__init__(env)
        self.noop_max = noop_max

    def reset(self, **kwargs):
        obs, info = self.env.reset(**kwargs)
        if self.noop_max <= 0:
            return obs, info
        for _ in range(int(self.np_random.integers(1, self.noop_max + 1))):
            obs, _, terminated, truncated, info = self.env.step(0)
            if terminated or truncated:
                obs, info = self.env.reset()
        return obs, info


class MaxAndSkip(gym.Wrapper):
    """Repeats the action `skip` times, sums the rewards, returns the max of the last two
    frames (Atari sprites flicker between frames)."""

    def __init__(self, env: gym.Env, skip: int):
        super().__init__(env)
        self.skip = skip

    def step(self, action):
        total, last, previous = 0.0, None, None
        terminated = truncated = False
        info = {}
        for _ in range(self.skip):
            obs, reward, terminated, truncated, info = self.env.step(action)
            total += float(reward)
            previous, last = last, obs
            if terminated or truncated:
                break
        frame = last if previous is None else np.maximum(previous, last)
        return frame, total, terminated, truncated, info


class EpisodicLife(gym.Wrapper):
    """A lost life ends the training episode (terminated=True); reset() then continues the
    same game with a no-op instead of starting a new one, unless the game is over."""

    def __init__(self, env: gym.Env):
        super().__init__(env)
        self.lives = 0
        self.game_over = True

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.game_over = terminated or truncated
        lives = self.env.unwrapped.ale.lives()
        if 0 < lives < self.lives:
            terminated = True
        self.lives = lives
        return obs, reward, terminated, truncated, info

    def reset(self, **kwargs):
        if self.game_over:
            obs, info = self.env.reset(**kwargs)
        else:
            obs, _, terminated, truncated, info = self.env.step(0)
            if terminated or truncated:
                obs, info = self.env.reset(**kwargs)
        self.game_over = False
        self.lives = self.env.unwrapped.ale.lives()
        return obs, info


class FireReset(gym.Wrapper):
    """Presses FIRE after a reset, for games that wait for it (Breakout, Pong...)."""

    def reset(self, **kwargs):
        obs, info = self.env.reset(**kwargs)
        for action in (1, 2):
            obs, _, terminated, truncated, info = self.env.step(action)
            if terminated or truncated:
                obs, info = self.env.reset(**kwargs)
        return obs, info


class ResizeFrame(gym.ObservationWrapper):
    """[H0, W0] gray or [H0, W0, 3] RGB -> [C, H, W] uint8, C = 1 or 3 (INTER_AREA)."""

    def __init__(self, env: gym.Env, height: int, width: int):
        super().__init__(env)
        self.size = (width, height)
        channels = 3 if len(env.observation_space.shape) == 3 else 1
        self.observation_space = gym.spaces.Box(0, 255, (channels, height, width), np.uint8)

    def observation(self, frame):
        resized = cv2.resize(frame, self.size, interpolation=cv2.INTER_AREA)
        return resized[None] if resized.ndim == 2 else np.ascontiguousarray(resized.transpose(2, 0, 1))


class FrameStack(gym.Wrapper):
    """The last k frames along the channel axis: [k*C, H, W]."""

    def __init__(self, env: gym.Env, k: int):
        super().__init__(env)
        self.frames: deque = deque(maxlen=k)
        c, h, w = env.observation_space.shape
        self.observation_space = gym.spaces.Box(0, 255, (k * c, h, w), np.uint8)

    def reset(self, **kwargs):
        obs, info = self.env.reset(**kwargs)
        for _ in range(self.frames.maxlen):
            self.frames.append(obs)
        return np.concatenate(self.frames), info

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.frames.append(obs)
        return np.concatenate(self.frames), reward, terminated, truncated, info


def wrap_atari(raw: gym.Env, *, skipped_frames: int, frames_stacked: int, noop_threshold: int, episodic_life: bool,
               frame_scale_resolution: tuple, clip_rewards: bool, reward_clipping_method: str,
               max_episode_steps: int | None, fire_reset: bool = True) -> gym.Env:
    env = NoopReset(raw, noop_threshold)
    env = MaxAndSkip(env, skipped_frames)
    if max_episode_steps:
        env = AgentTimeLimit(env, max_episode_steps)
    env = GameScore(env)
    if episodic_life:
        env = EpisodicLife(env)
    if fire_reset and "FIRE" in raw.unwrapped.get_action_meanings():
        env = FireReset(env)
    env = ResizeFrame(env, *frame_scale_resolution)
    env = FrameStack(env, frames_stacked)
    if clip_rewards:
        env = ClipReward(env, reward_clipping_method)
    return env
