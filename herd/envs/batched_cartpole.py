"""The `numpy` env backend: gymnasium's CartPole (v0, v1) for all of an actor's E
environments at once, one array operation per step instead of E steps through eight
wrappers (15 us of CPU per env step on a 2-core Xeon, most of it Python calls, against 4
us here: benchmarks/env_backends.py --env CartPole-v1).

It is the task the gymnasium backend runs under herd's make_env, not an approximation: the
same equations of motion in the same order of float64 operations, the same termination
thresholds and time limit, a reward of 1 per step clipped and scaled as herd.envs.wrappers
does, the raw score and length of each game, and same-step autoreset. Env i draws its
starting states from the generator CartPoleEnv.reset(seed=seed + i) makes, in the same
order, so under the same actions both backends give the same observations, rewards, ends
and scores (tests/envs/test_batched_cartpole.py)."""
from __future__ import annotations

import math

import numpy as np
from gymnasium.utils import seeding

from herd.envs.masking import velocity_indices
from herd.envs.registry import EnvError, episode_step_limit, import_env_module, registered_spec
from herd.envs.wrappers import clip_reward
from herd.inputs import quoted
from herd.interfaces import EnvBatch

CARTPOLE_ENTRY_POINT = "gymnasium.envs.classic_control.cartpole:CartPoleEnv"

# gymnasium's CartPoleEnv's constants.
GRAVITY, MASS_CART, MASS_POLE, HALF_LENGTH, FORCE, TAU = 9.8, 1.0, 0.1, 0.5, 10.0, 0.02
TOTAL_MASS = MASS_POLE + MASS_CART
POLE_MASS_LENGTH = MASS_POLE * HALF_LENGTH
THETA_LIMIT = 12 * 2 * math.pi / 360           # radians; beyond it the pole has fallen
X_LIMIT = 2.4                                  # metres; beyond it the cart has left the track
START_LOW, START_HIGH = -0.05, 0.05            # each state entry starts uniform in this range


def runs_batched(env_id: str) -> bool:
    """True for the registered ids whose env is gymnasium's CartPoleEnv without arguments."""
    try:
        spec = registered_spec(import_env_module(env_id))
    except EnvError:
        return False
    return spec.entry_point == CARTPOLE_ENTRY_POINT and not spec.kwargs and not spec.additional_wrappers


def check_runs_batched(env_id: str) -> None:
    if not runs_batched(env_id):
        raise EnvError(f"--env_backend=numpy runs gymnasium's CartPole-v0 and CartPole-v1, not {quoted(env_id)}: "
                       f"use gymnasium or auto")


class BatchedCartPole:
    def __init__(self, env_id: str, num_envs: int, *, seed: int, max_episode_steps: int | None = None,
                 clip_rewards: bool = False, reward_clipping_method: str = "abs_one_sign",
                 reward_scale: float = 1.0, hide_velocity: bool = False, skipped_frames: int = 4,
                 **atari_options):
        """Env i is seeded with seed + i. The keywords are make_env's; its Atari-only options
        are ignored here as make_env ignores them for vector tasks."""
        check_runs_batched(env_id)
        E = self.num_envs = self.batch_size = num_envs
        self.env_ids = np.arange(E)                   # every batch holds all E, in order
        self.time_limit = episode_step_limit(env_id, skipped_frames, max_episode_steps)
        raw = clip_reward(1.0, reward_clipping_method) if clip_rewards else 1.0
        self.reward = np.float32(float(raw) * float(reward_scale))   # every step's reward, as the wrappers give it
        hidden = velocity_indices(env_id) if hide_velocity else ()
        self.shown = np.setdiff1d(np.arange(4), np.asarray(hidden, dtype=np.int64))
        self.generators = [seeding.np_random(seed + i)[0] for i in range(E)]
        self.state = np.zeros((4, E))                 # [4, E] float64: x, x_dot, theta, theta_dot
        self.steps = np.zeros(E, np.int64)            # steps into each game
        self.actions: np.ndarray | None = None

    def redraw(self, envs) -> None:
        """New starting states for `envs`, each from its own generator (one reset each)."""
        for e in envs:
            self.state[:, e] = self.generators[e].uniform(low=START_LOW, high=START_HIGH, size=(4,))
        self.steps[envs] = 0

    def observations(self) -> np.ndarray:
        return self.state[self.shown].T.astype(np.float32)   # [E, D]

    def start(self) -> EnvBatch:
        E = self.num_envs
        self.redraw(range(E))
        return EnvBatch(self.env_ids, self.observations(), np.zeros(E, np.float32), np.zeros(E, np.bool_))

    def send(self, actions: np.ndarray) -> None:
        self.actions = np.asarray(actions)

    def recv(self) -> EnvBatch:
        """Steps every env with the actions of the last send(), restarting ended games."""
        x, x_dot, theta, theta_dot = self.state
        force = np.where(self.actions == 1, FORCE, -FORCE)
        cos, sin = np.cos(theta), np.sin(theta)
        # The operations and their order are CartPoleEnv.step's (Euler integration).
        temp = (force + POLE_MASS_LENGTH * np.square(theta_dot) * sin) / TOTAL_MASS
        theta_acc = (GRAVITY * sin - cos * temp) / (HALF_LENGTH * (4.0 / 3.0 - MASS_POLE * np.square(cos) / TOTAL_MASS))
        x_acc = temp - POLE_MASS_LENGTH * theta_acc * cos / TOTAL_MASS
        self.state = np.stack((x + TAU * x_dot, x_dot + TAU * x_acc, theta + TAU * theta_dot,
                               theta_dot + TAU * theta_acc))
        x, theta = self.state[0], self.state[2]
        self.steps += 1
        terminated = (x < -X_LIMIT) | (x > X_LIMIT) | (theta < -THETA_LIMIT) | (theta > THETA_LIMIT)
        truncated = self.steps >= self.time_limit if self.time_limit else np.zeros_like(terminated)
        done = terminated | truncated
        E = self.num_envs
        batch = EnvBatch(self.env_ids, obs=None, reward=np.full(E, self.reward, np.float32), done=done)
        ended = np.flatnonzero(done)
        if len(ended):
            final = self.observations()
            for e in ended:
                # Every step scores 1: a game's raw score is its length.
                batch.finished.append((float(self.steps[e]), int(self.steps[e])))
                if truncated[e] and not terminated[e]:
                    batch.truncated_obs[int(e)] = final[e]
            self.redraw(ended)
        batch.obs = self.observations()
        return batch

    def close(self) -> None:
        self.generators = []
