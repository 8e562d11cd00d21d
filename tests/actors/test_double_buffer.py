"""The double-buffered actor (--actor_double_buffer) against the single-buffered one, both
served by a real inference server (in a thread) and stepping real CartPole environments.

The stated difference (herd/actors/double_buffer.py): the two make the same trajectories
(observations, actions, rewards, done flags exactly) and the same behaviour logits and
values up to the last bits, since a forward pass over half the rows rounds differently
from one over all of them."""
from __future__ import annotations

import threading
from contextlib import contextmanager

import numpy as np
import torch
import torch.multiprocessing as mp

from herd.actors.actor import ActorSpec, collect_rollouts
from herd.actors.double_buffer import collect_double_buffered, double_buffered, split
from herd.actors.rollout import RolloutWriter
from herd.algos import IMPALA, trajectory_layout
from herd.envs.actor_envs import make_actor_envs
from herd.inference import InferenceChannels, InferenceClient
from herd.inference.routing import InferenceRoute
from herd.inference.server import BatchServer, serve_forever
from herd.models import build_model
from herd.store import TrajectorySlots
from herd.weights import SharedWeights

MLP = dict(network="mlp", obs_shape=(4,), obs_dtype="float32", num_actions=2, feature_size=None)
CONTEXT = mp.get_context("spawn")
E, T, ROLLOUTS, SEED = 5, 16, 6, 3          # an odd E: halves of 3 and 2
RECORD = ("behaviour_logits", "behaviour_value")


@contextmanager
def served(weights: SharedWeights):
    """A server thread with two clients of E rows: the single actor uses client 0, the
    double-buffered one clients 0 and 1 (its lanes)."""
    torch.manual_seed(0)
    channels = InferenceChannels.for_model(MLP, 2, E, context=CONTEXT, with_features=False)
    stop = threading.Event()
    thread = threading.Thread(target=serve_forever, daemon=True,
                              args=(BatchServer(channels, MLP, weights, torch.device("cpu")), channels, stop, 0.0))
    thread.start()
    try:
        yield channels
    finally:
        stop.set()
        thread.join(5)


def trajectories(double: bool, weights: SharedWeights) -> list[dict]:
    layout = trajectory_layout(IMPALA, T, (4,), "float32", 2, 64, read=RECORD)
    slots = TrajectorySlots(layout, ROLLOUTS + 2, E)
    free = list(range(ROLLOUTS + 2))
    writer = RolloutWriter(slots.views, lambda: free.pop(0), T, E)
    stop = threading.Event()
    spec = ActorSpec(env_id="CartPole-v1", env_kwargs={}, model_kwargs=MLP, envs_per_worker=E, unroll_length=T,
                     seed=SEED, record_fields=RECORD, double_buffer=double)
    with served(weights) as channels:
        if double:
            envs, policy = double_buffered(spec, InferenceRoute(channels, 0, 2), stop, spec.record_fields)
            rollouts = collect_double_buffered(envs, policy, writer, stop)
        else:
            envs = make_actor_envs("gymnasium", "CartPole-v1", E, seed=SEED, env_kwargs={})
            policy = InferenceClient(channels, 0, seed=SEED, record=RECORD)
            rollouts = collect_rollouts(envs, policy, writer, stop)
        out = []
        for delivery in rollouts:
            out.append({name: view.copy() for name, view in slots.views(delivery.slot).items()})
            if len(out) == ROLLOUTS:
                break
        envs.close()
    return out


def test_double_buffered_trajectories_equal_the_single_buffered_ones():
    """Catches halves seeded or numbered unlike the single actor's environments, sampling
    uniforms drawn in another order (actions would differ), rows written to the wrong
    column or step, and slots delivered before both halves filled them."""
    weights = SharedWeights(build_model(**MLP), CONTEXT)
    single, double = trajectories(False, weights), trajectories(True, weights)
    assert len(single) == len(double) == ROLLOUTS
    actions = np.concatenate([r["action"].ravel() for r in single])
    assert 0.2 < actions.mean() < 0.8                    # a spread-out policy: the draws matter
    for a, b in zip(single, double):
        assert set(a) == set(b) == {"obs", "action", "reward", "done", "trunc_value", *RECORD}   # no features
        for name in ("obs", "action", "reward", "done", "trunc_value"):
            np.testing.assert_array_equal(a[name], b[name], err_msg=name)
        for name in RECORD:
            np.testing.assert_allclose(a[name], b[name], rtol=1e-5, atol=1e-6, err_msg=name)
        assert not np.isnan(b["behaviour_logits"]).any()      # every step written


def test_halves_cover_every_environment_once():
    for envs in range(2, 12):
        (first_a, count_a), (first_b, count_b) = split(envs)
        assert first_a == 0 and first_b == count_a and count_a + count_b == envs and count_a - count_b in (0, 1)
