"""The CUDA server's copies (herd/inference/device.py DevicePath), run on the CPU (and on a
GPU where there is one): a batch crosses between the shared areas and the device as one
copy per field each way, whatever the number of clients in it; its answers equal the
server's CPU path; clients in the copied span that did not ask keep their last answers
byte for byte; an LSTM core's states go back only to the clients that asked."""
from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
import torch.multiprocessing as mp
from torch.utils._python_dispatch import TorchDispatchMode

from herd.inference import InferenceChannels
from herd.inference.device import DevicePath
from herd.inference.forward import ServerOptions
from herd.inference.records import StepRecords
from herd.inference.server import BatchServer
from herd.models import build_model
from herd.weights import SharedWeights

CLIENTS, ROWS = 8, 4
MLP = dict(network="mlp", obs_shape=(4,), obs_dtype="float32", num_actions=3, feature_size=None)
LSTM = dict(MLP, lstm_size=8)
CONTEXT = mp.get_context("spawn")


class HostAreaCopies(TorchDispatchMode):
    """Counts the ops that read or write the shared areas (the transfers a GPU would make)."""

    def __init__(self, channels: InferenceChannels):
        super().__init__()
        areas = [channels.obs, channels.uniforms, channels.actions, channels.logits, channels.value,
                 channels.features, channels.core_state]
        self.storages = {t.untyped_storage().data_ptr() for t in areas if t is not None}
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        touched = [a for a in (*args, *(kwargs or {}).values()) if isinstance(a, torch.Tensor)]
        self.count += any(t.untyped_storage().data_ptr() in self.storages for t in touched) and \
            func.overloadpacket.__name__ in ("copy_", "index_select", "index_copy_", "_to_copy")
        return func(*args, **(kwargs or {}))


DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"))]


def setup(kwargs: dict, device: str = "cpu", records=None):
    channels = InferenceChannels.for_model(kwargs, CLIENTS, ROWS, context=CONTEXT, with_places=records is not None)
    torch.manual_seed(0)
    weights = SharedWeights(build_model(**kwargs), CONTEXT)
    weights.publish(build_model(**kwargs), version=0)
    server = BatchServer(channels, kwargs, weights, torch.device("cpu"), ServerOptions())   # the CPU path
    model = copy.deepcopy(server.model).to(device)
    path = DevicePath(model, ROWS, server.inputs, server.outputs, torch.device(device), ServerOptions(), records)
    return channels, server, path


def request(channels: InferenceChannels, clients, rows: int, seed: int) -> torch.Tensor:
    """Writes requests of `rows` rows for `clients`; returns the flat rows [n] they fill."""
    rng = np.random.default_rng(seed)
    for c in clients:
        channels.obs[c, :rows] = torch.from_numpy(rng.standard_normal((rows, 4)).astype(np.float32))
        channels.uniforms[c, :rows] = torch.from_numpy(rng.random(rows, dtype=np.float32))
    return torch.tensor([c * ROWS + r for c in clients for r in range(rows)])


def answers(channels: InferenceChannels) -> dict:
    return {"actions": channels.actions.clone(), "logits": channels.logits.clone(), "value": channels.value.clone()}


def mirror(device: str):
    """Where a recording server writes (herd/inference/records.py): room for every row."""
    tensors = {"obs": torch.zeros(1, 1, CLIENTS * ROWS, 4, device=device),
               "action": torch.full((1, 1, CLIENTS * ROWS), -1, device=device)}
    return StepRecords(tensors, 1, CLIENTS * ROWS)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("recording", [False, True], ids=["", "recording"])
@pytest.mark.parametrize("clients, rows", [([0], 4), ([0, 1], 4), ([1, 3, 6], 4), (list(range(CLIENTS)), 4),
                                           ([2, 5], 2)])
def test_a_batch_is_one_copy_per_field_each_way_whatever_its_clients(clients, rows, device, recording):
    """Recording the steps (each row at its own place) adds no copy to or from the shared areas."""
    records = mirror(device) if recording else None
    channels, server, path = setup(MLP, device, records)
    index = request(channels, range(CLIENTS), ROWS, seed=1)
    places = np.stack([index.numpy(), index.numpy()], axis=1) if recording else None       # [N, 2]
    path.finish(range(CLIENTS), [ROWS] * CLIENTS, index,
                *path.launch(np.arange(CLIENTS), [ROWS] * CLIENTS, index, places))
    before = answers(channels)
    index = request(channels, clients, rows, seed=2)
    places = np.stack([index.numpy(), index.numpy()], axis=1) if recording else None
    with HostAreaCopies(channels) as copies:
        results, event = path.launch(np.asarray(clients), [rows] * len(clients), index, places)
        path.finish(clients, [rows] * len(clients), index, results, event)
    if recording:                                            # the rows asked, each at its place
        assert torch.equal(records.tensors["obs"][0, 0, index].cpu(), channels.obs.view(-1, 4)[index])
        assert torch.equal(records.tensors["action"][0, 0, index].cpu(), channels.actions.view(-1)[index])
    inputs, outputs = len(server.inputs), len(server.outputs)
    assert copies.count == inputs + outputs, (copies.count, inputs, outputs)
    # The same answers as the CPU path for the rows asked; every other row as it was.
    after = answers(channels)
    expected = server.forward({name: source.index_select(0, index) for name, source in server.inputs.items()})
    asked = torch.zeros(CLIENTS * ROWS, dtype=torch.bool)
    asked[index] = True
    for name in after:
        flat = after[name].reshape(CLIENTS * ROWS, -1)
        torch.testing.assert_close(flat[index], expected[name].reshape(len(index), -1))
        assert torch.equal(flat[~asked], before[name].reshape(CLIENTS * ROWS, -1)[~asked]), name


def test_an_lstm_core_s_states_go_back_only_to_the_clients_that_asked():
    """A client writes its rows' states into the area before it asks: a span copy back
    would overwrite those of a client between two askers that is preparing its request.
    (On the CPU only: on a GPU the client's write would race the asynchronous copies.)"""
    channels, server, path = setup(LSTM)
    index = request(channels, [1, 3], ROWS, seed=3)
    channels.core_state[2] = 7.0
    # Client 2 writes its next request's states while the batch computes (after its span went in).
    unroll = path.model.unroll

    def unroll_while_client_2_writes(*args, **kwargs):
        channels.core_state[2].fill_(9.0)
        return unroll(*args, **kwargs)
    path.model.unroll = unroll_while_client_2_writes
    path.finish([1, 3], [ROWS, ROWS], index, *path.launch(np.array([1, 3]), [ROWS, ROWS], index))
    assert torch.equal(channels.core_state[2], torch.full_like(channels.core_state[2], 9.0))
    for c in (1, 3):                                     # the askers got their states after the step
        assert not torch.equal(channels.core_state[c], torch.zeros_like(channels.core_state[c]))


def test_graphs_are_kept_only_for_the_sizes_whose_replay_measured_faster():
    from herd.inference.device import faster_replayed, seconds_per_call
    assert faster_replayed({8: (1e-5, 2e-5), 16: (3e-5, 2e-5), 32: (2e-5, 2e-5), 64: (1e-5, 9e-5)}) == [8, 64]
    calls, synced = [], []
    per_call = seconds_per_call(lambda: calls.append(1), calls=7, synchronize=lambda: synced.append(len(calls)))
    assert len(calls) == 10 and synced == [3, 10] and per_call >= 0     # 3 warm-up calls, then the 7 timed
