"""Ape-X's transition batches gathered on the device (herd/replay/transitions.py
device_transition_batch, on CPU tensors standing in for the GPU) equal the numpy ones:
the same n-step windows, cuts and bootstrap observations."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from herd.algos import trajectory_layout
from herd.algos.apex import APEX
from herd.replay.device_storage import DeviceTrajectoryStorage
from herd.replay.storage import TrajectoryStorage
from herd.replay.transitions import device_transition_batch, transition_batch

CPU = torch.device("cpu")
T = 5
LAYOUT = trajectory_layout(APEX, T, (2,), "float32", 2, 8)


def stored(storages, rng):
    """Four trajectories, episode ends inside some: the same data in each storage."""
    for position in range(4):
        data = {name: rng.normal(size=shape).astype(dtype) for name, (shape, dtype) in LAYOUT.fields().items()}
        data["action"] = rng.integers(0, 2, size=data["action"].shape).astype(data["action"].dtype)
        data["done"] = rng.random(T) < 0.3
        for storage in storages:
            storage.write(position, data, version=position)


@pytest.mark.parametrize("n_step", [1, 3, T + 2])
def test_device_transition_batch_equals_the_host_one(n_step):
    """Every (position, step) of four trajectories, with windows cut at the trajectory's end
    and episode ends inside them: device_transition_batch gives the numpy transition_batch's
    fields, shapes, dtypes and values. Catches a window gathered from the wrong rows or
    columns, a missing cut (valid, zeros past the end) or a wrong bootstrap observation."""
    host, device = TrajectoryStorage(LAYOUT, 4), DeviceTrajectoryStorage(LAYOUT, 4, CPU)
    stored((host, device), np.random.default_rng(n_step))
    positions, steps = np.divmod(np.random.default_rng(0).permutation(4 * T), T)
    expected = transition_batch(host, positions, steps, n_step)
    got = device_transition_batch(device, positions, steps, n_step)
    assert set(got) == set(expected)
    for name, value in expected.items():
        assert isinstance(got[name], torch.Tensor) and got[name].numpy().dtype == value.dtype, name
        np.testing.assert_array_equal(got[name].numpy(), value, err_msg=name)
    assert expected["done"].any() and (n_step == 1 or not expected["valid"].all())   # the data exercises both
