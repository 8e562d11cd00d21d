"""--hide_velocity: a memory task made from a fully observed one, by removing the velocity
components from a vector observation. The agent must then infer them from consecutive
observations (differences of positions and angles), which a feed-forward policy cannot do
and a recurrent one can: the standard test of a recurrent core (e.g. CartPole with only
cart position and pole angle visible).

Which entries are velocities is a fact of each environment, so herd keeps a table of the
ones it knows rather than guessing; any other environment is refused with one line."""
from __future__ import annotations

import gymnasium as gym
import numpy as np

from herd.errors import EnvError
from herd.inputs import quoted

# env id -> indices of the velocity entries in its observation vector (gymnasium's docs).
VELOCITY_INDICES: dict[str, tuple[int, ...]] = {
    "CartPole-v0": (1, 3),                 # cart position, CART VELOCITY, pole angle, POLE ANGULAR VELOCITY
    "CartPole-v1": (1, 3),
    "MountainCar-v0": (1,),                # position, VELOCITY
    "MountainCarContinuous-v0": (1,),
    "Acrobot-v1": (4, 5),                  # cos/sin of both joint angles, then both ANGULAR VELOCITIES
    "Pendulum-v1": (2,),                   # cos, sin of the angle, ANGULAR VELOCITY
    "LunarLander-v3": (2, 3, 5),           # x, y, VX, VY, angle, ANGULAR VELOCITY, leg contacts
}


def velocity_indices(env_id: str) -> tuple[int, ...]:
    if env_id not in VELOCITY_INDICES:
        raise EnvError(f"--hide_velocity: herd does not know which observation entries of {quoted(env_id)} are "
                       f"velocities (it knows {', '.join(VELOCITY_INDICES)})")
    return VELOCITY_INDICES[env_id]


class HideObservationEntries(gym.ObservationWrapper):
    """Drops the entries `indices` of a 1-D Box observation: [D] -> [D - len(indices)]."""

    def __init__(self, env: gym.Env, indices: tuple[int, ...]):
        super().__init__(env)
        space = env.observation_space
        keep = np.setdiff1d(np.arange(space.shape[0]), np.asarray(indices, dtype=np.int64))
        self.keep = keep
        self.observation_space = gym.spaces.Box(space.low[keep], space.high[keep], (len(keep),), space.dtype)

    def observation(self, obs):
        return np.asarray(obs)[self.keep]


def hide_velocity(env: gym.Env, env_id: str) -> gym.Env:
    return HideObservationEntries(env, velocity_indices(env_id))
