"""Batches the on-policy queue lends (herd/replay/mixer.py `lends`): a CPU learner reads a
batch's observations where the queue wrote them, and the queue keeps those positions from
new rollouts until the batch is given back. Checked: the view shares the queue's memory
and holds the right frames, no write reaches a lent position (however many rollouts
arrive meanwhile), a batch that does not lie in one run of positions is read as a copy,
and the networks read strided frames in place with the same results."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from copy_counting import CopyCounter, TorchCopies
from herd_testing import wait_for
from herd.algos.impala import impala_layout
from herd.learner.batches import DirectBatches, PrefetchedBatches
from herd.models import build_model
from herd.replay.mixer import ReplayMixer
from herd.replay.registry import build_replay
from herd.replay.samplers import FifoSampler
from herd.replay.spec import parse_replay_parameters

OBS = (4, 6, 5)                    # stacked uint8 frames, small
LAYOUT = impala_layout(unroll_length=3, obs_shape=OBS, obs_dtype="uint8", num_actions=3, feature_size=4)
E = 2                              # environments per rollout
SHARE = 4                          # trajectories per batch
QUEUE = parse_replay_parameters('[{"type": "queue", "capacity": 1, "sample_ratio": 1}]')[0]


def rollout(mark: int) -> dict:
    """field -> [time, E, ...]: environment e's frames all equal 10 * mark + e (mark <= 24)."""
    views = {name: np.zeros((shape[0], E, *shape[1:]), dtype) for name, (shape, dtype) in LAYOUT.fields().items()}
    for e in range(E):
        views["obs"][:, e] = 10 * mark + e
    return views


def marks(obs: np.ndarray) -> list[int]:
    """The frame value of each column of a batch's obs [T+1, B, ...] (one value per column)."""
    columns = np.asarray(obs).reshape(obs.shape[0], obs.shape[1], -1)
    assert all(len(np.unique(columns[:, b])) == 1 for b in range(obs.shape[1]))
    return [int(columns[0, b, 0]) for b in range(obs.shape[1])]


def queue_mixer(lends: bool, lent_batches: int = 1) -> ReplayMixer:
    return ReplayMixer([build_replay(QUEUE, LAYOUT, SHARE, E, lent_batches=lent_batches)], [SHARE], 0.0, seed=0,
                       lends=lends)


def add_rollout(mixer: ReplayMixer, mark: int) -> None:
    views = rollout(mark)
    for e in range(E):
        mixer.add({name: view[:, e] for name, view in views.items()}, version=mark)


def test_a_lent_batch_is_read_in_place_and_kept_from_writes_until_given_back():
    mixer = queue_mixer(lends=True)
    queue = mixer.replays[0]
    # One lent batch, one share and one rollout (10), rounded up to whole shares.
    assert queue.storage.capacity == 12
    for mark in range(SHARE // E):
        add_rollout(mixer, mark)
    batch = mixer.sample()
    assert batch.lent and np.shares_memory(batch.data["obs"], queue.storage.arrays["obs"])
    assert marks(batch.data["obs"]) == [0, 1, 10, 11]
    # The queue takes rollouts up to its lent batch, and not one more.
    added = 0
    while mixer.can_add(E):
        add_rollout(mixer, 20 + added)
        added += 1
    assert added == (queue.storage.capacity - SHARE) // E
    assert marks(batch.data["obs"]) == [0, 1, 10, 11]        # intact
    with pytest.raises(RuntimeError, match="lent"):
        add_rollout(mixer, 24)                              # writing over it is refused, not silent
    mixer.give_back(batch)
    assert mixer.can_add(E)


def test_every_batch_of_a_long_run_is_lent():
    """The queue's ring holds a whole number of batch shares, so no batch wraps around it:
    batch after batch is read in place (a ring of one lent batch, one share and one rollout,
    10 positions, would wrap every third batch of 4 and copy it)."""
    mixer = queue_mixer(lends=True)
    for mark in range(60):
        add_rollout(mixer, mark % 25)
        if mixer.replays[0].available() >= SHARE:
            batch = mixer.sample()
            assert batch.lent and np.shares_memory(batch.data["obs"], mixer.replays[0].storage.arrays["obs"]), mark
            mixer.give_back(batch)


def test_without_lending_a_batch_is_a_copy_and_holds_nothing():
    """The negative control of the test above: a mixer that does not lend (a GPU learner,
    the replay server, several replays) copies, and the queue's room is what it was."""
    mixer = queue_mixer(lends=False, lent_batches=0)
    for mark in range(SHARE // E):
        add_rollout(mixer, mark)
    batch = mixer.sample()
    assert not batch.lent and not np.shares_memory(batch.data["obs"], mixer.replays[0].storage.arrays["obs"])
    assert mixer.replays[0].room() == mixer.replays[0].storage.capacity


def test_with_another_replay_the_queues_share_is_still_given_back():
    """A lending mixer over the queue and a uniform replay: the joined batch is a copy, but
    the queue's positions were lent, and the batch says so, so that give_back frees them
    (a flag taken from the last replay alone would leave them held for good)."""
    standard = parse_replay_parameters('[{"type": "standard", "capacity": 8, "sample_ratio": 1}]')[0]
    mixer = ReplayMixer([build_replay(QUEUE, LAYOUT, SHARE, E, lent_batches=1), build_replay(standard, LAYOUT, 2, E)],
                        [SHARE, 2], 0.0, seed=0, lends=True)
    for mark in range(SHARE // E):
        add_rollout(mixer, mark)
    batch = mixer.sample()
    queue = mixer.replays[0].sampler
    assert batch.lent and queue.lent and marks(batch.data["obs"])[:SHARE] == [0, 1, 10, 11]
    mixer.give_back(batch)
    assert not queue.lent


def test_a_batch_that_wraps_around_the_ring_is_read_as_a_copy():
    """Positions that are not one ascending run cannot be a view: read as a copy, and not
    kept from writes (nothing would give them back)."""
    sampler = FifoSampler(5)
    mixer = queue_mixer(lends=True)
    mixer.replays[0].sampler = sampler                       # a ring of 5: the second batch of 4 wraps
    storage = mixer.replays[0].storage
    for mark in range(SHARE // E):
        add_rollout(mixer, mark)
    first = mixer.sample()
    mixer.give_back(first)
    for mark in range(2, 2 + SHARE // E):
        add_rollout(mixer, mark)
    second = mixer.sample()                                  # positions 4, 0, 1, 2
    assert not second.lent and not np.shares_memory(second.data["obs"], storage.arrays["obs"])
    assert marks(second.data["obs"]) == [20, 21, 30, 31] and not sampler.lent


def test_prepared_ahead_batches_stay_intact_while_rollouts_keep_coming():
    """The batch thread prepares lent batches ahead while rollouts keep arriving: every
    batch the learner takes holds its own frames, in order, none lost or overwritten."""
    mixer = queue_mixer(lends=True, lent_batches=3)          # build_mixer's count for these settings
    source = PrefetchedBatches(DirectBatches(mixer, torch.device("cpu")), threads=1, per_round=1, buffer_size=1,
                               writer_queue_size=64, discarding_strategy="keep_latest")
    taken, held = [], []

    def hold_next() -> bool:
        ready = source.next_ready()
        if ready is not None:
            held.append(ready)
        return ready is not None

    try:
        for mark in range(12):
            source.put_rollout(rollout(mark), mark)
            if mark % 3 == 2:
                hold_next()                                  # trained later: still lent meanwhile
        while len(taken) < 12 * E // SHARE:
            for tensors, mixed in held:
                taken.append(marks(tensors["obs"].numpy()))
                source.give_back(mixed)
            held.clear()
            if len(taken) < 12 * E // SHARE:
                assert wait_for(hold_next, 30), f"no batch after {len(taken)}"
    finally:
        source.close()
    assert sum(taken, []) == [10 * mark + e for mark in range(12) for e in range(E)]


def test_direct_batches_lend_and_take_back():
    mixer = queue_mixer(lends=True)
    source = DirectBatches(mixer, torch.device("cpu"))
    source.put_rollout(rollout(0), 0)
    source.put_rollout(rollout(1), 1)
    tensors, mixed = source.next_ready()
    assert mixed.lent and marks(tensors["obs"].numpy()) == [0, 1, 10, 11]
    assert not tensors["obs"].is_contiguous()                # the view, not a copy
    source.give_back(mixed)
    assert not mixer.replays[0].sampler.lent


@pytest.mark.parametrize("network", ["nature_cnn", "resnet"])
@pytest.mark.parametrize("normalize", [False, True], ids=["scaled", "normalised"])
def test_networks_read_strided_frames_in_place_with_the_same_results(network, normalize):
    """A lent batch's frames are strided in time: [T, B] columns of a wider ring. The
    network's output equals that of the same frames made contiguous, in fp32 and under
    bf16 autocast, channels-last or not, and no uint8 frame is copied on the way (counted;
    flattening them first, as the networks did, copies each: the count's control)."""
    torch.manual_seed(0)
    ring = torch.randint(0, 256, (5, 12, 4, 84, 84), dtype=torch.uint8)     # [T, capacity, C, H, W]
    lent = ring[:, 4:8]                                                     # a batch of 4, in place
    model = build_model(network, (4, 84, 84), "uint8", 6, None, normalize_observations=normalize)
    if normalize:
        model.obs_normalizer.update(ring)
    for channels_last in (False, True):
        model.channels_last_when_training = channels_last
        for bf16 in (False, True):
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                counter = CopyCounter((4, 84, 84), np.uint8)
                with TorchCopies(counter):
                    strided = model(lent)
                expected = model(lent.contiguous())
            torch.testing.assert_close(strided.logits, expected.logits, rtol=0, atol=0)
            torch.testing.assert_close(strided.value, expected.value, rtol=0, atol=0)
            assert counter.bytes == 0, counter.by_op
    control = CopyCounter((4, 84, 84), np.uint8)
    with TorchCopies(control):
        lent.reshape(-1, 4, 84, 84)
    assert control.bytes >= lent.numel()
