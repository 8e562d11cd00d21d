"""The inference server's batched path run by the actor itself (--actor_inference=in_actor,
herd/inference/in_actor.py), against an actor served by a real server (in a thread):
real CartPole environments, cut by a time limit so that value requests come between the
act requests.

The stated equality: on the CPU the trajectories are the same, bit for bit (the same
uniforms, the same forward pass over the same rows, the same sampling), single-buffered,
recording the steps and with an LSTM core; a double-buffered actor's logits and values up
to the last bits (a server thread may batch its two lanes together, the actor never does).
On a GPU the same trajectories, logits and values up to the device's rounding."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from herd.inference import ServerOptions
from herd.inference.in_actor import InActorInference
from herd.inference.routing import RoutedClient
from herd.models import build_model
from herd.weights import SharedWeights
from served_actors import CONTEXT, LSTM, MLP, RECORD, ROLLOUTS, trajectories

ENV = {"max_episode_steps": 12}           # truncations: value requests between the act requests
CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def assert_same(a: list, b: list, close: tuple = (), rtol: float = 0.0) -> None:
    assert len(a) == len(b) == ROLLOUTS
    for x, y in zip(a, b):
        assert set(x) == set(y)
        for name in x:
            if name in close:
                np.testing.assert_allclose(x[name], y[name], rtol=rtol, atol=rtol, err_msg=name)
            else:
                np.testing.assert_array_equal(x[name], y[name], err_msg=name)


@pytest.mark.parametrize("double, recording, model", [(False, False, MLP), (False, True, MLP), (False, False, LSTM),
                                                      (True, False, MLP)],
                         ids=["single", "recording", "lstm", "double-buffered"])
def test_an_actor_running_the_servers_path_makes_the_served_trajectories(double, recording, model):
    """Catches an inline ring that answers before the batch is finished (sentinel logits,
    action -1), uniforms drawn twice or from another seed, value requests answered
    as act requests, recorded rows left unwritten, and LSTM states not carried."""
    weights = SharedWeights(build_model(**model), CONTEXT)
    served = trajectories(weights, double, recording=recording, model=model, env=ENV)
    own = trajectories(weights, double, recording=recording, model=model, env=ENV, in_actor="cpu")
    assert sum((r["trunc_value"] != 0).sum() for r in served) > 0          # value requests were made
    actions = np.concatenate([r["action"].ravel() for r in served])
    assert 0.2 < actions.mean() < 0.8                                       # a spread-out policy: draws matter
    assert_same(served, own, close=(*RECORD, "trunc_value") if double else (), rtol=1e-5)
    assert not any(np.isnan(r["behaviour_logits"]).any() for r in own)


def test_the_actor_acts_with_newly_published_weights_at_its_next_request():
    """Catches an inline server that never pulls (or pulls only at its start): the request
    after a publish acts with that version and its weights."""
    model, other = build_model(**MLP), build_model(**MLP)
    with torch.no_grad():
        for p in other.parameters():
            p.add_(0.5)
    weights = SharedWeights(model, CONTEXT)
    weights.publish(model, version=0)
    way = InActorInference(MLP, weights, "cpu", ServerOptions(), rows=3, features=False).start()
    policy = RoutedClient(way, seed=1, record=RECORD)
    obs = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)
    first = policy.act(obs)
    weights.publish(other, version=7)
    second = policy.act(obs)
    with torch.no_grad():
        expected = other(torch.from_numpy(obs).unsqueeze(0)).logits[0].numpy()
    assert (first.version, second.version) == (0, 7)
    np.testing.assert_allclose(second.fields["behaviour_logits"], expected, rtol=1e-6)
    assert not np.allclose(first.fields["behaviour_logits"], expected)


@CUDA
@pytest.mark.parametrize("double", [False, True], ids=["single", "double-buffered"])
def test_an_actor_running_the_servers_path_on_cuda_makes_the_served_trajectories(double):
    weights = SharedWeights(build_model(**MLP), CONTEXT)
    served = trajectories(weights, double, model=MLP, env=ENV)
    own = trajectories(weights, double, model=MLP, env=ENV, in_actor="cuda")
    assert_same(served, own, close=(*RECORD, "trunc_value"), rtol=1e-4)
