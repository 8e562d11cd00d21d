"""--hide_velocity: CartPole without its velocity entries, the same game otherwise."""
import numpy as np
import pytest

from herd.envs import make_env
from herd.envs.masking import velocity_indices
from herd.errors import EnvError


def test_cartpole_keeps_position_and_angle_of_the_same_game():
    full, hidden = make_env("CartPole-v1", seed=5), make_env("CartPole-v1", seed=5, hide_velocity=True)
    assert hidden.observation_space.shape == (2,) and hidden.observation_space.dtype == np.float32
    obs_full, obs_hidden = full.reset()[0], hidden.reset()[0]
    for step in range(30):
        np.testing.assert_array_equal(obs_hidden, obs_full[[0, 2]])
        action = step % 2
        obs_full, _, done_full, _, _ = full.step(action)
        obs_hidden, _, done_hidden, _, _ = hidden.step(action)
        assert done_full == done_hidden
        if done_full:
            break


def test_envs_whose_velocities_herd_does_not_know_are_refused():
    assert velocity_indices("Acrobot-v1") == (4, 5)
    with pytest.raises(EnvError, match="does not know which observation entries of 'BipedalWalker-v3'"):
        velocity_indices("BipedalWalker-v3")
