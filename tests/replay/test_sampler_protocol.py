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
from herd.models import MLPNet
from herd.replay.circular import CircularSampler
from herd.store import TrajectoryStore
from herd.replay.elite import EliteSampler
from herd.replay.mixer import ReplayMixer
from herd.replay.prioritized import PrioritizedSampler
from herd.replay.registry import REPLAY_KINDS, build_replay
from herd.replay.replay import Replay
from herd.replay.samplers import FifoSampler, UniformSampler
from herd.replay.spec import batch_shares, parse_replay_parameters

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


@pytest.mark.parametrize("storage_device", [None, torch.device("cpu")], ids=["host", "device"])
def test_every_replay_kind_has_a_sampler_here(storage_device):
    built = {type(build_replay(spec, LAYOUT, 1, 1, storage_device=storage_device).sampler)
             for spec in parse_replay_parameters(json.dumps(
                 [{"type": kind, "capacity": 4, "sample_ratio": 1 / len(REPLAY_KINDS), **({"dist_function": "ln_norm"}
                   if kind == "custom" else {})} for kind in REPLAY_KINDS]))}
    assert built <= {type(make()) for make in SAMPLERS.values()}


def test_a_device_learner_keeps_every_replay_kind_in_device_storage():
    """storage_device set: no replay kind falls back to host storage (the issue's list:
    queue, uniform, elite, attentive, prioritized; circular too)."""
    specs = parse_replay_parameters(json.dumps(
        [{"type": kind, "capacity": 4, "sample_ratio": 1 / len(REPLAY_KINDS), **({"dist_function": "ln_norm"}
          if kind == "custom" else {})} for kind in REPLAY_KINDS]))
    for spec in specs:
        replay = build_replay(spec, LAYOUT, 1, 1, storage_device=torch.device("cpu"))
        assert not replay.storage.on_host and replay.storage.arrays == {}, spec.type
        assert spec.type != "prioritized" or replay.sampler.device == replay.storage.device   # priorities too
        host = build_replay(spec, LAYOUT, 1, 1)
        assert host.storage.on_host and host.storage.arrays, spec.type        # a CPU learner: nothing changes


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
    """on_device: the storage a GPU learner's replays use (herd/store.py),
    here holding CPU tensors: the protocol is the same whichever storage holds the items."""
    storage = (TrajectoryStore(LAYOUT, capacity, torch.device("cpu")) if on_device
               else TrajectoryStore(LAYOUT, capacity))
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
    source = (PrefetchedBatches(DirectBatches(mixer, torch.device("cpu")), threads=1, per_round=1, buffer_size=2,
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


# -- custom (elite/attentive) and prioritized replays on either storage ---------------------

def scoring_model() -> MLPNet:
    torch.manual_seed(0)
    return MLPNet(obs_dim=3, num_actions=2, hidden_sizes=(4,), feature_size=2)


OFF_POLICY = {
    "elite": {"type": "custom", "dist_function": "ln_norm", "sample_strategy": "elite_sampling",
              "insert_strategy": "elite_insertion", "elite_batch_size": 3, "lambda_batch_multiplier": 2,
              "elite_sampling_strategy": "strategy1"},
    "attentive": {"type": "custom", "dist_function": "cos_dist", "sample_strategy": "attentive_sampling",
                  "lambda_batch_multiplier": 2, "elite_sampling_strategy": "strategy4"},
    "prioritized": {"type": "prioritized", "alpha": 0.7, "beta": 0.5},
}


def off_policy_replay(kind: str, on_device: bool, capacity: int = 4):
    spec = parse_replay_parameters(json.dumps([{**OFF_POLICY[kind], "capacity": capacity, "sample_ratio": 1}]))[0]
    replay = build_replay(spec, LAYOUT, 2, 1, n_step=2, seed=3,
                          storage_device=torch.device("cpu") if on_device else None)
    replay.attach_model(scoring_model(), "cpu")
    return replay


def varied_trajectory(tag: int) -> dict:
    """Fields hold `tag` (what a test reads back per column); obs and features vary with it so
    that elite scoring has distances to rank."""
    data = trajectory(float(tag))
    rng = np.random.default_rng(tag)
    data["obs"] = rng.normal(size=data["obs"].shape).astype(np.float32)
    data["features"] = rng.normal(size=data["features"].shape).astype(np.float32)
    return data


def host(value):
    return value.numpy() if isinstance(value, torch.Tensor) else np.asarray(value)


@pytest.mark.parametrize("kind", OFF_POLICY)
def test_off_policy_replays_sample_the_same_on_device_storage_as_on_the_host(kind):
    """The same seed, model and trajectories: the device replay (scoring from device tensors,
    elite insertion included; priorities in device memory) draws exactly what the host one
    draws and returns the same data, as device tensors. Catches a device read_steps that
    gathers the wrong steps or positions (other distances, other picks), a device sampler
    that draws differently, and a batch that is left on the host."""
    replays = [off_policy_replay(kind, on_device) for on_device in (False, True)]
    rngs = [np.random.default_rng(5), np.random.default_rng(5)]
    for tag in range(7):                                    # 7 into 4: elite insertion evicts by score
        for replay in replays:
            replay.add(varied_trajectory(tag), version=tag)
    assert replays[0].generation.tolist() == replays[1].generation.tolist()
    for _ in range(3):
        (a, va, ka, pa), (b, vb, kb, pb) = (r.sample(2, g) for r, g in zip(replays, rngs))
        assert ka.positions.tolist() == kb.positions.tolist() and va.tolist() == vb.tolist()
        assert np.allclose(pa, pb)
        assert set(a) == set(b)
        for name in a:
            assert isinstance(b[name], torch.Tensor), name
            np.testing.assert_allclose(host(b[name]), host(a[name]), rtol=1e-6, err_msg=name)
        for replay in replays:
            replay.update(ka, np.array([0.5, 3.0]))
            replay.add(varied_trajectory(int(va[0]) + 10), version=int(va[0]) + 10)
    assert replays[0].generation.tolist() == replays[1].generation.tolist()


@pytest.mark.parametrize("kind", OFF_POLICY)
@STORAGES
def test_off_policy_updates_for_overwritten_items_are_dropped_on_either_storage(kind, on_device):
    """The keys protocol on the custom and prioritized replays with device storage too:
    an update reaches only items still holding what was sampled, values given as numpy or
    as (device) tensors. Catches a device replay that applies an update to a newcomer or
    refuses a tensor of values."""
    replay = off_policy_replay(kind, on_device, capacity=3)
    for tag in range(3):
        replay.add(varied_trajectory(tag), version=tag)
    _, versions, keys, _ = replay.sample(4, np.random.default_rng(0))
    per_item = replay.items_per_trajectory
    oldest = int(np.argmin(replay.storage.version))
    replay.add(varied_trajectory(9), version=9)                 # ring order (no elite insertion below capacity+1)
    written = int(np.argmax(replay.storage.version))
    values = torch.tensor([7.0, 8.0, 9.0, 10.0]) if on_device else np.array([7.0, 8.0, 9.0, 10.0])
    applied = replay.update(keys, values)
    overwritten = keys.positions // per_item == written
    assert applied == int(np.count_nonzero(~overwritten)) and replay.stale_updates == int(np.count_nonzero(overwritten))
    if kind == "prioritized":
        leaves = replay.sampler.state_dict()["tree"]["leaves"]     # one format for both samplers
        expected = {int(leaf): (v + 1e-6) ** 0.7 for leaf, v, stale in zip(keys.positions, [7.0, 8.0, 9.0, 10.0],
                                                                         overwritten) if not stale}
        for leaf, value in expected.items():
            assert leaves[leaf] == pytest.approx(value)
        newcomer = leaves[written * per_item:(written + 1) * per_item]
        assert np.all(newcomer < (7.0 + 1e-6) ** 0.7)            # the newcomer kept the max-priority rule's value
    assert written == oldest or kind == "elite"


def test_the_mixer_hands_a_device_tensor_of_priorities_to_a_device_replay():
    """The learner's priorities [B] as a tensor through ReplayMixer.update: each replay gets
    its columns, sliced where the tensor is (a GPU learner's values need no host read).
    Catches a mixer that turns the values into numpy first (fails for a CUDA tensor) or
    hands a replay the wrong columns."""
    specs = parse_replay_parameters('[{"type": "prioritized", "capacity": 2, "sample_ratio": 0.5, "alpha": 1.0},'
                                    ' {"type": "prioritized", "capacity": 2, "sample_ratio": 0.5, "alpha": 1.0}]')
    replays = [build_replay(spec, LAYOUT, 2, 1, storage_device=torch.device("cpu")) for spec in specs]
    mixer = ReplayMixer(replays, [2, 2], fill_in_factor=1.0, seed=0)
    for tag in range(2):
        mixer.add(trajectory(tag), version=tag)
    mixed = mixer.sample()
    seen = []

    def recording(update):
        def record(positions, values):
            assert isinstance(values, torch.Tensor)
            seen.append(values.tolist())
            update(positions, values)
        return record

    for replay in replays:
        replay.sampler.update = recording(replay.sampler.update)
    assert mixer.update(mixed.keys, torch.tensor([10.0, 20.0, 30.0, 40.0])) == 4
    assert seen == [[10.0, 20.0], [30.0, 40.0]]
    for replay, (index, _, keys) in zip(replays, mixed.keys):
        leaves = replay.sampler.state_dict()["tree"]["leaves"]
        assert leaves[keys.positions[-1]] == pytest.approx(20.0 + 20.0 * index, rel=1e-6)
