"""A rollout copied from an actor's slot into a store on the learner's device
(herd/device_copies.py, herd/store.py): one transfer per field and no copy on the host,
since a slot's fields are C-contiguous; on a GPU the copies run on a stream of their own
from the page-locked slots, and the slot goes back only once they are done. The counts
run on a CPU (a store on the CPU device takes the device path); the stream and the
release need CUDA and are skipped without it."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import copy_counting
from copy_counting import CopyCounter, ObsArray, TorchCopies, numpy_wrapped
from herd.algos.impala import impala_layout
from herd.device_copies import DeviceCopies
from herd.devices import host_register
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
