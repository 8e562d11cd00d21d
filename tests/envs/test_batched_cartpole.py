"""The numpy backend (herd/envs/batched_cartpole.py) is the gymnasium backend's CartPole,
batched: under the same actions both give bit-identical observations, rewards, ends,
truncated final observations and game scores, for every option a vector task takes; and
`--env_backend` picks it only where it runs the same task."""
import re

import gymnasium as gym
import numpy as np
import pytest

from herd.envs.actor_envs import make_actor_envs, resolve_env_backend
from herd.envs.batched_cartpole import BatchedCartPole
from herd.envs.gym_envs import GymEnvs
from herd.errors import EnvError
from herd_testing import only_run, run_cli

OPTIONS = [
    {"reward_scale": 0.1},                                              # the vector profile's
    {"max_episode_steps": 40},                                          # many games end truncated
    {"hide_velocity": True, "max_episode_steps": 20},
    {"clip_rewards": True, "reward_clipping_method": "soft_asymmetric"},
]


def steps_alike(env_id: str, options: dict, steps: int = 1500, envs: int = 16, seed: int = 7) -> dict:
    """Steps both backends with the same random actions, asserting each batch equal; counts."""
    gym_envs, batched = GymEnvs(env_id, envs, seed=seed, **options), BatchedCartPole(env_id, envs, seed=seed, **options)
    expected, got = gym_envs.start(), batched.start()
    assert np.array_equal(expected.obs, got.obs) and got.obs.dtype == np.float32
    rng = np.random.default_rng(0)
    counts = {"games": 0, "truncated": 0}
    for t in range(steps):
        actions = rng.integers(0, 2, envs)
        gym_envs.send(actions), batched.send(actions)
        expected, got = gym_envs.recv(), batched.recv()
        assert np.array_equal(expected.obs, got.obs), f"step {t}"
        assert np.array_equal(expected.reward, got.reward) and got.reward.dtype == np.float32, f"step {t}"
        assert np.array_equal(expected.done, got.done), f"step {t}"
        assert expected.finished == got.finished, f"step {t}"
        assert expected.truncated_obs.keys() == got.truncated_obs.keys(), f"step {t}"
        assert all(np.array_equal(expected.truncated_obs[k], got.truncated_obs[k]) for k in got.truncated_obs)
        counts["games"] += len(got.finished)
        counts["truncated"] += len(got.truncated_obs)
    gym_envs.close(), batched.close()
    return counts


@pytest.mark.parametrize("options", OPTIONS, ids=lambda o: ",".join(o))
def test_the_batch_steps_as_gymnasiums_cartpole(options):
    counts = steps_alike("CartPole-v1", options)
    assert counts["games"] > 500                            # many resets, each from its env's own generator
    if options.get("max_episode_steps"):
        assert counts["truncated"] > 50                     # and the time limit's ends, with their final frames


def test_cartpole_v0_keeps_its_own_time_limit():
    # v0 ends games at 200 steps where v1 allows 500: a policy that keeps the pole up meets it.
    env = BatchedCartPole("CartPole-v0", 4, seed=0)
    env.start()
    for step in range(1, 201):
        theta, theta_dot = env.state[2], env.state[3]
        env.send((theta + 0.5 * theta_dot > 0).astype(np.int64))   # push towards the side the pole falls
        batch = env.recv()
    assert batch.done.all() and batch.finished == [(200.0, 200)] * 4 and len(batch.truncated_obs) == 4


def test_auto_runs_cartpole_batched_and_other_tasks_in_gymnasium():
    assert resolve_env_backend("auto", "CartPole-v1") == "numpy"
    assert resolve_env_backend("auto", "CartPole-v0") == "numpy"
    assert resolve_env_backend("auto", "Acrobot-v1") == "gymnasium"
    assert resolve_env_backend("gymnasium", "CartPole-v1") == "gymnasium"   # asked for: runs as asked


def test_a_cartpole_with_other_arguments_is_not_batched():
    # Registered with the same class but another reward: not the task the batch computes.
    env_id = "herd_test/CartPoleSuttonBarto-v1"
    if env_id not in gym.registry:
        gym.register(env_id, entry_point="gymnasium.envs.classic_control.cartpole:CartPoleEnv",
                     kwargs={"sutton_barto_reward": True}, max_episode_steps=500)
    assert resolve_env_backend("auto", env_id) == "gymnasium"
    with pytest.raises(EnvError, match="CartPole-v0 and CartPole-v1"):
        resolve_env_backend("numpy", env_id)


def test_numpy_on_another_task_is_refused_in_one_line():
    with pytest.raises(EnvError) as caught:
        resolve_env_backend("numpy", "Acrobot-v1")
    assert "\n" not in str(caught.value) and "Acrobot-v1" in str(caught.value)
    with pytest.raises(EnvError):
        make_actor_envs("numpy", "Acrobot-v1", 2, seed=0, env_kwargs={})


def test_the_actor_gets_the_batch_with_the_runs_options():
    envs = make_actor_envs("numpy", "CartPole-v1", 3, seed=5, env_kwargs={"reward_scale": 0.1, "skipped_frames": 4})
    assert isinstance(envs, BatchedCartPole) and envs.num_envs == envs.batch_size == 3
    envs.start()
    envs.send(np.zeros(3, np.int64))
    assert np.allclose(envs.recv().reward, 0.1)


def test_the_log_names_the_backend_a_run_steps(tmp_path):
    result = run_cli(["train", "--env=CartPole-v1", "--environment_max_steps=2000", "--tensorboard=False"], tmp_path,
                     timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    log = (only_run(tmp_path) / "log.txt").read_text()
    assert re.search(r"actors: \d+ x 16 environments, stepped by herd's numpy batch of gymnasium's CartPole", log)
