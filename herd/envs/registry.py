"""Which environments herd can run, what they look like after preprocessing, and
`make_env`, the one way every part of herd creates an environment.

Three kinds:
  "atari":   ALE ids `<Game>NoFrameskip-v4` or `ALE/<Game>-v5` (the latter forced to frameskip 1
             and no sticky actions), with our preprocessing (herd.envs.atari); obs [C, H, W] uint8.
  "minatar": `MinAtar/<Game>-v1` (herd.envs.minatar, optional package); obs [C, 10, 10] float32.
  "vector":  any other gymnasium id with a 1-D Box observation; obs [D] float32.
Atari and MinAtar need a Discrete action space; vector tasks have Discrete actions or continuous
ones (a 1-D bounded Box, which the agent sees as [-1, 1]^A: herd.envs.wrappers.RescaleClipAction).
MuJoCo and Box2D ids need their optional extras (herd/envs/extras.py). Every error a user
can cause is an EnvError with one line.

Custom environments use gymnasium's own spelling, `pkg.module:EnvId-v0`: every public
function here first imports `pkg.module` in the calling process (its import registers
EnvId-v0), so actors, the evaluation worker, test mode and Ray nodes, which all build
their environments through this module, each import it themselves (docs/environments.md).
Such an id is imported only when this invocation was given it: one read from a file (a
checkpoint's saved config, an experiments file) is refused first, in herd.config.resolve."""
from __future__ import annotations

import difflib
import functools
import importlib
import math
import re
import warnings
from dataclasses import dataclass

import ale_py
import gymnasium as gym
import numpy as np

from herd.envs.atari import wrap_atari
from herd.envs.minatar import MAX_EPISODE_STEPS as MINATAR_MAX_EPISODE_STEPS
from herd.envs.minatar import check_minatar_id, is_minatar_id, make_minatar_raw
from herd.envs.masking import hide_velocity as hide_velocity_of
from herd.envs.extras import check_extra
from herd.errors import EnvError
from herd.envs.score import GameScore
from herd.envs.wrappers import (REWARD_CLIPPING_METHODS, ClipReward, Float32Observation, RescaleClipAction,
                                ScaleReward, SeedFirstReset)
from herd.inputs import quoted

gym.register_envs(ale_py)
# ALE prints a banner when an emulator starts; herd's error output must stay one line.
ale_py.ALEInterface.setLoggerMode(ale_py.LoggerMode.Error)

ATARI_EXAMPLE = "PongNoFrameskip-v4"



@dataclass(frozen=True)
class EnvSpec:
    kind: str                        # "atari", "minatar" or "vector"
    obs_shape: tuple[int, ...]       # after preprocessing: atari [k*C, H, W], minatar [C, 10, 10], vector [D]
    obs_dtype: str                   # "uint8" (atari) or "float32" (minatar, vector)
    num_actions: int                 # discrete: actions; continuous: action dimensions A
    max_episode_steps: int | None    # agent steps before truncation (Atari: ALE's own frame cap / skip)
    action_kind: str = "discrete"    # "discrete" or "continuous" (a Box, seen as [-1, 1]^A)


def deprecation_note(caught: list[warnings.WarningMessage]) -> str:
    """gymnasium's first DeprecationWarning (e.g. "HalfCheetah-v4 is out of date") as a note
    for herd's one-line error, without its colour codes and "WARN: " prefix."""
    for warning in caught:
        if issubclass(warning.category, DeprecationWarning):
            text = re.sub(r"\x1b\[[0-9;]*m", "", str(warning.message)).strip().removeprefix("WARN: ")
            return f" (gymnasium: {text})"
    return ""


def import_env_module(env_id: str) -> str:
    """The bare id of `pkg.module:EnvId-v0` after importing `pkg.module` in this process (a
    no-op for ids without a module, and for a module already imported). A module that cannot
    be imported is one line naming it and its error."""
    if ":" not in env_id:
        return env_id
    module, _, bare_id = env_id.partition(":")
    if not module or not bare_id:
        raise EnvError(f"environment {quoted(env_id)}: write a custom environment as pkg.module:EnvId-v0")
    try:
        importlib.import_module(module)
    except KeyboardInterrupt:
        raise                                  # a stop request, not the module's fault
    except BaseException as err:  # ImportError, or whatever its code raises, SystemExit too (sys.exit() at import)
        first_line = (str(err).strip().splitlines() or [""])[0]
        raise EnvError(f"environment {quoted(env_id)}: cannot import module {quoted(module)} ({type(err).__name__}: "
                       f"{first_line}); install its package or put it on PYTHONPATH") from None
    return bare_id


def registered_spec(env_id: str) -> gym.envs.registration.EnvSpec:
    env_id = import_env_module(env_id)
    try:
        with warnings.catch_warnings():    # probing only: herd's own line says what is wrong
            warnings.simplefilter("ignore")
            spec = gym.spec(env_id)
    except Exception:  # gymnasium raises several error types for bad ids
        close = difflib.get_close_matches(env_id, list(gym.registry), n=3)
        hint = f"did you mean {' or '.join(close)}? " if close else ""
        raise EnvError(f"unknown environment {quoted(env_id)}: not a registered gymnasium id "
                       f"({hint}for Atari use e.g. {ATARI_EXAMPLE})") from None
    check_extra(env_id, spec.entry_point)       # MuJoCo, Box2D: a missing extra is one line
    return spec


def is_ale(spec) -> bool:
    return "ale_py" in str(spec.entry_point)


def check_atari_id(env_id: str, spec) -> None:
    """Only the ids whose raw env our preprocessing expects (1 frame per step, no sticky
    actions after our overrides), with pixel observations."""
    if spec.kwargs.get("obs_type") == "ram":
        raise EnvError(f"environment {quoted(env_id)} has RAM observations: herd runs Atari from pixels "
                       f"(use e.g. {ATARI_EXAMPLE})")
    if not (env_id.endswith("NoFrameskip-v4") or env_id.startswith("ALE/")):
        game = spec.kwargs.get("game", "pong").title().replace("_", "")
        raise EnvError(f"environment {quoted(env_id)} is not supported: herd does its own frame skip without "
                       f"sticky actions, use {game}NoFrameskip-v4 or ALE/{game}-v5")


@functools.lru_cache(maxsize=64)
def vector_spaces(env_id: str) -> tuple[gym.Space, gym.Space]:
    """(observation space, action space) of a non-Atari id; builds the env once per process.

    gymnasium's warnings while probing (an out-of-date version, the env checker) are recorded,
    not printed: they came before herd's one-line error as two lines of their own. A
    deprecation is folded into that error, where it may explain it."""
    env_id = import_env_module(env_id)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            env = gym.make(env_id)
        except Exception as err:  # missing optional dependencies (box2d, mujoco...) and the like
            first_line = (str(err).strip().splitlines() or [type(err).__name__])[0]
            raise EnvError(f"environment {quoted(env_id)} could not be created: {first_line}"
                           f"{deprecation_note(caught)}") from None
        try:
            return env.observation_space, env.action_space
        finally:
            env.close()


def env_kind(env_id: str) -> str:
    """'atari', 'minatar' or 'vector' (see the module docstring); EnvError for anything else."""
    env_id = import_env_module(env_id)
    if is_minatar_id(env_id):
        check_minatar_id(env_id)
        return "minatar"
    spec = registered_spec(env_id)
    if is_ale(spec):
        check_atari_id(env_id, spec)
        return "atari"
    obs_space, _ = vector_spaces(env_id)
    if not (isinstance(obs_space, gym.spaces.Box) and len(obs_space.shape) == 1):
        raise EnvError(f"environment {quoted(env_id)} has {obs_space} observations: herd runs 1-D Box (vector) "
                       f"observations or Atari frames (e.g. {ATARI_EXAMPLE})")
    return "vector"


def check_preprocessing(skipped_frames, frames_stacked, noop_threshold, frame_scale_resolution,
                        reward_clipping_method, max_episode_steps) -> None:
    def is_int(value) -> bool:
        return isinstance(value, int) and not isinstance(value, bool)

    for name, value, least in (("skipped_frames", skipped_frames, 1), ("frames_stacked", frames_stacked, 1),
                               ("noop_threshold", noop_threshold, 0)):
        if not is_int(value) or value < least:
            raise EnvError(f"{name} must be an integer >= {least}, got {value!r}")
    resolution = tuple(frame_scale_resolution) if isinstance(frame_scale_resolution, (tuple, list)) else ()
    if len(resolution) != 2 or not all(is_int(v) and v >= 1 for v in resolution):
        raise EnvError(f"frame_scale_resolution must be two positive integers (height, width), "
                       f"got {frame_scale_resolution!r}")
    if reward_clipping_method not in REWARD_CLIPPING_METHODS:
        raise EnvError(f"reward_clipping_method must be one of {', '.join(REWARD_CLIPPING_METHODS)}, "
                       f"got {reward_clipping_method!r}")
    if max_episode_steps is not None and (not is_int(max_episode_steps) or max_episode_steps < 1):
        raise EnvError(f"max_episode_steps must be an integer >= 1 or None, got {max_episode_steps!r}")


def check_discrete(env_id: str, env: gym.Env) -> None:
    if not isinstance(env.action_space, gym.spaces.Discrete):
        env.close()
        raise EnvError(f"environment {quoted(env_id)} has a {type(env.action_space).__name__} action space: "
                       "herd runs Atari with discrete actions only")


def is_continuous(space: gym.Space) -> bool:
    return isinstance(space, gym.spaces.Box)


def check_action_space(env_id: str, env: gym.Env) -> None:
    """Vector tasks: Discrete actions, or a 1-D Box with finite bounds (rescaled to [-1, 1])."""
    space = env.action_space
    if isinstance(space, gym.spaces.Discrete):
        return
    if is_continuous(space) and len(space.shape) == 1 and np.all(np.isfinite(space.low)) \
            and np.all(np.isfinite(space.high)):
        return
    env.close()
    raise EnvError(f"environment {quoted(env_id)} has a {space} action space: herd runs Discrete actions or a 1-D Box "
                   "with finite bounds")


def profile_kind(env_id: str) -> str:
    """Which defaults of herd.config.PROFILES a run on `env_id` gets: "atari", "vector"
    (discrete actions) or "continuous" (vector observations, Box actions)."""
    kind = env_kind(env_id)
    if kind == "vector" and is_continuous(vector_spaces(env_id)[1]):
        return "continuous"
    return kind


def make_atari_raw(env_id: str, grayscale: bool, render_mode: str | None) -> gym.Env:
    kwargs = dict(obs_type="grayscale" if grayscale else "rgb", render_mode=render_mode)
    if env_id.startswith("ALE/"):
        # v5 defaults (frameskip 4, sticky actions 0.25) would double our frame skip.
        kwargs.update(frameskip=1, repeat_action_probability=0.0)
    # ALE itself truncates a game after 108000 frames (spec kwarg max_num_frames_per_episode);
    # our agent-step limit is GameScore's. The env checker is skipped: ALE is known good.
    return gym.make(env_id, disable_env_checker=True, **kwargs)


def make_vector(env_id: str, max_episode_steps: int | None, clip_rewards: bool, reward_clipping_method: str,
                render_mode: str | None, hide_velocity: bool = False, reward_scale: float = 1.0) -> gym.Env:
    limit = {"max_episode_steps": max_episode_steps} if max_episode_steps else {}
    env = gym.make(env_id, render_mode=render_mode, **limit)
    check_action_space(env_id, env)
    if hide_velocity:
        env = hide_velocity_of(env, env_id)      # herd/envs/masking.py: a memory task
    env = Float32Observation(GameScore(env))
    if is_continuous(env.action_space):
        env = RescaleClipAction(env)
    if clip_rewards:
        env = ClipReward(env, reward_clipping_method)
    if reward_scale != 1.0:
        env = ScaleReward(env, reward_scale)     # after clipping; GameScore, below, sees raw rewards
    return env


def make_minatar(env_id: str, max_episode_steps: int | None, clip_rewards: bool, reward_clipping_method: str,
                 render_mode: str | None) -> gym.Env:
    env = GameScore(make_minatar_raw(env_id, render_mode), max_episode_steps or MINATAR_MAX_EPISODE_STEPS)
    return ClipReward(env, reward_clipping_method) if clip_rewards else env


def make_env(env_id: str, *, seed: int | None = None, skipped_frames: int = 4, frames_stacked: int = 4,
             noop_threshold: int = 30, episodic_life: bool = True, grayscaling_frames: bool = True,
             frame_scale_resolution=(84, 84), clip_rewards: bool = True, reward_clipping_method: str = "abs_one_sign",
             max_episode_steps: int | None = None, fire_reset: bool = True,
             render_mode: str | None = None, hide_velocity: bool = False, reward_scale: float = 1.0) -> gym.Env:
    """An environment with herd's preprocessing. Every env reports the whole game's raw score
    in info["episode_score"] / info["episode_length"] on the step the real game ends, and only
    then. Atari-only options are checked but ignored for vector and MinAtar envs; reward_scale
    multiplies a vector task's rewards (after any clipping). With a seed, two envs give
    identical trajectories under identical actions. hide_velocity: the vector observation
    without its velocity entries (herd/envs/masking.py; refused for Atari, MinAtar and for
    envs whose velocities herd does not know)."""
    check_preprocessing(skipped_frames, frames_stacked, noop_threshold, frame_scale_resolution,
                        reward_clipping_method, max_episode_steps)
    env_id = import_env_module(env_id)
    kind = env_kind(env_id)
    if hide_velocity and kind != "vector":
        raise EnvError(f"--hide_velocity removes velocity entries from vector observations; {quoted(env_id)} gives "
                       f"{'Atari' if kind == 'atari' else 'MinAtar'} frames")
    if kind == "minatar":
        env = make_minatar(env_id, max_episode_steps, clip_rewards, reward_clipping_method, render_mode)
    elif kind == "atari":
        raw = make_atari_raw(env_id, grayscaling_frames, render_mode)
        check_discrete(env_id, raw)
        env = wrap_atari(raw, skipped_frames=skipped_frames, frames_stacked=frames_stacked,
                         noop_threshold=noop_threshold, episodic_life=episodic_life,
                         frame_scale_resolution=tuple(frame_scale_resolution), clip_rewards=clip_rewards,
                         reward_clipping_method=reward_clipping_method, max_episode_steps=max_episode_steps,
                         fire_reset=fire_reset)
    else:
        env = make_vector(env_id, max_episode_steps, clip_rewards, reward_clipping_method, render_mode,
                          hide_velocity=hide_velocity, reward_scale=reward_scale)
    return SeedFirstReset(env, seed)


def episode_step_limit(env_id: str, skipped_frames: int, max_episode_steps: int | None) -> int | None:
    """The agent-step limit of a game: the caller's, or the env's own (for Atari, ALE's frame
    cap in frame-skipped steps, so an upper bound: the no-op reset uses a few frames)."""
    env_id = import_env_module(env_id)
    if is_minatar_id(env_id):
        return max_episode_steps or MINATAR_MAX_EPISODE_STEPS
    spec = registered_spec(env_id)
    if not is_ale(spec):
        return max_episode_steps or spec.max_episode_steps   # gym.make's limit replaces the spec's
    frames = spec.kwargs.get("max_num_frames_per_episode")
    limits = [v for v in (math.ceil(frames / skipped_frames) if frames else None, max_episode_steps) if v]
    return min(limits) if limits else None                   # ALE's frame cap still applies


def describe_env(env_id: str, **preprocessing) -> EnvSpec:
    """The spaces after preprocessing (same keywords as make_env), checked; builds the env once."""
    env_id = import_env_module(env_id)
    env = make_env(env_id, **preprocessing)
    try:
        space, actions = env.observation_space, env.action_space
        continuous = is_continuous(actions)
        return EnvSpec(env_kind(env_id), tuple(int(n) for n in space.shape), str(space.dtype),
                       int(actions.shape[0]) if continuous else int(actions.n),
                       episode_step_limit(env_id, preprocessing.get("skipped_frames", 4),
                                          preprocessing.get("max_episode_steps")),
                       "continuous" if continuous else "discrete")
    finally:
        env.close()
