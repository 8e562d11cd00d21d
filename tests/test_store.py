"""herd/store.py: one trajectory store for the actors' slots and the replays' rings."""
from __future__ import annotations

import io
import multiprocessing as mp
import pickle

import numpy as np
import pytest
import torch
import torch.multiprocessing  # noqa: F401  registers the tensor reductions with ForkingPickler
from multiprocessing.reduction import ForkingPickler

from herd.store import Gather, TrajectorySlots, TrajectoryStore
from herd.trajectory import TrajectoryLayout

LAYOUT = TrajectoryLayout(unroll_length=5, obs_shape=(4, 84, 84), obs_dtype="uint8")
E = 3


def test_a_slot_is_a_run_of_positions_of_the_shared_slots():
    slots = TrajectorySlots(LAYOUT, num_slots=4, envs_per_slot=E)
    assert slots.capacity == 4 * E
    views = slots.views(2)                                        # [time, E, ...]
    assert views["obs"].shape == (6, E, 4, 84, 84) and views["action"].shape == (5, E)
    # C-contiguous: a slot leaves in one transfer per field (a device copy, Ray's pickling).
    assert all(view.flags.c_contiguous for view in views.values())
    assert all(tensor[2].is_contiguous() for tensor in slots.tensors.values())
    views["obs"][:] = 7
    views["action"][:] = 3
    # The same memory as positions 6, 7, 8 of the store: what a replay would read from it.
    read = slots.read(np.arange(2 * E, 3 * E))
    assert (read["obs"] == 7).all() and (read["action"] == 3).all()
    untouched = slots.read(np.array([0, 5, 9]))
    assert (untouched["obs"] == 0).all() and (untouched["action"] == -1).all()      # sentinels
    slots.reset(2)
    assert (slots.views(2)["action"] == -1).all() and (slots.views(2)["obs"] == 0).all()
    assert (slots.views(1)["action"] == -1).all()


def test_positions_inside_one_slot_are_lent_as_a_view_and_across_slots_gathered_in_order():
    slots = TrajectorySlots(LAYOUT, num_slots=3, envs_per_slot=E)
    for slot in range(3):
        for e in range(E):
            slots.views(slot)["obs"][:, e] = 10 * slot + e
            slots.views(slot)["action"][:, e] = 10 * slot + e
    lent = slots.lend(np.array([4, 5]))                           # slot 1, environments 1 and 2
    assert np.shares_memory(lent["obs"], slots.arrays["obs"]) and lent["obs"].shape == (6, 2, 4, 84, 84)
    assert list(lent["obs"][0, :, 0, 0, 0]) == [11, 12] and list(lent["action"][0]) == [11, 12]
    assert not np.shares_memory(lent["action"], slots.arrays["action"])     # the small fields copied
    # Not one run inside a slot: adjacent positions across two slots, or out of order.
    for positions in ([2, 3], [1, 0], [0, 2]):
        assert slots.lend(np.array(positions)) is None, positions
    assert slots.runs(np.array([2, 3, 4, 8, 7, 1])) == [(0, 2, 1), (1, 0, 2), (2, 2, 1), (2, 1, 1), (0, 1, 1)]
    read = slots.read(np.array([2, 3, 4, 8, 7, 1]))
    assert read["obs"].flags.c_contiguous and read["obs"].shape == (6, 6, 4, 84, 84)
    assert list(read["obs"][5, :, 3, 0, 0]) == list(read["action"][0]) == [2, 10, 11, 22, 21, 1]


def forking_pickle(value) -> bytes:
    buffer = io.BytesIO()
    ForkingPickler(buffer, pickle.HIGHEST_PROTOCOL).dump(value)
    return buffer.getvalue()


def test_slots_travel_to_another_process_as_shared_memory_not_as_a_copy():
    """The store's numpy views would pickle the frames themselves; they are left out and
    remade on arrival (TrajectoryStore.__getstate__), so what travels is a few hundred bytes
    per field whatever the slots hold."""
    slots = TrajectorySlots(LAYOUT, num_slots=8, envs_per_slot=E)
    frames = slots.nbytes()
    assert len(forking_pickle(slots)) < 20_000 < frames / 100
    # Negative control: the views pickled as they are carry every frame.
    assert len(forking_pickle(slots.arrays)) > frames


def write_slot(slots: TrajectorySlots, slot: int) -> None:
    slots.views(slot)["obs"][:] = 42
    slots.views(slot)["reward"][:] = 1.5


def test_what_a_child_process_writes_into_a_slot_the_parent_reads():
    slots = TrajectorySlots(LAYOUT, num_slots=2, envs_per_slot=E)
    child = mp.get_context("spawn").Process(target=write_slot, args=(slots, 1))
    child.start()
    child.join(60)
    assert child.exitcode == 0
    assert (slots.views(1)["obs"] == 42).all() and (slots.views(1)["reward"] == 1.5).all()
    assert (slots.views(0)["obs"] == 0).all()


@pytest.mark.parametrize("options", [dict(compress_obs=True), dict(shared=True)])
def test_a_store_on_a_device_is_neither_compressed_nor_shared(options):
    with pytest.raises(ValueError, match="neither compressed nor shared"):
        TrajectoryStore(LAYOUT, 4, torch.device("cpu"), **options)


def test_the_host_and_a_device_store_read_the_same_and_save_the_same_checkpoint():
    host, device = TrajectoryStore(LAYOUT, 6), TrajectoryStore(LAYOUT, 6, torch.device("cpu"))
    rng = np.random.default_rng(0)
    rollout = {name: (rng.integers(0, 256, (shape[0], 4, *shape[1:])).astype(dtype))
               for name, (shape, dtype) in LAYOUT.fields().items()}
    for store in (host, device):
        store.write_run(1, rollout, version=3)
    positions = np.array([4, 1, 2])
    a, b = host.read(positions), device.read(positions)
    assert isinstance(a["obs"], np.ndarray) and isinstance(b["obs"], torch.Tensor)
    for name in a:
        np.testing.assert_array_equal(a[name], b[name].numpy(), err_msg=name)
    saved_host, saved_device = host.state_dict(5), device.state_dict(5)
    for name in saved_host["arrays"]:
        np.testing.assert_array_equal(saved_host["arrays"][name], saved_device["arrays"][name], err_msg=name)
    assert all(np.array_equal(x, y) for x, y in zip(saved_host["packed_obs"], saved_device["packed_obs"]))
    # The host lends a view; the device defers the read to the learner (a Gather), which reads the same.
    lent, deferred = host.lend(np.arange(1, 4)), device.lend(np.arange(1, 4))
    assert isinstance(deferred, Gather)
    for name, tensor in deferred.read().items():
        np.testing.assert_array_equal(lent[name], tensor.numpy(), err_msg=name)


def test_a_gather_joins_parts_of_two_stores_and_writes_straight_into_its_destination():
    """Gather.into writes each part into its own columns of the destination, in place (the
    captured step's static inputs); read() equals the host reads joined."""
    rng = np.random.default_rng(1)
    stores = [TrajectoryStore(LAYOUT, 6, torch.device("cpu")) for _ in range(2)]
    hosts = [TrajectoryStore(LAYOUT, 6) for _ in range(2)]
    for device, host in zip(stores, hosts):
        rollout = {name: (rng.integers(0, 256, (shape[0], 6, *shape[1:])).astype(dtype))
                   for name, (shape, dtype) in LAYOUT.fields().items()}
        device.write_run(0, rollout, version=1)
        host.write_run(0, rollout, version=1)
    picks = [np.array([5, 0, 3]), np.array([2, 4])]
    replayed = torch.tensor([False, False, False, True, True])
    joined = Gather.join([store.lend(p) for store, p in zip(stores, picks)]).with_columns(replayed=replayed)
    expected = {name: np.concatenate([h.read(p)[name] for h, p in zip(hosts, picks)], axis=1)
                for name in LAYOUT.fields()}
    out = {name: torch.zeros_like(torch.from_numpy(array)) for name, array in expected.items()}
    out["replayed"] = torch.zeros(5, dtype=torch.bool)
    pointers = {name: tensor.data_ptr() for name, tensor in out.items()}
    joined.into(out)
    for name, array in expected.items():
        np.testing.assert_array_equal(out[name].numpy(), array, err_msg=name)
        assert out[name].data_ptr() == pointers[name], name         # written in place, not replaced
    assert torch.equal(out["replayed"], replayed)
    own = joined.read()
    for name, array in expected.items():
        np.testing.assert_array_equal(own[name].numpy(), array, err_msg=name)


def test_a_device_store_has_no_numpy_views_to_write():
    store = TrajectoryStore(LAYOUT, 4, torch.device("cpu"))
    assert store.arrays == {}
    with pytest.raises(ValueError, match="no numpy views"):
        store.positions(0, 2)
