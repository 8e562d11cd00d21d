"""Replay storage through a checkpoint: empty (a stop before the first rollout reached the
replay) and partly filled, with and without compressed observations."""
import numpy as np
import pytest

from herd.checkpoint import load_checkpoint, save_checkpoint
from herd.replay.storage import TrajectoryStorage
from herd.algos.impala import impala_layout

LAYOUT = impala_layout(unroll_length=3, obs_shape=(2, 6, 6), obs_dtype="uint8", num_actions=3, feature_size=4)


def trajectory(rng):
    return {name: rng.integers(0, 100, size=shape).astype(dtype) for name, (shape, dtype) in LAYOUT.fields().items()}


@pytest.mark.parametrize("source_compressed", [False, True])
@pytest.mark.parametrize("target_compressed", [False, True])
@pytest.mark.parametrize("filled", [0, 2])
def test_state_survives_a_checkpoint(tmp_path, filled, source_compressed, target_compressed):
    rng = np.random.default_rng(filled)
    source = TrajectoryStorage(LAYOUT, capacity=4, compress_obs=source_compressed)
    written = [trajectory(rng) for _ in range(filled)]
    for position, traj in enumerate(written):
        source.write(position, traj, version=10 + position)

    save_checkpoint({"replay": source.state_dict(filled)}, tmp_path, update=1)
    state, _ = load_checkpoint(tmp_path)
    target = TrajectoryStorage(LAYOUT, capacity=4, compress_obs=target_compressed)
    target.load_state_dict(state["replay"])

    assert state["replay"]["packed_offsets"].shape == (filled, LAYOUT.unroll_length + 2)
    np.testing.assert_array_equal(target.version[:filled], 10 + np.arange(filled))
    assert (target.version[filled:] == -1).all()           # nothing invented beyond what was stored
    if filled:
        batch = target.read(np.arange(filled))
        for name in LAYOUT.fields():
            for position, traj in enumerate(written):
                np.testing.assert_array_equal(batch[name][:, position], traj[name], err_msg=name)
