"""The sampler protocol of herd/replay/samplers.py, checked on every sampler herd has, and
the keys that carry the learner's updates back to the right items, through the mixer and
the prefetching threads, even after an item was overwritten."""
from __future__ import annotations

import copy
import json
import time

import numpy as np
import pytest
import torch

from herd.algos.impala import impala_layout
from herd.learner.batches import DirectBatches, PrefetchedBatches
from herd.replay.circular import CircularSampler
from herd.replay.device_storage import DeviceTrajectoryStorage
from herd.replay.elite import EliteSampler
from herd.replay.mixer import ReplayMixer
from herd.replay.prioritized import PrioritizedSampler
from herd.replay.registry import REPLAY_KINDS, build_replay
from herd.replay.replay import Replay
from herd.replay.samplers import FifoSampler, UniformSampler
from herd.replay.spec import batch_shares, parse_replay_parameters
from herd.replay.storage import TrajectoryStorage

CAPACITY = 6
LAYOUT = impala_layout(unroll_length=2, obs_shape=(3,), obs_dtype="float32", num_actions=2, feature_size=2)


def by_position(positions, rng, *_):
    return positions.astype(np.float64)   # a fake scorer: the distance is the position


def elite(**options) -> EliteSampler:
    sampler = EliteSampler(CAPACITY, **options)
    sampler.set_scorer(by_position)
    sampler.set_attentive_scorer(by_position)
    return sampler


SAMPLERS = {
    "fifo": lambda: FifoSampler(CAPACITY),
    "uniform": lambda: UniformSampler(CAPACITY),
    "custom, no strategy": lambda: elite(),
    "elite sampling": lambda: elite(sample_strategy="elite_sampling", lambda_batch_multiplier=3),
    "attentive sampling": lambda: elite(sample_strategy="attentive_sampling", lambda_batch_multiplier=3),
    "elite insertion": lambda: elite(insert_strategy="elite_insertion", elite_batch_size=4),
    "prioritized": lambda: PrioritizedSampler(CAPACITY, alpha=0.6, beta=0.4, beta_annealing_steps=5),
    "circular": lambda: CircularSampler(num_batches=3, share=2, iterations=2),   # batches of 2: sample(2)
}


def test_every_replay_kind_has_a_sampler_here():
    built = {type(build_replay(spec, LAYOUT, 1, 1).sampler) for spec in parse_replay_parameters(json.dumps(
        [{"type": kind, "capacity": 4, "sample_ratio": 1 / len(REPLAY_KINDS), **({"dist_function": "ln_norm"}
          if kind == "custom" else {})} for kind in REPLAY_KINDS]))}
    assert built <= {type(make()) for make in SAMPLERS.values()}


@pytest.mark.parametrize("name", SAMPLERS)
def test_add_gives_positions_inside_the_capacity(name):
    sampler = SAMPLERS[name]()
    positions = [sampler.add() for _ in range(CAPACITY + 4)]
    assert all(0 <= p < CAPACITY for p in positions)
    assert sorted(positions[:CAPACITY]) == list(range(CAPACITY))    # fills every position before reusing one
    assert sampler.stored() == CAPACITY and 0 < sampler.available() <= CAPACITY


@pytest.mark.parametrize("name", SAMPLERS)
def test_sample_gives_stored_positions_and_their_probabilities(name):
    sampler = SAMPLERS[name]()
    for _ in range(4):
        sampler.add()
    positions, probabilities = sampler.sample(2, np.random.default_rng(0))
    assert positions.dtype == np.int64 and positions.shape == (2,) and set(positions) <= {0, 1, 2, 3}
    assert probabilities.shape == (2,) and np.all((probabilities > 0) & (probabilities <= 1))


@pytest.mark.parametrize("name", SAMPLERS)
def test_update_is_accepted_and_state_round_trips(name):
    sampler = SAMPLERS[name]()
    for _ in range(CAPACITY + 2):
        sampler.add()
    sampler.update(np.array([0, 1]), np.array([0.5, 2.0]))
    twin = SAMPLERS[name]()
    twin.load_state_dict(copy.deepcopy(sampler.state_dict()))
    for _ in range(3):   # the same state and the same rng: the same choices, insertions included
        a, b = sampler.sample(2, np.random.default_rng(7)), twin.sample(2, np.random.default_rng(7))
        assert a[0].tolist() == b[0].tolist() and np.allclose(a[1], b[1])
        assert sampler.add() == twin.add()


class RecordingSampler(UniformSampler):
    """A uniform sampler that remembers the updates it was given (what a prioritized one
    would turn into priorities)."""

    def __init__(self, capacity: int):
        super().__init__(capacity)
        self.updates: dict[int, float] = {}

    def update(self, positions, values):
        self.updates.update(zip(positions.tolist(), values.tolist()))


def trajectory(tag: float) -> dict:
    return {name: np.full(shape, tag, dtype=dtype) for name, (shape, dtype) in LAYOUT.fields().items()}


def recording_replay(capacity: int = 3, on_device: bool = False) -> Replay:
    """on_device: the storage a GPU learner's replays use (herd/replay/device_storage.py),
    here holding CPU tensors: the protocol is the same whichever storage holds the items."""
    storage = (DeviceTrajectoryStorage(LAYOUT, capacity, torch.device("cpu")) if on_device
               else TrajectoryStorage(LAYOUT, capacity))
    return Replay("recording", storage, RecordingSampler(capacity), on_policy=False)


STORAGES = pytest.mark.parametrize("on_device", [False, True], ids=["host-storage", "device-storage"])


@STORAGES
def test_an_update_for_an_overwritten_item_is_dropped_and_counted(on_device):
    replay = recording_replay(on_device=on_device)
    for tag in range(3):
        replay.add(trajectory(tag), version=tag)
    data, _, keys, _ = replay.sample(3, np.random.default_rng(0))
    tags = [float(t) for t in data["reward"][0]]                     # which trajectory each column holds
    replay.add(trajectory(9), version=9)                            # overwrites position 0 (ring order)
    applied = replay.update(keys, np.array(tags) + 100)
    assert applied == 2 and replay.stale_updates == 1
    assert replay.sampler.updates == {p: t + 100 for p, t in zip(keys.positions.tolist(), tags) if p != 0}


@STORAGES
def test_keys_survive_a_checkpoint(on_device):
    replay = recording_replay(on_device=on_device)
    for tag in range(4):
        replay.add(trajectory(tag), version=tag)
    twin = recording_replay(on_device=not on_device)
    twin.load_state_dict(replay.state_dict())
    assert twin.generation.tolist() == replay.generation.tolist() == [2, 1, 1]


@STORAGES
@pytest.mark.parametrize("prefetched", [False, True])
def test_keys_reach_the_learner_through_the_mixer_and_the_threads(prefetched, on_device):
    specs = parse_replay_parameters('[{"type": "queue", "capacity": 1, "sample_ratio": 0.5},'
                                    ' {"type": "standard", "capacity": 4, "sample_ratio": 0.5}]')
    shares = batch_shares(specs, 4)
    replays = [build_replay(specs[0], LAYOUT, shares[0], 2, storage_device=torch.device("cpu") if on_device else None),
               recording_replay(capacity=4, on_device=on_device)]
    mixer = ReplayMixer(replays, shares, fill_in_factor=1.0, seed=0)
    source = (PrefetchedBatches(mixer, torch.device("cpu"), threads=1, per_round=1, buffer_size=2,
                                writer_queue_size=8, discarding_strategy="wait") if prefetched
              else DirectBatches(mixer, torch.device("cpu")))
    try:
        for tag in range(0, 4, 2):
            source.put([trajectory(tag), trajectory(tag + 1)], version=tag)
        deadline = time.monotonic() + 10
        while (ready := source.next_ready()) is None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert ready is not None
        tensors, mixed = ready
        (queue_index, queue_columns, _), (replay_index, columns, keys) = mixed.keys
        assert (queue_index, replay_index) == (0, 1) and columns == slice(2, 4)
        replayed_tags = tensors["reward"][0, columns].tolist()
        keys_now = [(i, c, k) for i, c, k in mixed.keys if i == 1]
        assert source.update(keys_now, np.array([0.0, 0.0, 5.0, 6.0])) == 2      # nothing overwritten yet
        assert replays[1].sampler.updates == dict(zip(keys.positions.tolist(), [5.0, 6.0]))
        replays[1].sampler.updates.clear()
        # Four more trajectories overwrite every position of the 4-slot replay before the
        # learner answers: each update must now be refused, not land on the newcomer.
        source.put([trajectory(10), trajectory(11)], version=4)
        source.put([trajectory(12), trajectory(13)], version=4)
        deadline = time.monotonic() + 10
        while replays[1].generation.sum() < 8 and time.monotonic() < deadline:
            source.next_ready()          # lets the writer thread take what waits
            time.sleep(0.01)
        assert replays[1].generation.sum() == 8
        values = np.arange(4, dtype=np.float64)
        assert source.update(mixed.keys, values) == 0
        assert replays[1].stale_updates == 2 and replays[1].sampler.updates == {}
        assert set(replayed_tags) <= {0.0, 1.0, 2.0, 3.0}
    finally:
        source.close()
