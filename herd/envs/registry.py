"""Which environments herd can run, what they look like after preprocessing, and
`make_env`, the one way every part of herd creates an environment."""
from __future__ import annotations

import difflib
from dataclasses import dataclass

import ale_py
import gymnasium as gym

from herd.envs.atari import wrap_atari
from herd.envs.score import GameScore
from herd.envs.wrappers import REWARD_CLIPPING_METHODS, ClipReward, Float32Observation, SeedFirstReset

gym.register_envs(ale_py)
# ALE prints a banner on first use; herd's error output must stay one line.
ale_py.ALEInterface.setLoggerMode(ale_py.LoggerMode.Error)


class EnvError(ValueError):
    """An environment herd cannot run, with one line that says why."""


@dataclass(frozen=True)
class EnvSpec:
    kind: str                   # "atari" or "vector"
    obs_shape: tuple
    obs_dtype: str              # "uint8" or "float32"
    num_actions: int
    max_episode_steps: int | None


def is_atari_id(env_id: str) -> bool:
    return env_id.endswith("NoFrameskip-v4") or env_id.startswith("ALE/")


def registered_spec(env_id: str):
    try:
        return gym.spec(env_id)
    except Exception:
        close = difflib.get_close_matches(env_id, list(gym.registry), n=1)
        hint = f" (did you mean {close[0]}?)" if close else " (for Atari use e.g. PongNoFrameskip-v4)"
        raise EnvError(f"unknown environment '{env_id}': not a registered gymnasium id{hint}") from None


def env_kind(env_id: str) -> str:
    """'atari' for ALE ids (our preprocessing), 'vector' for other gymnasium ids."""
    registered_spec(env_id)
    return "atari" if is_atari_id(env_id) else "vector"


def make_raw(env_id: str, max_episode_steps: int | None = None, render_mode: str | None = None,
             grayscale: bool = True) -> gym.Env:
    if is_atari_id(env_id):
        # Our wrappers do frame skip and no-ops; v5 ids get the v4 behaviour (no sticky actions).
        kwargs = dict(obs_type="grayscale" if grayscale else "rgb", render_mode=render_mode)
        if env_id.startswith("ALE/"):
            kwargs.update(frameskip=1, repeat_action_probability=0.0)
        return gym.make(env_id, max_episode_steps=None, **kwargs)
    return gym.make(env_id, render_mode=render_mode,
                    **({"max_episode_steps": max_episode_steps} if max_episode_steps else {}))


def check_preprocessing(skipped_frames: int, frames_stacked: int, noop_threshold: int, frame_scale_resolution,
                        reward_clipping_method: str) -> None:
    if skipped_frames < 1 or frames_stacked < 1:
        raise EnvError("skipped_frames and frames_stacked must be >= 1")
    if noop_threshold < 0:
        raise EnvError("noop_threshold must be >= 0")
    if len(frame_scale_resolution) != 2 or min(frame_scale_resolution) < 1:
        raise EnvError(f"frame_scale_resolution must be two positive integers, got {frame_scale_resolution}")
    if reward_clipping_method not in REWARD_CLIPPING_METHODS:
        raise EnvError(f"reward_clipping_method '{reward_clipping_method}' is not one of {', '.join(REWARD_CLIPPING_METHODS)}")


def make_env(env_id: str, *, seed: int | None = None, skipped_frames: int = 4, frames_stacked: int = 4,
             noop_threshold: int = 30, episodic_life: bool = True, grayscaling_frames: bool = True,
             frame_scale_resolution=(84, 84), clip_rewards: bool = True, reward_clipping_method: str = "abs_one_sign",
             max_episode_steps: int | None = None, render_mode: str | None = None, fire_reset: bool = True) -> gym.Env:
    """An environment with herd's preprocessing. Every env reports whole-episode raw scores
    in info["episode_score"] / info["episode_length"] on the step the real episode ends."""
    kind = env_kind(env_id)
    check_preprocessing(skipped_frames, frames_stacked, noop_threshold, frame_scale_resolution, reward_clipping_method)
    raw = make_raw(env_id, max_episode_steps, render_mode, grayscaling_frames)
    check_discrete(env_id, raw)
    if kind == "atari":
        env = wrap_atari(raw, skipped_frames=skipped_frames, frames_stacked=frames_stacked,
                         noop_threshold=noop_threshold, episodic_life=episodic_life,
                         frame_scale_resolution=tuple(frame_scale_resolution), clip_rewards=clip_rewards,
                         reward_clipping_method=reward_clipping_method, max_episode_steps=max_episode_steps,
                         fire_reset=fire_reset)
    else:
        if len(raw.observation_space.shape or ()) != 1:
            raw.close()
            raise EnvError(f"environment '{env_id}' has observations of shape {raw.observation_space.shape}: "
                           "herd runs vector (1-D) observations or ALE Atari frames")
        env = Float32Observation(GameScore(raw))
        if clip_rewards:
            env = ClipReward(env, reward_clipping_method)
    return SeedFirstReset(env, seed)


def check_discrete(env_id: str, env: gym.Env) -> None:
    if not isinstance(env.action_space, gym.spaces.Discrete):
        env.close()
        raise EnvError(f"environment '{env_id}' has a {type(env.action_space).__name__} action space: "
                       "herd supports discrete actions only")


def describe_env(env_id: str, **preprocessing) -> EnvSpec:
    """The spaces after preprocessing, checked; builds the environment once."""
    env = make_env(env_id, **preprocessing)
    try:
        space = env.observation_space
        return EnvSpec(env_kind(env_id), tuple(space.shape), str(space.dtype), int(env.action_space.n),
                       env.spec.max_episode_steps if env.spec else None)
    finally:
        env.close()
