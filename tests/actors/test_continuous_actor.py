"""An actor on a continuous task (real Pendulum envs, the local policy, shared-memory
slots): actions [T, E, A] float32 sampled from the Gaussian the slot records beside them."""
import threading

import numpy as np
import torch

from herd.actors.actor import act_and_collect
from herd.actors.policy import LocalPolicy
from herd.actors.rollout import RolloutWriter
from herd.algos.impala import impala_layout
from herd.envs.gym_envs import GymEnvs
from herd.models import build_model
from herd.ops.distributions import DiagGaussian
from herd.store import TrajectorySlots
from herd.weights import SharedWeights

T, E = 8, 3
MODEL = dict(network="auto", obs_shape=(3,), obs_dtype="float32", num_actions=1, feature_size=16,
             hidden_sizes=(8,), action_distribution="gaussian", initial_log_std=-1.0, normalize_observations=True)


def one_rollout(seed: int) -> dict:
    torch.manual_seed(0)
    layout = impala_layout(T, (3,), "float32", 1, 16, action_distribution="gaussian")
    slots = TrajectorySlots(layout, 1, E)
    policy = LocalPolicy(MODEL, SharedWeights(build_model(**MODEL)), seed=seed)
    envs = GymEnvs("Pendulum-v1", E, seed=0, clip_rewards=False)
    stop, delivered = threading.Event(), []
    writer = RolloutWriter(slots.views, lambda: 0, T, E)
    act_and_collect(envs, policy, writer, lambda d: (delivered.append(d), stop.set()), stop)
    envs.close()
    return {name: array.copy() for name, array in slots.views(delivered[0].slot).items()}


def test_the_slot_holds_gaussian_actions_and_their_distribution():
    views = one_rollout(seed=1)
    assert views["action"].shape == (T, E, 1) and views["action"].dtype == np.float32
    assert views["behaviour_mean"].shape == views["behaviour_log_std"].shape == (T, E, 1)
    assert np.all(views["behaviour_log_std"] == np.float32(-1.0))
    for name in ("obs", "action", "reward", "behaviour_mean", "behaviour_value", "features"):
        assert np.isfinite(views[name]).all(), name
    # The stored action is the unclipped sample: its log-probability under the stored
    # Gaussian is finite and typical of a standard normal draw (|z| rarely beyond 4).
    z = (views["action"] - views["behaviour_mean"]) / np.exp(views["behaviour_log_std"])
    assert np.abs(z).max() < 5 and np.abs(z).std() > 0.1
    params = torch.from_numpy(np.concatenate([views["behaviour_mean"], views["behaviour_log_std"]], -1))
    assert torch.isfinite(DiagGaussian.log_prob(params, torch.from_numpy(views["action"]))).all()
    assert np.all(views["reward"] <= 0)                                    # Pendulum's rewards, raw


def test_the_actor_seed_decides_the_actions():
    first, again, other = one_rollout(seed=1), one_rollout(seed=1), one_rollout(seed=2)
    np.testing.assert_array_equal(first["action"], again["action"])
    assert not np.array_equal(first["action"], other["action"])
