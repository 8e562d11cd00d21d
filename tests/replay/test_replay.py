"""Replay storage, samplers and the mixer on hand-built trajectories."""
import numpy as np

from herd.replay.spec import parse_replay_parameters
from herd.replay.mixer import ReplayMixer
from herd.replay.registry import build_replay
from herd.replay.samplers import FifoSampler, UniformSampler
from herd.algos.impala import impala_layout

LAYOUT = impala_layout(unroll_length=3, obs_shape=(2,), obs_dtype="float32", num_actions=2, feature_size=4)


def trajectory(tag: int) -> dict:
    """A trajectory whose every field carries `tag`, so a sample says where it came from."""
    out = {}
    for name, (shape, dtype) in LAYOUT.fields().items():
        out[name] = np.full(shape, tag % 2 if dtype == np.bool_ else tag, dtype=dtype)
    return out


def test_fifo_returns_each_trajectory_once_oldest_first():
    rng = np.random.default_rng(0)
    sampler = FifoSampler(capacity=4)
    for _ in range(3):
        sampler.add()
    assert sampler.available() == 3
    assert list(sampler.sample(2, rng)[0]) == [0, 1]
    assert list(sampler.sample(1, rng)[0]) == [2]
    assert sampler.available() == 0


def test_fifo_overflow_forgets_the_overwritten_position():
    sampler = FifoSampler(capacity=2)
    for _ in range(3):
        sampler.add()
    assert list(sampler.sample(2, np.random.default_rng(0))[0]) == [1, 0]


def test_uniform_samples_only_filled_positions_without_replacement():
    sampler = UniformSampler(capacity=10)
    for _ in range(4):
        sampler.add()
    rng = np.random.default_rng(1)
    for _ in range(50):
        positions, _ = sampler.sample(4, rng)
        assert sorted(positions) == [0, 1, 2, 3]
    assert set(sampler.sample(8, rng)[0]) <= {0, 1, 2, 3}


def test_replay_reads_time_major_batches():
    spec = parse_replay_parameters('[{"type": "standard", "capacity": 5, "sample_ratio": 1}]')[0]
    replay = build_replay(spec, LAYOUT, share=2, rollout_size=1)
    for tag in range(7):  # wraps around the ring of 5
        replay.add(trajectory(tag), version=tag)
    data, versions, _, _ = replay.sample(5, np.random.default_rng(0))
    assert data["obs"].shape == (4, 5, 2) and data["behaviour_logits"].shape == (3, 5, 2)
    tags = sorted(int(v) for v in data["action"][0])
    assert tags == [2, 3, 4, 5, 6]        # the two oldest were overwritten
    assert sorted(versions) == tags


def test_queue_capacity_never_drops_unused_fresh_data():
    spec = parse_replay_parameters('[{"type": "queue", "capacity": 1, "sample_ratio": 1}]')[0]
    replay = build_replay(spec, LAYOUT, share=3, rollout_size=4)
    for tag in range(4):
        replay.add(trajectory(tag), version=0)
    assert replay.available() == 4


def make_mixer(text: str, batch_size: int, fill: float = 0.0) -> ReplayMixer:
    from herd.replay.spec import batch_shares
    specs = parse_replay_parameters(text)
    shares = batch_shares(specs, batch_size)
    replays = [build_replay(s, LAYOUT, share, 2) for s, share in zip(specs, shares)]
    return ReplayMixer(replays, shares, fill, seed=0)


def test_mixer_draws_each_share_and_marks_replayed_columns():
    mixer = make_mixer('[{"type": "queue", "capacity": 1, "sample_ratio": 0.5},'
                       '{"type": "standard", "capacity": 100, "sample_ratio": 0.5}]', batch_size=4)
    for tag in range(1, 3):
        mixer.add(trajectory(tag), version=tag)
        assert mixer.ready() is (tag == 2)
    mixed = mixer.sample()
    batch, replayed = mixed.data, mixed.replayed
    assert batch["obs"].shape == (4, 4, 2)
    assert list(replayed) == [False, False, True, True]
    assert list(batch["action"][0, :2]) == [1, 2]          # the queue share is the fresh data, in order
    assert not mixer.ready()                                  # fresh data were used once


def test_mixer_waits_for_the_fill_in_factor():
    mixer = make_mixer('[{"type": "queue", "capacity": 1, "sample_ratio": 0.5},'
                       '{"type": "standard", "capacity": 20, "sample_ratio": 0.5}]', batch_size=2, fill=0.5)
    for tag in range(9):
        mixer.add(trajectory(tag), version=0)
        mixer.replays[0].sampler.sample(mixer.replays[0].available(), mixer.rng)  # drain the queue
    mixer.add(trajectory(9), version=0)
    assert mixer.ready()  # 10 of 20 stored = 0.5


def test_mixer_without_queue_trains_once_per_batch_of_fresh_data():
    mixer = make_mixer('[{"type": "standard", "capacity": 50, "sample_ratio": 1}]', batch_size=3)
    count = 0
    for tag in range(9):
        mixer.add(trajectory(tag), version=0)
        while mixer.ready():
            mixer.sample()
            count += 1
    assert count == 3


def test_mixer_state_round_trip():
    text = '[{"type": "queue", "capacity": 1, "sample_ratio": 0.5}, {"type": "standard", "capacity": 8, "sample_ratio": 0.5}]'
    mixer = make_mixer(text, batch_size=2)
    for tag in range(5):
        mixer.add(trajectory(tag), version=tag)
    copy = make_mixer(text, batch_size=2)
    copy.load_state_dict(mixer.state_dict())
    copy.rng = np.random.default_rng(5)
    mixer.rng = np.random.default_rng(5)
    first, second = mixer.sample(), copy.sample()
    a, va, b, vb = first.data, first.versions, second.data, second.versions
    for name in a:
        np.testing.assert_array_equal(a[name], b[name])
    np.testing.assert_array_equal(va, vb)


def test_a_state_loaded_without_its_fresh_data_keeps_the_replays_and_starts_the_queue_empty():
    """load_state_dict(fresh=False), as a resume with another --learner_count does (the
    queue's capacity follows the batch share): catches a load that restores the saved
    queue anyway (old fresh data trained as fresh), or drops the off-policy replays too.
    Every field of trajectory `tag` holds `tag`, so a batch says where each column came from."""
    text = '[{"type": "queue", "capacity": 1, "sample_ratio": 0.5}, {"type": "standard", "capacity": 8, "sample_ratio": 0.5}]'
    mixer = make_mixer(text, batch_size=2)
    for tag in range(5):
        mixer.add(trajectory(tag), version=tag)
    assert mixer.replays[0].available() > 0                  # saved with unused fresh data waiting
    state = mixer.state_dict()

    same = make_mixer(text, batch_size=2)
    same.load_state_dict(state)                               # fresh=True: the waiting data come back
    assert same.replays[0].available() == mixer.replays[0].available()

    other = make_mixer(text, batch_size=4)                    # another batch share
    other.load_state_dict(state, fresh=False)
    assert other.replays[0].available() == 0 and not other.ready()
    assert other.replays[1].available() == mixer.replays[1].available() == 5
    for tag in (7, 8):
        other.add(trajectory(tag), version=tag)
    assert other.ready()
    mixed = other.sample()
    fresh, replayed = mixed.data["action"][0, :2], mixed.data["action"][0, 2:]      # [B] columns by share
    assert list(mixed.replayed) == [False, False, True, True]
    assert list(fresh) == [7, 8]                              # only what arrived after the load
    assert set(replayed.tolist()) <= {0, 1, 2, 3, 4, 7, 8}    # the saved replay (and the new writes to it)
