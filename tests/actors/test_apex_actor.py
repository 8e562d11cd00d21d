"""Ape-X's actor side: the actor's index reaches its epsilon, and every rollout leaves the
actor with its initial priorities written, before the learner hears of it."""
import multiprocessing
import threading

import numpy as np
import pytest
import torch

from herd.actors.actor import act_and_collect
from herd.actors.policy import LocalPolicy
from herd.actors.rollout import RolloutWriter
from herd.algos import APEX, trajectory_layout
from herd.ops.returns import trajectory_priorities
from herd.models import build_model
from herd.store import TrajectorySlots
from herd.weights import SharedWeights

from actors.test_rollout import CountingEnvs   # its fake envs: counting observations, ends, truncations

T, E = 4, 5
MODEL = dict(network="mlp", obs_shape=(2,), obs_dtype="float32", num_actions=3, feature_size=None,
             head="dueling_q")
OPTIONS = {"epsilon": 0.4, "alpha": 7.0, "gamma": 0.9, "n_step": 3}


def policy(actor_id: int, num_actors: int, algorithm: str = "apex") -> LocalPolicy:
    torch.manual_seed(0)
    model = build_model(**MODEL)
    weights = SharedWeights(model, multiprocessing.get_context("spawn"))
    weights.publish(model)
    return LocalPolicy(MODEL, weights, seed=1, algorithm=algorithm, actor_id=actor_id, num_actors=num_actors,
                       options=OPTIONS)


@pytest.mark.parametrize("actor_id, expected", [(0, 0.4), (1, 0.4 ** 4.5), (2, 0.4 ** 8)])
def test_the_actor_index_sets_its_epsilon(actor_id, expected):
    assert policy(actor_id, 3).act_kwargs == {"epsilon": pytest.approx(expected)}


def test_impala_actors_have_nothing_to_finish():
    assert policy(0, 2, algorithm="impala").finish_rollout is None


def test_each_sent_rollout_carries_the_actors_priorities():
    layout = trajectory_layout(APEX, T, (2,), "float32", 3, 8)
    slots = TrajectorySlots(layout, 4, E)
    free, copies = list(range(4)), []
    stop = threading.Event()
    actor = policy(0, 1)

    def send(delivery):
        copies.append({name: view.copy() for name, view in slots.views(delivery.slot).items()})
        slots.reset(delivery.slot)
        free.append(delivery.slot)
        if len(copies) == 3:
            stop.set()

    writer = RolloutWriter(slots.views, lambda: free.pop(0), T, E)
    act_and_collect(CountingEnvs(E), actor, writer, send, stop)
    for data in copies:
        with torch.no_grad():
            q = actor.model(torch.from_numpy(data["obs"])).logits                  # [T+1, E, A]
        assert np.allclose(data["q_max"], q[:T].max(-1).values.numpy(), atol=1e-6)
        expected = trajectory_priorities(torch.from_numpy(data["q_taken"]), torch.from_numpy(data["q_max"]),
                                         q[T].max(-1).values, torch.from_numpy(data["reward"]),
                                         torch.from_numpy(data["done"]), torch.from_numpy(data["trunc_value"]),
                                         OPTIONS["gamma"], OPTIONS["n_step"])
        assert np.all(np.isfinite(data["priority"])) and np.allclose(data["priority"], expected.numpy(), atol=1e-5)
