"""Trajectory storage with and without LZ4-compressed observations."""
import numpy as np
import pytest

from herd.store import TrajectoryStore
from herd.algos.impala import impala_layout

LAYOUT = impala_layout(unroll_length=4, obs_shape=(4, 84, 84), obs_dtype="uint8", num_actions=6, feature_size=8)


def trajectory(rng, tag):
    out = {}
    for name, (shape, dtype) in LAYOUT.fields().items():
        if name == "obs":
            frame = np.zeros(shape, dtype=dtype)
            frame[..., 20:40, 30:50] = rng.integers(0, 255, size=(20, 20))  # a sprite on a blank screen
            out[name] = frame
        else:
            out[name] = np.full(shape, tag, dtype=dtype)
    return out


@pytest.mark.parametrize("compress", [False, True])
def test_reads_back_what_was_written(compress):
    rng = np.random.default_rng(0)
    storage = TrajectoryStore(LAYOUT, capacity=6, compress_obs=compress)
    written = [trajectory(rng, tag) for tag in range(6)]
    for position, traj in enumerate(written):
        storage.write(position, traj, version=position)
    batch = storage.read(np.array([4, 1]))
    assert batch["obs"].shape == (5, 2, 4, 84, 84) and batch["obs"].dtype == np.uint8
    np.testing.assert_array_equal(batch["obs"][:, 0], written[4]["obs"])
    np.testing.assert_array_equal(batch["action"][:, 1], written[1]["action"])


def test_compression_saves_memory_on_frames():
    rng = np.random.default_rng(0)
    plain = TrajectoryStore(LAYOUT, capacity=8)
    packed = TrajectoryStore(LAYOUT, capacity=8, compress_obs=True)
    for position in range(8):
        traj = trajectory(rng, position)
        plain.write(position, traj, 0)
        packed.write(position, traj, 0)
    assert packed.nbytes() < plain.nbytes() / 4


def test_state_round_trip_between_compressed_and_plain():
    rng = np.random.default_rng(1)
    source = TrajectoryStore(LAYOUT, capacity=3, compress_obs=True)
    trajs = [trajectory(rng, t) for t in range(3)]
    for position, traj in enumerate(trajs):
        source.write(position, traj, position)
    for target in (TrajectoryStore(LAYOUT, 3, compress_obs=True), TrajectoryStore(LAYOUT, 3)):
        target.load_state_dict(source.state_dict(3))
        np.testing.assert_array_equal(target.read(np.array([2]))["obs"][:, 0], trajs[2]["obs"])
    plain = TrajectoryStore(LAYOUT, 3)
    for position, traj in enumerate(trajs):
        plain.write(position, traj, position)
    packed = TrajectoryStore(LAYOUT, 3, compress_obs=True)
    packed.load_state_dict(plain.state_dict(3))
    np.testing.assert_array_equal(packed.read(np.array([0]))["obs"][:, 0], trajs[0]["obs"])


def test_checkpoint_state_packs_observations():
    rng = np.random.default_rng(2)
    storage = TrajectoryStore(LAYOUT, capacity=4)
    for position in range(4):
        storage.write(position, trajectory(rng, position), position)
    state = storage.state_dict(4)
    assert "obs" not in state["arrays"] and len(state["packed_obs"]) == 4
    assert sum(p.nbytes for p in state["packed_obs"]) < storage.arrays["obs"].nbytes / 4


def test_checkpoints_saved_with_one_frame_per_trajectory_still_load():
    """Checkpoints written before per-step packing hold one LZ4 frame per trajectory."""
    import lz4.frame
    rng = np.random.default_rng(3)
    trajs = [trajectory(rng, t) for t in range(2)]
    source = TrajectoryStore(LAYOUT, 2)
    for position, traj in enumerate(trajs):
        source.write(position, traj, position)
    state = source.state_dict(2)
    del state["packed_offsets"]
    state["packed_obs"] = [np.frombuffer(lz4.frame.compress(t["obs"].tobytes()), dtype=np.uint8) for t in trajs]
    for target in (TrajectoryStore(LAYOUT, 2, compress_obs=True), TrajectoryStore(LAYOUT, 2)):
        target.load_state_dict(state)
        np.testing.assert_array_equal(target.read(np.array([1, 0]))["obs"][:, 0], trajs[1]["obs"])
        np.testing.assert_array_equal(target.read_steps(np.array([0]), np.array([3]), ("obs",))["obs"][0, 0],
                                      trajs[0]["obs"][3])
