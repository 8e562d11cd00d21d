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


@pytest.mark.parametrize("saved_on_device", [False, True])
@pytest.mark.parametrize("filled", [0, 3])
def test_device_storage_keeps_the_checkpoint_format(tmp_path, saved_on_device, filled):
    """Replays in device memory (herd/replay/device_storage.py, here with CPU tensors) save
    the host storage's format and load it: a checkpoint from a GPU learner resumes on a CPU
    one and the other way round. Catches a device storage that saves its own format or
    loses a field, a position or a version."""
    import torch
    from herd.replay.device_storage import DeviceTrajectoryStorage

    rng = np.random.default_rng(filled + 10)
    written = [trajectory(rng) for _ in range(filled)]

    def make(device_side: bool):
        return (DeviceTrajectoryStorage(LAYOUT, 4, torch.device("cpu")) if device_side
                else TrajectoryStorage(LAYOUT, capacity=4, compress_obs=True))

    source = make(saved_on_device)
    for position, traj in enumerate(written):
        source.write(position, traj, version=5 + position)
    save_checkpoint({"replay": source.state_dict(filled)}, tmp_path, update=1)
    state, _ = load_checkpoint(tmp_path)
    target = make(not saved_on_device)
    target.load_state_dict(state["replay"])
    np.testing.assert_array_equal(target.version[:filled], 5 + np.arange(filled))
    assert (target.version[filled:] == -1).all()
    if filled:
        batch = target.read(np.array([2, 0]))
        for name in LAYOUT.fields():
            for column, position in enumerate((2, 0)):
                got = batch[name][:, column]
                got = got.numpy() if isinstance(got, torch.Tensor) else got
                np.testing.assert_array_equal(got, written[position][name], err_msg=name)
