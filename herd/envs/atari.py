"""Our own ALE preprocessing as gymnasium wrappers (the DeepMind recipe, herd's flags):

    raw ALE frames [210, 160] gray or [210, 160, 3] RGB, 1 frame per step, no sticky actions
    -> NoopReset -> MaxAndSkip -> GameScore (+ time limit) -> EpisodicLife -> FireReset
    -> ResizeFrame [C, H, W] -> FrameStack [k*C, H, W] uint8 -> ClipReward

GameScore sits below episodic life and reward clipping, so it reports whole-game raw
scores. It also counts agent steps (excluding the FIRE / no-op steps taken inside reset())
and enforces the agent-step time limit, so a truncated game is reported too. The no-op
reset's raw-frame rewards reach it through the reset info (score.RESET_REWARD_KEY)."""
from __future__ import annotations

from collections import deque

import cv2
import gymnasium as gym
import numpy as np

from herd.envs.score import RESET_REWARD_KEY, GameScore, episode_info, find_game_score, uncounted
from herd.envs.wrappers import ClipReward

NOOP, FIRE = 0, 1


class NoopReset(gym.Wrapper):
    """After a real reset, 1..noop_max no-op actions (uniform, drawn from the env's own
    np_random, so a seeded reset gives the same count); noop_max=0 disables. Varies the
    start state of deterministic games."""

    def __init__(self, env: gym.Env, noop_max: int):
        super().__init__(env)
        self.noop_max = noop_max
        self.last_noops = 0  # for tests and debugging

    def reset(self, **kwargs):
        obs, info = self.env.reset(**kwargs)
        self.last_noops = 0
        if self.noop_max <= 0:
            return obs, info
        earned = 0.0
        for _ in range(int(self.np_random.integers(1, self.noop_max + 1))):
            obs, reward, terminated, truncated, info = self.env.step(NOOP)
            earned += float(reward)
            self.last_noops += 1
            if terminated or truncated:  # only in degenerate games: start over, without no-ops
                obs, info = self.env.reset()
                earned = 0.0
                break
        return obs, {**info, RESET_REWARD_KEY: earned}


class MaxAndSkip(gym.Wrapper):
    """Repeats the action `skip` times (fewer if the game ends), sums the rewards and
    returns the pixel-wise max of the last two frames: Atari sprites flicker, showing on
    alternate frames only. Keeps GameScore keys from any inner step's info."""

    def __init__(self, env: gym.Env, skip: int):
        super().__init__(env)
        self.skip = skip

    def step(self, action):
        total, last, previous = 0.0, None, None
        terminated = truncated = False
        info, carried = {}, {}
        for _ in range(self.skip):
            obs, reward, terminated, truncated, info = self.env.step(action)
            carried.update(episode_info(info))
            total += float(reward)
            previous, last = last, obs
            if terminated or truncated:
                break
        frame = last if previous is None else np.maximum(previous, last)
        if carried.keys() - info.keys():
            info = {**info, **carried}
        return frame, total, terminated, truncated, info


class EpisodicLife(gym.Wrapper):
    """A lost life ends the agent's episode (terminated=True), which helps value
    estimation. reset() after a lost life continues the same game with one no-op step;
    any other reset (game over, truncation, first reset, an explicit seed) is a real one.
    `game_over` says whether the last step ended the real game."""

    def __init__(self, env: gym.Env):
        super().__init__(env)
        self.lives = 0
        self.life_lost = False   # the last step lost a life but the game goes on
        self.game_over = True
        self.score = find_game_score(env)

    def ale_lives(self) -> int:
        return int(self.env.unwrapped.ale.lives())

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.game_over = bool(terminated or truncated)
        lives = self.ale_lives()
        self.life_lost = lives < self.lives and not self.game_over
        self.lives = lives
        return obs, reward, terminated or self.life_lost, truncated, info

    def reset(self, *, seed=None, options=None):
        carried = {}
        if self.life_lost and seed is None:
            with uncounted(self.score):
                obs, _, terminated, truncated, info = self.env.step(NOOP)
            if not (terminated or truncated):
                self.life_lost, self.game_over, self.lives = False, False, self.ale_lives()
                return obs, info
            # The game ended inside this hidden step: its score can only travel in reset's info.
            carried = episode_info(info)
        obs, info = self.env.reset(seed=seed, options=options)
        self.life_lost, self.game_over, self.lives = False, False, self.ale_lives()
        return obs, {**info, **carried}


class FireReset(gym.Wrapper):
    """Presses FIRE (then action 2, as DeepMind's recipe does) after every reset, for games
    that wait for FIRE to start or to serve after a lost life (Breakout, Pong...)."""

    def __init__(self, env: gym.Env):
        super().__init__(env)
        self.score = find_game_score(env)

    @staticmethod
    def applies_to(env: gym.Env) -> bool:
        meanings = env.unwrapped.get_action_meanings()
        return len(meanings) >= 3 and meanings[FIRE] == "FIRE"

    def reset(self, **kwargs):
        obs, info = self.env.reset(**kwargs)
        for action in (FIRE, 2):
            with uncounted(self.score):
                obs, _, terminated, truncated, step_info = self.env.step(action)
            if terminated or truncated:
                # Retry without the seed: the same seed would replay the same ending.
                obs, info = self.env.reset()
                info = {**info, **episode_info(step_info)}
        return obs, info


class ResizeFrame(gym.ObservationWrapper):
    """[H0, W0] gray or [H0, W0, 3] RGB -> [C, H, W] uint8 (C = 1 or 3), INTER_AREA."""

    def __init__(self, env: gym.Env, height: int, width: int):
        super().__init__(env)
        self.size = (width, height)  # cv2 wants (width, height)
        channels = 3 if len(env.observation_space.shape) == 3 else 1
        self.observation_space = gym.spaces.Box(0, 255, (channels, height, width), np.uint8)

    def observation(self, frame):
        resized = cv2.resize(frame, self.size, interpolation=cv2.INTER_AREA)
        if resized.ndim == 2:
            return resized[None]                                   # [1, H, W]
        return np.ascontiguousarray(resized.transpose(2, 0, 1))   # [3, H, W]


class FrameStack(gym.Wrapper):
    """The last k frames along the channel axis, oldest first: [k*C, H, W]. After a reset
    the first frame fills all k slots. Every observation is a fresh array, so callers may
    keep it."""

    def __init__(self, env: gym.Env, k: int):
        super().__init__(env)
        self.frames: deque = deque(maxlen=k)
        c, h, w = env.observation_space.shape
        self.observation_space = gym.spaces.Box(0, 255, (k * c, h, w), np.uint8)

    def reset(self, **kwargs):
        obs, info = self.env.reset(**kwargs)
        self.frames.extend([obs] * self.frames.maxlen)
        return np.concatenate(self.frames), info

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.frames.append(obs)
        return np.concatenate(self.frames), reward, terminated, truncated, info


def wrap_atari(raw: gym.Env, *, skipped_frames: int = 4, frames_stacked: int = 4, noop_threshold: int = 30,
               episodic_life: bool = True, frame_scale_resolution: tuple = (84, 84), clip_rewards: bool = True,
               reward_clipping_method: str = "abs_one_sign", max_episode_steps: int | None = None,
               fire_reset: bool = True) -> gym.Env:
    """`raw`: an ALE env with frameskip 1 and no sticky actions. Arguments are checked by
    registry.make_env; max_episode_steps counts agent (frame-skipped) steps."""
    env = NoopReset(raw, noop_threshold)
    env = MaxAndSkip(env, skipped_frames)
    env = GameScore(env, max_length=max_episode_steps)
    if episodic_life:
        env = EpisodicLife(env)
    if fire_reset and FireReset.applies_to(raw):
        env = FireReset(env)
    env = ResizeFrame(env, *frame_scale_resolution)
    env = FrameStack(env, frames_stacked)
    if clip_rewards:
        env = ClipReward(env, reward_clipping_method)
    return env
