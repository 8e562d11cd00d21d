"""MinAtar as herd runs it (herd/envs/minatar.py): ids, observations, truncation, frames,
and one-line errors; the shared contract is in test_contract.py."""
import importlib.util

import numpy as np
import pytest

from herd.envs import EnvError, EnvSpec, describe_env, env_kind, make_env
from herd.envs.minatar import INSTALL_HINT

GAMES_BY_ID = {"Breakout": "breakout", "Seaquest": "seaquest"}
GAMES = {"Breakout": (4, 3), "Seaquest": (10, 6), "SpaceInvaders": (6, 4), "Freeway": (7, 3), "Asterix": (4, 5)}


@pytest.mark.parametrize("game", GAMES)
def test_every_game_channel_first_with_its_minimal_action_set(game):
    channels, actions = GAMES[game]
    assert describe_env(f"MinAtar/{game}-v1") == EnvSpec("minatar", (channels, 10, 10), "float32", actions, 27000)
    assert describe_env(f"MinAtar/{game}-v0").num_actions == 6               # v0: all six actions


def test_observation_is_the_package_state_channel_first():
    env = make_env("MinAtar/Breakout-v1", seed=3)
    obs, _ = env.reset()
    state = env.unwrapped.game.state()                                      # [10, 10, C] bool, the game's own
    np.testing.assert_array_equal(obs, state.transpose(2, 0, 1).astype(np.float32))
    assert set(np.unique(obs)) <= {0.0, 1.0} and obs.sum() > 0             # the bricks, the paddle, the ball


def test_time_limit_truncates_without_terminating():
    env = make_env("MinAtar/Freeway-v1", seed=0, max_episode_steps=25)      # Freeway's chicken never dies
    env.reset()
    for step in range(25):
        _, _, terminated, truncated, info = env.step(1)
        assert not terminated and truncated == (step == 24)
    assert info["episode_length"] == 25


def test_rgb_frames_for_test_mode_videos():
    env = make_env("MinAtar/Seaquest-v1", seed=0, render_mode="rgb_array")
    env.reset()
    frame = env.render()
    assert frame.shape == (160, 160, 3) and frame.dtype == np.uint8 and frame.max() > 0


@pytest.mark.parametrize("env_id, words", [
    ("MinAtar/Pong-v1", ["unknown MinAtar environment", "Breakout", "SpaceInvaders"]),
    ("minatar/breakout-v1", ["did you mean MinAtar/Breakout-v1"]),
    ("MinAtar/Breakout-v5", ["did you mean MinAtar/Breakout-v"]),
])
def test_bad_ids_are_one_line_env_errors(env_id, words):
    with pytest.raises(EnvError) as caught:
        env_kind(env_id)
    assert "\n" not in str(caught.value) and all(word in str(caught.value) for word in words)


def test_missing_package_names_the_extra(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "minatar" else real(name, *a))
    with pytest.raises(EnvError) as caught:
        describe_env("MinAtar/Breakout-v1")
    assert str(caught.value) == f"environment 'MinAtar/Breakout-v1' needs the minatar package: {INSTALL_HINT}"


@pytest.mark.parametrize("game", ["Breakout", "Seaquest"])
def test_same_games_as_the_package_environment(game):
    """herd loads the game modules itself (no matplotlib in actors); the games, sticky
    actions and ramping must still be exactly the package's Environment's."""
    from minatar import Environment
    reference = Environment(GAMES_BY_ID[game], sticky_action_prob=0.1, difficulty_ramping=True)
    reference.seed(11)
    reference.reset()
    env = make_env(f"MinAtar/{game}-v0", seed=11)                          # v0: the package's six actions
    obs, _ = env.reset()
    rng = np.random.default_rng(0)
    for _ in range(400):
        np.testing.assert_array_equal(obs, reference.state().transpose(2, 0, 1))
        action = int(rng.integers(6))
        obs, reward, terminated, _, _ = env.step(action)
        assert (reward, terminated) == tuple(map(float, reference.act(action)))
        if terminated:
            obs, _ = env.reset()
            reference.reset()
