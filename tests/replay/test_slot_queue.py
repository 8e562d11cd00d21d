"""The on-policy queue reading fresh rollouts in the actors' slots (herd/replay/slot_queue.py):
a batch that is one run of slot positions is a view of the slots' memory, any other is one
gather; a slot is freed only once every trajectory in it was trained on (or dropped past
the queue's capacity); trajectories loaded from a checkpoint come first, copied; the
waiting trajectories save in the plain queue's format."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from herd.algos.impala import impala_layout
from herd.learner.batches import DirectBatches, PrefetchedBatches
from herd.replay.mixer import ReplayMixer
from herd.replay.registry import build_replay
from herd.replay.spec import parse_replay_parameters
from herd.store import TrajectorySlots

OBS = (4, 6, 5)
LAYOUT = impala_layout(unroll_length=3, obs_shape=OBS, obs_dtype="uint8", num_actions=3, feature_size=4)
E = 4                              # trajectories per slot (environments per actor)
SHARE = 2                          # trajectories per batch
SLOTS = 4
QUEUE = parse_replay_parameters('[{"type": "queue", "capacity": 1, "sample_ratio": 1}]')[0]


def mixer(lends: bool = True) -> ReplayMixer:
    return ReplayMixer([build_replay(QUEUE, LAYOUT, SHARE, E, lent_batches=1)], [SHARE], 0.0, seed=0, lends=lends)


def filled(slots: TrajectorySlots, slot: int, mark: int) -> dict:
    """Slot `slot` written as an actor would: environment e's frames all 10 * mark + e."""
    views = slots.views(slot)
    for e in range(E):
        views["obs"][:, e] = 10 * mark + e
    views["action"][:] = 0
    return views


def marks(obs) -> list[int]:
    columns = np.asarray(obs).reshape(obs.shape[0], obs.shape[1], -1)
    return [int(columns[0, b, 0]) for b in range(obs.shape[1])]


class Freed(list):
    def on_free(self, slot):
        return lambda: self.append(slot)


def test_a_batch_in_one_slot_is_read_in_place_and_the_slot_freed_after_its_last_trajectory():
    slots, m, freed = TrajectorySlots(LAYOUT, SLOTS, E), mixer(), Freed()
    assert m.read_slots(slots)
    filled(slots, 1, mark=3)
    assert m.keep(1 * E, E, version=7, on_free=freed.on_free(1))
    first = m.sample()
    assert first.lent and list(first.versions) == [7, 7]
    assert np.shares_memory(first.data["obs"], slots.arrays["obs"])       # no copy
    assert marks(first.data["obs"]) == [30, 31]
    m.give_back(first)
    assert freed == []                           # half the slot is still to be trained on
    second = m.sample()
    assert marks(second.data["obs"]) == [32, 33]
    m.give_back(second)
    assert freed == [1]


def test_without_the_slots_the_queue_copies():
    """Negative control of the view above: the same rollout put (copied) is read elsewhere."""
    slots, m = TrajectorySlots(LAYOUT, SLOTS, E), mixer()
    m.add_rollout(filled(slots, 1, mark=3), version=7)
    batch = m.sample()
    assert marks(batch.data["obs"]) == [30, 31]
    assert not np.shares_memory(batch.data["obs"], slots.arrays["obs"])


def test_a_batch_across_slots_out_of_order_is_one_gather():
    slots, m, freed = TrajectorySlots(LAYOUT, SLOTS, 1), mixer(), Freed()
    assert m.read_slots(slots)
    for slot, mark in ((2, 5), (0, 6)):                   # positions 2 then 0: not one run
        views = slots.views(slot)
        views["obs"][:] = 10 * mark
        assert m.keep(slot, 1, version=mark, on_free=freed.on_free(slot))
    batch = m.sample()
    assert not np.shares_memory(batch.data["obs"], slots.arrays["obs"])
    assert marks(batch.data["obs"]) == [50, 60] and list(batch.versions) == [5, 6]
    m.give_back(batch)
    assert freed == [2, 0]


def test_a_gathered_batchs_buffer_serves_the_next_gather_once_given_back():
    """The gather writes into a batch buffer given back before (no fresh allocation per
    batch), never into one still lent to the step."""
    slots, m, freed = TrajectorySlots(LAYOUT, SLOTS, 1), mixer(), Freed()
    assert m.read_slots(slots)

    def gathered(marks_of):
        for slot, mark in marks_of:
            slots.views(slot)["obs"][:] = 10 * mark
            assert m.keep(slot, 1, version=mark, on_free=freed.on_free(slot))
        return m.sample()
    first = gathered(((2, 1), (0, 2)))
    second = gathered(((3, 3), (1, 4)))                 # first is still lent: a buffer of its own
    assert not np.shares_memory(first.data["obs"], second.data["obs"])
    assert marks(first.data["obs"]) == [10, 20] and marks(second.data["obs"]) == [30, 40]
    m.give_back(first)
    third = gathered(((2, 5), (0, 6)))
    assert np.shares_memory(third.data["obs"], first.data["obs"])     # first's buffer, reused
    assert marks(third.data["obs"]) == [50, 60] and marks(second.data["obs"]) == [30, 40]


def test_past_its_capacity_the_oldest_waiting_are_dropped_and_their_slot_freed():
    slots, m, freed = TrajectorySlots(LAYOUT, 16, E), mixer(), Freed()
    assert m.read_slots(slots)
    capacity = m.replays[0].storage.capacity
    kept = capacity // E + 1
    for slot in range(kept):
        filled(slots, slot, mark=slot)
        assert m.keep(slot * E, E, version=slot, on_free=freed.on_free(slot))
    assert freed == [0]                                   # overwritten, as the ring would
    assert m.replays[0].available() == capacity
    assert marks(m.sample().data["obs"]) == [10, 11]      # the oldest left: slot 1's


def test_without_overwrite_the_batch_source_takes_no_rollout_while_the_queue_is_full():
    slots, freed = TrajectorySlots(LAYOUT, 16, E), Freed()
    batches = PrefetchedBatches(DirectBatches(mixer(), torch.device("cpu")), threads=1, per_round=1, buffer_size=1,
                                writer_queue_size=4, discarding_strategy="wait")
    try:
        assert batches.read_slots(slots)
        capacity = batches.mixer.replays[0].storage.capacity
        slot = 0
        while batches.has_room():
            filled(slots, slot, mark=slot)
            assert batches.keep(slot * E, E, version=0, on_free=freed.on_free(slot))
            slot += 1
        assert freed == [] and slot * E >= capacity
    finally:
        batches.close()


def test_too_few_slots_for_a_batch_keep_the_queue_copying():
    m = mixer()
    assert not m.read_slots(TrajectorySlots(LAYOUT, 1, 1))        # 1 position < a share + a rollout
    assert not m.keep(0, 1, 0, on_free=lambda: None)
    assert not mixer(lends=False).read_slots(TrajectorySlots(LAYOUT, SLOTS, E))


def test_loaded_trajectories_come_first_and_the_waiting_save_in_the_queues_format():
    slots, freed = TrajectorySlots(LAYOUT, SLOTS, E), Freed()
    saving = DirectBatches(mixer(), torch.device("cpu"))
    assert saving.read_slots(slots)
    filled(slots, 2, mark=4)
    assert saving.keep(2 * E, E, version=9, on_free=freed.on_free(2))
    saving.give_back(saving.next_ready()[1])              # trajectories 40, 41 trained
    state = saving.replay_state()

    resumed = DirectBatches(mixer(), torch.device("cpu"))
    resumed.load_replay_state(state)
    assert resumed.read_slots(slots)
    filled(slots, 0, mark=1)
    assert not resumed.keep(0, E, version=10, on_free=freed.on_free(0))   # behind the loaded two: copied
    resumed.put_rollout(slots.views(0), 10)
    tensors, loaded = resumed.next_ready()
    assert marks(tensors["obs"]) == [42, 43] and list(loaded.versions) == [9, 9]
    resumed.give_back(loaded)
    assert marks(resumed.next_ready()[0]["obs"]) == [10, 11]


def test_rollouts_put_behind_trajectories_read_in_the_slots_are_refused():
    slots, m = TrajectorySlots(LAYOUT, SLOTS, E), mixer()
    assert m.read_slots(slots)
    assert m.keep(0, E, version=0, on_free=lambda: None)
    with pytest.raises(RuntimeError, match="in place"):
        m.add_rollout(filled(slots, 1, mark=1), version=1)


def test_a_queue_saved_with_another_capacity_serves_its_waiting_trajectories_in_order():
    """An older herd's queue (its capacity computed otherwise), or one saved with another
    batch share, resumes: the waiting trajectories, oldest first, with their versions."""
    small = ReplayMixer([build_replay(QUEUE, LAYOUT, SHARE, E, lent_batches=0)], [SHARE], 0.0, seed=0)
    big = mixer()
    assert small.replays[0].storage.capacity != big.replays[0].storage.capacity
    slots = TrajectorySlots(LAYOUT, SLOTS, E)
    small.add_rollout(filled(slots, 0, mark=1), version=5)
    served = small.sample()                      # 10, 11 trained; 12, 13 and then 20 .. 23 wait
    assert marks(served.data["obs"]) == [10, 11]
    small.add_rollout(filled(slots, 1, mark=2), version=6)
    big.load_state_dict(small.state_dict())
    waiting = [big.sample() for _ in range(3)]
    assert [marks(b.data["obs"]) for b in waiting] == [[12, 13], [20, 21], [22, 23]]
    assert [list(b.versions) for b in waiting] == [[5, 5], [6, 6], [6, 6]]
    assert not big.ready()
