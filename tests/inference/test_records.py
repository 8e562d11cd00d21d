"""An inference server that records the steps it acts on (--inference_records,
herd/inference/records.py), against actors that write them themselves: a real server (in
a thread) and real CartPole environments, cut by a time limit so that value requests
(truncated episodes) share batches with act requests.

The stated equality: the trajectories are the same, bit for bit, whether the actor or the
server writes the observations, actions, logits and values (the server writes the very
rows it computed; a double-buffered actor's logits and values up to the last bits, which
depend on how its lanes' requests happen to be batched); and on a device mirror (the GPU path, run here on the CPU device) the
learner's ingested rollout equals the slot's."""
from __future__ import annotations

import json
import threading

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from herd.actors.actor import collect_rollouts
from herd.actors.rollout import RolloutWriter
from herd.device_copies import DeviceCopies
from herd.envs.actor_envs import make_actor_envs
from herd.inference import InferenceChannels, InferenceClient
from herd.inference.device import DevicePath
from herd.inference.forward import ServerOptions
from herd.inference.records import StepRecords, recorded_fields
from herd.inference.server import BatchServer, run_inference_server, serve_forever
from herd.models import build_model
from herd.store import TrajectorySlots, TrajectoryStore
from herd.weights import SharedWeights
from served_actors import CONTEXT, E, LSTM, MLP, RECORD, ROLLOUTS, SEED, T, layout, trajectories

ENV = {"max_episode_steps": 12}           # truncations: value requests between the act requests
OUTPUTS = ("actions", "logits", "value")


@pytest.mark.parametrize("double, model", [(False, MLP), (True, MLP), (False, LSTM)],
                         ids=["single", "double-buffered", "lstm"])
def test_a_server_that_records_writes_the_trajectories_the_actor_would(double, model):
    """Catches a place off by a step, an env or a slot, a value request recorded as a
    step, a row recorded from another row's outputs, and a field left to no one (its
    sentinels would stay: NaN logits, action -1, zero observations). With an LSTM core
    the actor still writes each trajectory's start state, which the server does not hold."""
    weights = SharedWeights(build_model(**model), CONTEXT)
    written = trajectories(weights, double, recording=False, model=model, env=ENV)
    recorded = trajectories(weights, double, recording=True, model=model, env=ENV)
    assert len(written) == len(recorded) == ROLLOUTS
    truncated = sum((r["trunc_value"] != 0).sum() for r in written)
    assert truncated > 0                                  # value requests were made
    actions = np.concatenate([r["action"].ravel() for r in written])
    assert 0.2 < actions.mean() < 0.8                     # a spread-out policy: the draws matter
    core = {"core_state"} if model is LSTM else set()
    for a, b in zip(written, recorded):
        assert set(a) == set(b) == {"obs", "action", "reward", "done", "trunc_value", *RECORD, *core}
        if core:
            assert not np.isnan(b["core_state"]).any()         # the start states, written by the actor
        for name in a:
            if double and name in (*RECORD, "trunc_value"):     # values the server computed
                # Two lanes' requests batched together or apart, as timing has it, round
                # the last bits differently (herd/actors/double_buffer.py); one lane: exact.
                np.testing.assert_allclose(a[name], b[name], rtol=1e-5, atol=1e-6, err_msg=name)
            else:
                np.testing.assert_array_equal(a[name], b[name], err_msg=name)


def test_the_actor_leaves_the_recorded_fields_to_the_server():
    """With a server that records nothing (the places written, the store not given), the
    recorded fields keep their sentinels: the actor really leaves them out."""
    slots = TrajectorySlots(layout(), 3, E)
    fields = recorded_fields(slots.layout, OUTPUTS)
    free = [0, 1, 2]
    writer = RolloutWriter(slots.views, lambda: free.pop(0), T, E, fields)
    weights = SharedWeights(build_model(**MLP), CONTEXT)
    channels = InferenceChannels.for_model(MLP, 1, E, context=CONTEXT, with_features=False, with_places=True)
    stop = threading.Event()
    server = BatchServer(channels, MLP, weights, torch.device("cpu"))          # no records
    thread = threading.Thread(target=serve_forever, daemon=True, args=(server, channels, stop, 0.0))
    thread.start()
    envs = make_actor_envs("gymnasium", "CartPole-v1", E, seed=SEED, env_kwargs={})
    policy = InferenceClient(channels, 0, seed=SEED, record=(), place_of=writer.places)
    delivery = next(collect_rollouts(envs, policy, writer, threading.Event()))
    stop.set()
    thread.join(5)
    envs.close()
    views = slots.views(delivery.slot)
    assert (views["action"] == -1).all() and np.isnan(views["behaviour_logits"]).all()
    assert (views["obs"][:T] == 0).all() and (views["obs"][T] != 0).any()    # only the bootstrap frame
    assert not np.isnan(views["reward"]).any()


def test_places_name_each_row_s_slot_step_and_environment():
    slots = TrajectorySlots(layout(), 4, E)
    free = [2, 0]
    writer = RolloutWriter(slots.views, lambda: free.pop(0), T, E, ("obs",))
    writer.step[:] = [3, 3, 15, 0, 7]
    writer.traj[:] = [0, 0, 0, 1, 0]                # env 3 ran ahead into the actor's second slot
    writer.lockstep = False
    places = writer.places(np.array([4, 3, 0]))
    slot_of = {4: 2, 3: 0, 0: 2}
    for (obs_place, step_place), env in zip(places, [4, 3, 0]):
        slot, t = slot_of[env], writer.step[env]
        assert obs_place == (slot * (T + 1) + t) * E + env
        assert step_place == (slot * T + t) * E + env


class SlotFrameReads(TorchDispatchMode):
    """Counts the observations that copies read out of the actors' slots."""

    def __init__(self, slots: TrajectorySlots):
        super().__init__()
        obs = slots.tensors["obs"]
        self.area = range(obs.data_ptr(), obs.data_ptr() + obs.nbytes)      # numpy views come back as tensors of their own
        self.frame_bytes = slots.tensors["obs"][0, 0, 0].nbytes
        self.frames = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.overloadpacket.__name__ in ("copy_", "_to_copy") and len(args) > 1:
            source = args[1] if func.overloadpacket.__name__ == "copy_" else args[0]
            if isinstance(source, torch.Tensor) and source.device.type == "cpu" and source.data_ptr() in self.area:
                self.frames += source.nbytes // self.frame_bytes
        return func(*args, **(kwargs or {}))


DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"))]


@pytest.mark.parametrize("device", DEVICES)
def test_a_device_mirror_is_what_the_learner_ingests(device):
    """The GPU path on the CPU device: DevicePath writes a batch's rows into a mirror of the
    slots (StepRecords.on_device), the learner's rollout takes the recorded fields from
    the mirror and the rest (and obs[T]) from the host slot, and a device store ingests
    exactly the trajectories an actor-written slot gives. Catches the mirror written
    after the answer's copies, obs[T] left out, or a host field taken from the mirror."""
    lay = layout()
    slots = TrajectorySlots(lay, 2, E)
    fields = recorded_fields(lay, OUTPUTS)
    mirror = StepRecords.on_device(lay, 2, E, fields, torch.device(device))
    channels = InferenceChannels.for_model(MLP, 1, E, context=CONTEXT, with_features=False, with_places=True)
    torch.manual_seed(0)
    weights = SharedWeights(build_model(**MLP), CONTEXT)
    host_server = BatchServer(channels, MLP, weights, torch.device("cpu"))
    path = DevicePath(host_server.model.to(device), E, host_server.inputs, host_server.outputs, torch.device(device),
                      ServerOptions(), mirror)
    rng = np.random.default_rng(0)
    slot = 1
    index = torch.arange(E)
    for t in range(T):
        channels.obs[0] = torch.from_numpy(rng.standard_normal((E, 4)).astype(np.float32))
        channels.uniforms[0] = torch.from_numpy(rng.random(E, dtype=np.float32))
        places = np.stack([(slot * (T + 1) + t) * E + np.arange(E), (slot * T + t) * E + np.arange(E)], axis=1)
        results, event = path.launch(np.array([0]), [E], index, places)
        path.finish([0], [E], index, results, event)
        # What an actor writing its own slot would have written:
        views = slots.views(slot)
        views["obs"][t] = channels.obs[0].numpy()
        views["action"][t] = channels.actions[0].numpy()
        views["behaviour_logits"][t] = channels.logits[0].numpy()
        views["behaviour_value"][t] = channels.value[0].numpy()
        views["reward"][t], views["done"][t], views["trunc_value"][t] = rng.random(E), t == 5, 0.0
    views["obs"][T] = rng.standard_normal((E, 4)).astype(np.float32)
    copies = DeviceCopies(torch.device(device))
    own = TrajectoryStore(lay, 2 * E, device=device, copies=copies)
    recorded = TrajectoryStore(lay, 2 * E, device=device, copies=copies)
    with SlotFrameReads(slots) as frames_written:
        own.write_run(0, slots.views(slot), version=1)
    for name in fields:                     # what an actor leaves to the server: not in its slot
        slots.tensors[name][slot, :T].fill_(slots.layout.sentinel(name))
    with SlotFrameReads(slots) as frames_recorded:
        recorded.write_run(0, mirror.rollout(slot, slots.views(slot), copies), version=1)
    # Frames the learner reads from the host slot (to the GPU, on a GPU): T+1, or only obs[T].
    assert (frames_written.frames, frames_recorded.frames) == ((T + 1) * E, E)
    if device == "cuda":
        torch.cuda.synchronize()
    for name in own.tensors:
        assert torch.equal(own.tensors[name][:, :E], recorded.tensors[name][:, :E]), name
    assert copies.copies == 2                      # the two rollouts; the bootstrap frame's copy is not one


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_server_process_records_into_the_learner_s_mirror_on_the_gpu():
    """The mirror crosses to the server process as CUDA IPC handles: what the server
    writes there, this process reads, once the client has its answer."""
    lay = layout()
    mirror = StepRecords.on_device(lay, 2, E, recorded_fields(lay, OUTPUTS), torch.device("cuda"))
    channels = InferenceChannels.for_model(MLP, 1, E, context=CONTEXT, with_features=False, with_places=True)
    weights = SharedWeights(build_model(**MLP), CONTEXT)
    stop = CONTEXT.Event()
    process = CONTEXT.Process(target=run_inference_server, args=(channels, MLP, weights, "cuda", stop),
                              kwargs=dict(records=mirror), daemon=True)
    process.start()
    slot, t = 1, 3
    places = np.stack([(slot * (T + 1) + t) * E + np.arange(E), (slot * T + t) * E + np.arange(E)], axis=1)
    client = InferenceClient(channels, 0, seed=1, record=(), place_of=lambda ids: places[ids])
    obs = np.random.default_rng(0).standard_normal((E, 4)).astype(np.float32)
    step = client.act(obs)
    stop.set()
    process.join(30)
    torch.cuda.synchronize()
    assert torch.equal(mirror.tensors["obs"][slot, t].cpu(), torch.from_numpy(obs))
    assert torch.equal(mirror.tensors["action"][slot, t].cpu(), torch.from_numpy(step.actions))
    assert torch.equal(mirror.tensors["behaviour_logits"][slot, t].cpu(), channels.logits[0])
    assert (mirror.tensors["action"][0] == -1).all()                 # nothing else written


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", ["queue", "standard", "custom", "circular"])
def test_every_trajectory_replay_on_a_device_stores_a_recorded_rollout_as_the_slot_s(kind, device):
    """What LocalRollouts hands a GPU learner's replays from a mirror: the recorded fields
    as tensors on the device (here the CPU device), the rest as the slot's host arrays.
    Each replay kind (ring-order runs, trajectory by trajectory) stores exactly what it
    stores from the slot's arrays alone (on a GPU: no host conversion of a device tensor)."""
    from herd.replay.registry import build_replay
    from herd.replay.spec import parse_replay_parameters
    lay = layout()
    spec = parse_replay_parameters(json.dumps([{"type": kind, "capacity": 3, "sample_ratio": 1,
                                                **({"dist_function": "ln_norm"} if kind == "custom" else {})}]))[0]
    rng = np.random.default_rng(1)
    slots = TrajectorySlots(lay, 1, E)
    for name, array in slots.views(0).items():
        array[...] = rng.standard_normal(array.shape) if array.dtype.kind == "f" else rng.integers(0, 2, array.shape)
    fields = recorded_fields(lay, OUTPUTS)
    recorded = {name: (torch.from_numpy(array.copy()).to(device) if name in fields else array)
                for name, array in slots.views(0).items()}
    stores = []
    for rollout in (slots.views(0), recorded):
        replay = build_replay(spec, lay, 2, E, storage_device=torch.device(device))
        replay.add_rollout(rollout, version=3)
        stores.append(replay.storage)
    for name in stores[0].tensors:      # bit for bit, the unused positions' NaN sentinels too
        torch.testing.assert_close(stores[1].tensors[name].cpu(), stores[0].tensors[name].cpu(), rtol=0, atol=0,
                                   equal_nan=True)
    assert not torch.isnan(stores[1].tensors["behaviour_logits"]).all()     # something was stored
