"""Ape-X's transition batches (herd/replay/transitions.py transition_batch, one gather for
every storage) against a slow transcription of the n-step windows: the host storage with
and without LZ4-packed observations, and the device storage on CPU tensors standing in for
a GPU's."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from herd.algos import trajectory_layout
from herd.algos.apex import APEX
from herd.store import TrajectoryStore
from herd.replay.transitions import transition_batch

CPU = torch.device("cpu")
T = 5
LAYOUT = trajectory_layout(APEX, T, (2,), "float32", 2, 8)


def stored(storages, rng) -> list[dict]:
    """Four trajectories, episode ends inside some: the same data in each storage."""
    written = []
    for position in range(4):
        data = {name: rng.normal(size=shape).astype(dtype) for name, (shape, dtype) in LAYOUT.fields().items()}
        data["action"] = rng.integers(0, 2, size=data["action"].shape).astype(data["action"].dtype)
        data["done"] = rng.random(T) < 0.3
        for storage in storages:
            storage.write(position, data, version=position)
        written.append(data)
    return written


def slow_transitions(data: dict, positions, steps, n_step: int) -> dict[str, np.ndarray]:
    """The module doc's table, one column and one window step at a time."""
    B = len(positions)
    out = {"obs": np.zeros((2, B, *data[0]["obs"].shape[1:]), data[0]["obs"].dtype),
           "action": np.zeros((1, B), data[0]["action"].dtype), "valid": np.zeros((n_step, B), bool)}
    for name in ("reward", "done", "trunc_value"):
        out[name] = np.zeros((n_step, B), data[0][name].dtype)
    for b, (p, t) in enumerate(zip(positions, steps)):
        trajectory = data[p]
        out["obs"][0, b], out["obs"][1, b] = trajectory["obs"][t], trajectory["obs"][min(t + n_step, T)]
        out["action"][0, b] = trajectory["action"][t]
        for i in range(n_step):
            if t + i < T:
                out["valid"][i, b] = True
                for name in ("reward", "done", "trunc_value"):
                    out[name][i, b] = trajectory[name][t + i]
    return out


@pytest.mark.parametrize("n_step", [1, 3, T + 2])
def test_every_storage_gathers_the_transcribed_windows(n_step):
    """Every (position, step) of four trajectories, with windows cut at the trajectory's end
    and episode ends inside them: the same fields, shapes, dtypes and values from each
    storage as from the transcription. Catches a window gathered from the wrong rows or
    columns, a missing cut (valid, zeros past the end) or a wrong bootstrap observation."""
    storages = (TrajectoryStore(LAYOUT, 4), TrajectoryStore(LAYOUT, 4, compress_obs=True),
                TrajectoryStore(LAYOUT, 4, CPU))
    data = stored(storages, np.random.default_rng(n_step))
    positions, steps = np.divmod(np.random.default_rng(0).permutation(4 * T), T)
    expected = slow_transitions(data, positions, steps, n_step)
    assert expected["done"].any() and (n_step == 1 or not expected["valid"].all())   # the data exercises both
    for storage in storages:
        got = transition_batch(storage, positions, steps, n_step)
        assert set(got) == set(expected)
        for name, value in expected.items():
            assert isinstance(got[name], torch.Tensor) and got[name].numpy().dtype == value.dtype, name
            np.testing.assert_array_equal(got[name].numpy(), value, err_msg=name)
