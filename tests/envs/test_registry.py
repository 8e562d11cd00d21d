"""env_kind / describe_env / make_env argument checking: what herd accepts, and one-line
EnvErrors for what it does not."""
import sys

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.envs.classic_control import CartPoleEnv

from herd.envs import EnvError, EnvSpec, describe_env, env_kind, make_env
from herd.envs.registry import profile_kind, vector_spaces


class MultiDiscreteCartPole(CartPoleEnv):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.action_space = gym.spaces.MultiDiscrete([2, 2])


class UnboundedBoxCartPole(CartPoleEnv):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.action_space = gym.spaces.Box(-np.inf, np.inf, (1,), np.float32)


# Action spaces herd refuses, on vector observations (no gymnasium env has them built in).
gym.register("HerdMultiDiscrete-v0", entry_point=MultiDiscreteCartPole, disable_env_checker=True)
gym.register("HerdUnboundedBox-v0", entry_point=UnboundedBoxCartPole, disable_env_checker=True)


@pytest.mark.parametrize("env_id, kind", [
    ("CartPole-v1", "vector"), ("Acrobot-v1", "vector"),
    ("PongNoFrameskip-v4", "atari"), ("BreakoutNoFrameskip-v4", "atari"), ("ALE/Pong-v5", "atari"),
])
def test_env_kind(env_id, kind):
    assert env_kind(env_id) == kind


def test_describe_env_after_preprocessing():
    assert describe_env("CartPole-v1") == EnvSpec("vector", (4,), "float32", 2, 500)
    assert describe_env("Acrobot-v1", max_episode_steps=50) == EnvSpec("vector", (6,), "float32", 3, 50)
    # ALE's own cap is 108000 frames = 27000 agent steps at skip 4
    assert describe_env("PongNoFrameskip-v4") == EnvSpec("atari", (4, 84, 84), "uint8", 6, 27000)
    pong_rgb = describe_env("PongNoFrameskip-v4", grayscaling_frames=False, frames_stacked=2,
                            frame_scale_resolution=(64, 72), skipped_frames=3, max_episode_steps=100)
    assert pong_rgb == EnvSpec("atari", (6, 64, 72), "uint8", 6, 100)
    assert describe_env("BreakoutNoFrameskip-v4").num_actions == 4


def test_ale_v5_ids_run_with_our_frame_skip_and_no_sticky_actions():
    env = make_env("ALE/Breakout-v5", seed=0)
    ale = env.unwrapped.ale
    assert env.unwrapped._frameskip == 1
    assert ale.getFloat("repeat_action_probability") == 0.0
    env.reset()
    before = ale.getEpisodeFrameNumber()
    env.step(0)
    assert ale.getEpisodeFrameNumber() - before == 4              # our MaxAndSkip, 1 frame per raw step
    env.close()


def one_line_env_error(call, *args, **kwargs) -> str:
    with pytest.raises(EnvError) as caught:
        call(*args, **kwargs)
    message = str(caught.value)
    assert message and "\n" not in message
    return message


@pytest.mark.parametrize("env_id, words", [
    ("Foo-v0", ["unknown environment 'Foo-v0'", "PongNoFrameskip-v4"]),
    ("CartPol-v1", ["did you mean", "CartPole-v1"]),
    ("HerdMultiDiscrete-v0", ["'HerdMultiDiscrete-v0'", "MultiDiscrete", "Discrete actions or a 1-D Box"]),
    ("HerdUnboundedBox-v0", ["'HerdUnboundedBox-v0'", "finite bounds"]),
    ("FrozenLake-v1", ["'FrozenLake-v1'", "1-D Box"]),
    ("CarRacing-v3", ["'CarRacing-v3'", "1-D Box"]),                     # pixels without ALE's preprocessing
    ("Pong-v4", ["PongNoFrameskip-v4", "ALE/Pong-v5"]),
    ("PongNoFrameskip-v0", ["PongNoFrameskip-v4", "sticky actions"]),   # v0 has sticky actions
])
def test_unsupported_environments_are_one_line_env_errors(env_id, words):
    message = one_line_env_error(describe_env, env_id)
    for word in words:
        assert word in message
    assert issubclass(EnvError, ValueError)


@pytest.mark.parametrize("env_id, kind", [("CartPole-v1", "vector"), ("Pendulum-v1", "continuous"),
                                          ("HalfCheetah-v5", "continuous"), ("LunarLander-v3", "vector"),
                                          ("PongNoFrameskip-v4", "atari")])
def test_profile_kind_tells_continuous_actions_apart(env_id, kind):
    assert profile_kind(env_id) == kind


def test_continuous_env_spec():
    assert describe_env("Hopper-v5") == EnvSpec("vector", (11,), "float32", 3, 1000, "continuous")


@pytest.mark.parametrize("env_id, module, extra", [("HalfCheetah-v5", "mujoco", "mujoco"),
                                                   ("BipedalWalker-v3", "Box2D", "box2d"),
                                                   ("LunarLander-v3", "Box2D", "box2d")])
def test_a_missing_extra_is_one_line_naming_it(monkeypatch, env_id, module, extra):
    """As on a machine without the extra: the module cannot be imported (None in sys.modules
    is Python's own mark for that, and gymnasium's import of it fails the same way)."""
    vector_spaces.cache_clear()
    monkeypatch.setitem(sys.modules, module, None)
    message = one_line_env_error(describe_env, env_id)
    assert f"pip install -e '.[{extra}]'" in message and env_id in message
    vector_spaces.cache_clear()


def test_env_kind_rejects_what_make_env_cannot_run():
    one_line_env_error(env_kind, "NoSuchGame-v9")
    one_line_env_error(env_kind, "FrozenLake-v1")
    assert env_kind("Pendulum-v1") == "vector"                  # observations; actions are describe_env's check


@pytest.mark.parametrize("kwargs, name", [
    ({"skipped_frames": 0}, "skipped_frames"), ({"frames_stacked": 0}, "frames_stacked"),
    ({"noop_threshold": -1}, "noop_threshold"), ({"skipped_frames": 2.5}, "skipped_frames"),
    ({"frame_scale_resolution": (84, 0)}, "frame_scale_resolution"),
    ({"frame_scale_resolution": (84,)}, "frame_scale_resolution"),
    ({"frame_scale_resolution": "84x84"}, "frame_scale_resolution"),
    ({"reward_clipping_method": "tanh"}, "reward_clipping_method"),
    ({"max_episode_steps": 0}, "max_episode_steps"),
])
@pytest.mark.parametrize("env_id", ["CartPole-v1", "PongNoFrameskip-v4"])
def test_bad_preprocessing_arguments_are_one_line_env_errors(env_id, kwargs, name):
    assert name in one_line_env_error(make_env, env_id, **kwargs)


def test_noop_threshold_zero_and_lists_are_accepted():
    env = make_env("PongNoFrameskip-v4", noop_threshold=0, frame_scale_resolution=[42, 42], fire_reset=False)
    obs, _ = env.reset(seed=0)
    assert obs.shape == (4, 42, 42)
    assert env.unwrapped.ale.getEpisodeFrameNumber() == 0          # no no-ops, no FIRE
    env.close()
