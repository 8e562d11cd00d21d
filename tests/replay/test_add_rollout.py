"""A rollout written into the replays at once (herd/replay/replay.py add_rollout): where a
ring-order sampler's positions for its trajectories are one ascending run, each field is
one copy into the storage; where the ring wraps, or the sampler looks at what is stored
(elite), one trajectory at a time. Either way the replay ends exactly as if each
trajectory had been added on its own."""
from __future__ import annotations

import numpy as np
import pytest

from herd.algos.impala import impala_layout
from herd.replay.registry import build_replay
from herd.replay.spec import parse_replay_parameters
from herd.store import TrajectoryStore
from herd.trajectory import env_columns

OBS = (2, 5, 4)
LAYOUT = impala_layout(unroll_length=3, obs_shape=OBS, obs_dtype="uint8", num_actions=3, feature_size=4)
E = 4


def rollout(mark: int) -> dict:
    """field -> [time, E, ...] with every value distinct per (mark, env)."""
    rng = np.random.default_rng(mark)
    views = {}
    for name, (shape, dtype) in LAYOUT.fields().items():
        array = np.empty((shape[0], E, *shape[1:]), dtype)
        array[...] = rng.integers(0, 100, array.shape).astype(dtype) if name != "done" else rng.random(array.shape) < 0.2
        views[name] = array
    return views


def replays(spec: str, n: int = 2):
    """n replays of `spec`, each giving 5 trajectories to a batch (a queue's ring of 10 is
    then a whole number of shares, as build_queue makes it, and stays 10)."""
    parsed = parse_replay_parameters(spec)[0]
    return [build_replay(parsed, LAYOUT, 5, E) for _ in range(n)]


def same_contents(a, b) -> None:
    for name in a.storage.arrays:
        np.testing.assert_array_equal(a.storage.arrays[name], b.storage.arrays[name], err_msg=name)
    np.testing.assert_array_equal(a.storage.version, b.storage.version)
    np.testing.assert_array_equal(a.generation, b.generation)


class CountingStorage:
    """Counts TrajectoryStore's writes: one per trajectory, or one per run of them."""

    def __init__(self, monkeypatch):
        self.single = self.runs = 0
        write, write_run = TrajectoryStore.write, TrajectoryStore.write_run

        def counted_write(storage, *args):
            self.single += 1
            return write(storage, *args)

        def counted_run(storage, *args):
            self.runs += 1
            return write_run(storage, *args)
        monkeypatch.setattr(TrajectoryStore, "write", counted_write)
        monkeypatch.setattr(TrajectoryStore, "write_run", counted_run)


@pytest.mark.parametrize("spec", ['[{"type": "queue", "capacity": 10, "sample_ratio": 1}]',
                                  '[{"type": "standard", "capacity": 10, "sample_ratio": 1}]'])
def test_a_rollout_is_one_write_unless_the_ring_wraps_and_ends_as_trajectory_by_trajectory(spec, monkeypatch):
    whole, single = replays(spec)
    counter = CountingStorage(monkeypatch)
    for mark in range(4):                      # 16 trajectories into 10 positions: wraps at the 3rd
        views = rollout(mark)
        whole.add_rollout(views, version=mark)
        for trajectory in env_columns(views):
            single.add(trajectory, version=mark)
    same_contents(whole, single)
    # Rollouts at positions 0-3, 4-7, then 8, 9, 0, 1 (wraps: one at a time), then 2-5.
    assert counter.runs == 3
    assert counter.single == 4 + 16            # the wrapping rollout's 4, and every single add
    assert whole.sampler.available() == single.sampler.available()


def test_a_sampler_that_reads_the_storage_adds_one_trajectory_at_a_time(monkeypatch):
    spec = '[{"type": "custom", "capacity": 6, "sample_ratio": 1, "dist_function": "ln_norm"}]'
    whole, single = replays(spec)
    counter = CountingStorage(monkeypatch)
    for mark in range(2):
        views = rollout(mark)
        whole.add_rollout(views, version=mark)
        for trajectory in env_columns(views):
            single.add(trajectory, version=mark)
    same_contents(whole, single)
    assert counter.runs == 0 and counter.single == 16


def test_device_storage_writes_a_run_as_its_trajectories():
    """The device storage (a GPU learner's replays; on this CPU's device here): one copy per
    field for a run, the same contents as one write per trajectory."""
    import torch
    from herd.store import TrajectoryStore
    whole, single = (TrajectoryStore(LAYOUT, 10, torch.device("cpu")) for _ in range(2))
    views = rollout(7)
    whole.write_run(3, views, version=5)
    for e, trajectory in enumerate(env_columns(views)):
        single.write(3 + e, trajectory, version=5)
    for name in whole.tensors:          # the untouched positions hold the sentinels (NaN for floats)
        torch.testing.assert_close(whole.tensors[name], single.tensors[name], rtol=0, atol=0, equal_nan=True)
    assert torch.equal(torch.as_tensor(whole.version), torch.as_tensor(single.version))
