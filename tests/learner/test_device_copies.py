"""A rollout copied from an actor's slot into a store on the learner's device
(herd/device_copies.py, herd/store.py): one transfer per field and no copy on the host,
since a slot's fields are C-contiguous; on a GPU the copies run on a stream of their own
from the page-locked slots, and the slot goes back only once they are done. The counts
run on a CPU (a store on the CPU device takes the device path); the stream and the
release need CUDA and are skipped without it."""
from __future__ import annotations

import functools

import numpy as np
import pytest
import torch

import copy_counting
from copy_counting import CopyCounter, ObsArray, TorchCopies, numpy_wrapped
from herd.algos.impala import impala_layout
from herd.device_copies import DeviceCopies
from herd.devices import host_register
from herd.learner.learner import Learner, build_optimizer, build_scheduler
from herd.learner.staging import Staging
from herd.losses.impala import ImpalaLossWeights, impala_loss
from herd.models import build_model
from herd.replay.mixer import ReplayMixer
from herd.replay.registry import build_replay
from herd.replay.spec import ReplaySpec
from herd.store import TrajectorySlots, TrajectoryStore

OBS = (4, 84, 84)
T, E = 20, 8
LAYOUT = impala_layout(unroll_length=T, obs_shape=OBS, obs_dtype="uint8", num_actions=6, feature_size=8)


def filled(slots, slot: int, mark: int) -> dict:
    views = slots.views(slot) if isinstance(slots, TrajectorySlots) else slots.positions(slot * E, E)
    views["obs"][:] = mark
    views["action"][:] = mark % 6
    return views


def frame_copies_of_one_put(views: dict, monkeypatch) -> tuple[float, dict]:
    """(frames' bytes copied / the rollout's frames' bytes, by op) for one put into a store
    on the CPU device, as a GPU learner's replay puts it."""
    counter = CopyCounter(OBS, np.uint8)
    monkeypatch.setattr(copy_counting, "COUNTER", counter)
    store = TrajectoryStore(LAYOUT, 2 * E, torch.device("cpu"), copies=DeviceCopies(torch.device("cpu")))
    views = dict(views, obs=views["obs"].view(ObsArray))
    with TorchCopies(counter), numpy_wrapped(monkeypatch, counter):
        store.write_run(E, views, version=3)
    assert torch.equal(store.tensors["obs"][:, E:], torch.from_numpy(np.asarray(views["obs"])))
    assert store.copies.copies == 1
    return counter.bytes / views["obs"].nbytes, counter.by_op


def test_a_slot_reaches_a_device_store_in_one_copy_per_frame(monkeypatch):
    slots = TrajectorySlots(LAYOUT, 3, E, shared=False)
    copies, by_op = frame_copies_of_one_put(filled(slots, 1, mark=7), monkeypatch)
    assert copies == 1 and set(by_op) == {"aten copy_"}, sorted(by_op.items())


def test_a_strided_slot_would_be_copied_on_the_host_first(monkeypatch):
    """Negative control: the same rollout as positions of a store (capacity second, strided
    in time), the slots' layout before they were slot first."""
    strided = TrajectoryStore(LAYOUT, 3 * E)
    copies, by_op = frame_copies_of_one_put(filled(strided, 1, mark=7), monkeypatch)
    assert copies == 2 and "numpy ascontiguousarray" in by_op, sorted(by_op.items())


def test_on_a_cpu_device_nothing_is_in_flight_and_the_slot_goes_back_at_once():
    copies = DeviceCopies(torch.device("cpu"))
    released = []
    with copies.copying():
        pass
    assert not copies.release_after(lambda: released.append(1))
    assert copies.release_done() == 0 and copies.pending() == 0 and released == []


cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@cuda
def test_on_a_gpu_the_copies_run_on_their_own_stream_and_the_slot_waits_for_them():
    device = torch.device("cuda")
    slots = TrajectorySlots(LAYOUT, 4, E)
    assert all(host_register(tensor, device) for tensor in slots.tensors.values())
    copies = DeviceCopies(device)
    store = TrajectoryStore(LAYOUT, 4 * E, device, copies=copies)
    released = []
    for slot in range(4):
        store.write_run(slot * E, filled(slots, slot, mark=10 + slot), version=slot)
        assert copies.release_after(lambda slot=slot: released.append(slot))
    torch.cuda.current_stream().synchronize()       # it waits on the copies' events
    assert copies.release_done() == 4 and released == [0, 1, 2, 3] and copies.pending() == 0
    for slot in range(4):
        assert (store.tensors["obs"][:, slot * E:(slot + 1) * E] == 10 + slot).all()
    # A gather queued on the learner's stream right after a put reads the new rollout.
    store.write_run(0, filled(slots, 0, mark=99), version=9)
    batch = store.read(np.arange(E))
    assert (batch["obs"] == 99).all()


# --- from the slot to a device learner's step ---------------------------------------------

class StandInGraph:
    """A CPU stand-in for a captured update (a CPU learner never captures): replay() reads
    the static inputs where the graph would, and keeps their frames."""

    def __init__(self, learner):
        self.learner, self.frames = learner, []

    def replay(self) -> None:
        self.frames.append(self.learner.static_batch["obs"].numpy().copy())


def device_learner_path(materialize_first: bool, monkeypatch) -> tuple[float, dict, StandInGraph, dict]:
    """One rollout from a slot into the queue of a learner on the CPU device (as a GPU
    learner's: the store on the device, its copies, the batch lent), then a batch of it
    through the mixer, to_tensors and Learner.step into a stand-in captured graph.
    Returns (frames' bytes copied / the batch's frames' bytes, by op, the graph, the rollout)."""
    device = torch.device("cpu")
    copies = DeviceCopies(device)
    spec = ReplaySpec("queue", 0, 1.0)
    queue = build_replay(spec, LAYOUT, E, E, storage_device=device, device_copies=copies, lent_batches=1)
    mixer = ReplayMixer([queue], [E], fill_in_factor=0.0, seed=0, lends=True)
    model = build_model(network="nature_cnn", obs_shape=OBS, obs_dtype="uint8", num_actions=6, feature_size=8)
    optimizer = build_optimizer("rmsprop", model.parameters(), 1e-3, 0.01)
    learner = Learner(model, optimizer, build_scheduler(optimizer, 1e-3, 1e-5, 10),
                      functools.partial(impala_loss, weights=ImpalaLossWeights()), 40.0)
    slots = TrajectorySlots(LAYOUT, 2, E, shared=False)
    views = filled(slots, 1, mark=0)
    views["obs"][:] = np.random.default_rng(0).integers(0, 256, views["obs"].shape, dtype=np.uint8)
    rollout = {name: array.copy() for name, array in views.items()}
    # The static inputs a capture would have made: the batch's shapes, preallocated.
    learner.static_batch = {name: torch.zeros((array.shape[0], E, *array.shape[2:]), dtype=torch.from_numpy(array).dtype)
                            for name, array in rollout.items()}
    learner.static_batch["replayed"] = torch.ones(E, dtype=torch.bool)
    learner.static_metrics = {}
    graph = learner.graph = StandInGraph(learner)
    counter = CopyCounter(OBS, np.uint8)
    monkeypatch.setattr(copy_counting, "COUNTER", counter)
    with TorchCopies(counter), numpy_wrapped(monkeypatch, counter):
        mixer.add_rollout(dict(views, obs=views["obs"].view(ObsArray)), version=2)
        assert mixer.ready()
        mixed = mixer.sample()
        tensors = Staging.hand_over(*Staging(device).stage(mixed.data, mixed.replayed))
        if materialize_first:
            tensors = tensors.read()            # the negative control: a batch of its own first
        learner.step(tensors)
        mixer.give_back(mixed)
    assert copies.copies == 1
    return counter.bytes / rollout["obs"].nbytes, counter.by_op, graph, rollout


def test_a_device_learner_copies_each_frame_twice_from_slot_to_captured_step(monkeypatch):
    """The slot's one transfer into the queue's ring, then one gather straight into the
    captured step's static inputs (herd/store.py Gather): two copies."""
    copies, by_op, graph, rollout = device_learner_path(False, monkeypatch)
    assert copies == 2 and set(by_op) == {"aten copy_", "aten index_select"}, sorted(by_op.items())
    assert len(graph.frames) == 1 and np.array_equal(graph.frames[0], rollout["obs"])   # it delivers


def test_a_batch_gathered_before_the_step_is_one_copy_more(monkeypatch):
    """Negative control: the batch gathered into tensors of its own, then copied into the
    static inputs (the path before Gather), counts 3."""
    copies, by_op, graph, rollout = device_learner_path(True, monkeypatch)
    assert copies == 3, sorted(by_op.items())
    assert np.array_equal(graph.frames[0], rollout["obs"])
