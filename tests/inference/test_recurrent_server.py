"""The inference server with an LSTM model (--use_lstm, --actor_inference=server): each
client keeps its environments' states and sends them with its rows, so over a sequence of
steps (with resets, subsets of envs, value requests and another client interleaved) every
answer equals what an actor's own LocalPolicy computes with the same weights."""
from __future__ import annotations

import threading

import numpy as np
import torch
import torch.multiprocessing as mp

from herd.actors.policy import LocalPolicy
from herd.inference import InferenceChannels, InferenceClient
from herd.inference.server import BatchServer, serve_forever
from herd.models import build_model
from herd.models.core import CORE_STATE
from herd.weights import SharedWeights

MODEL = dict(network="mlp", obs_shape=(3,), obs_dtype="float32", num_actions=2, feature_size=None, lstm_size=8)
E = 4


def test_clients_carry_each_envs_state_through_the_server():
    torch.manual_seed(0)
    context = mp.get_context("spawn")
    channels = InferenceChannels.for_model(MODEL, num_clients=2, max_rows=E, context=context)
    assert channels.core_state is not None and tuple(channels.core_state.shape) == (2, E, 2, 1, 16)   # policy + value streams
    model = build_model(**MODEL)
    weights = SharedWeights(model, context)
    stop = threading.Event()
    server = threading.Thread(target=serve_forever, daemon=True,
                              args=(BatchServer(channels, MODEL, weights, torch.device("cpu")), channels, stop, 0.0))
    server.start()
    try:
        clients = [InferenceClient(channels, i, stop=stop, seed=i) for i in range(2)]
        locals_ = [LocalPolicy(MODEL, weights, seed=i, num_envs=E) for i in range(2)]
        rng = np.random.default_rng(0)
        nonzero_starts = 0
        for step in range(12):
            for client, local in zip(clients, locals_):
                env_ids = np.sort(rng.choice(E, size=int(rng.integers(1, E + 1)), replace=False))
                obs = rng.standard_normal((len(env_ids), 3)).astype(np.float32)
                reset = rng.random(len(env_ids)) < 0.2
                served, mine = client.act(obs, env_ids, reset), local.act(obs, env_ids, reset)
                for name in ("behaviour_logits", "behaviour_value", "features", CORE_STATE):
                    np.testing.assert_allclose(served.fields[name], mine.fields[name], rtol=1e-5, atol=1e-5)
                nonzero_starts += int(np.count_nonzero(np.abs(mine.fields[CORE_STATE]).sum(axis=(1, 2, 3))))
                if step % 3 == 0:   # a value request (truncated episode) must leave the states alone
                    np.testing.assert_allclose(client.value(obs, env_ids), local.value(obs, env_ids),
                                               rtol=1e-5, atol=1e-5)
        assert nonzero_starts > 0          # states were carried, not just zeros compared with zeros
    finally:
        stop.set()
        server.join(5.0)
    assert not server.is_alive()
