"""Ape-X's replay in device memory (herd/replay/device_prioritized.py and the device
transition batches of herd/replay/transitions.py), on CPU tensors standing in for the GPU:
it draws as the host sum tree draws, never a zero-priority leaf, reads the same n-step
windows, and its state moves to and from the host sampler unchanged."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from herd.algos import trajectory_layout
from herd.algos.apex import APEX
from herd.replay.device_prioritized import DevicePrioritizedSampler
from herd.replay.device_storage import DeviceTrajectoryStorage
from herd.replay.prioritized import PrioritizedSampler
from herd.replay.storage import TrajectoryStorage
from herd.replay.transitions import device_transition_batch, transition_batch

CPU = torch.device("cpu")
T = 5
LAYOUT = trajectory_layout(APEX, T, (2,), "float32", 2, 8)


def with_leaves(leaves: np.ndarray, capacity: int, steps: int, filled: int, **options) -> DevicePrioritizedSampler:
    """A device sampler holding `filled` trajectories whose leaves are `leaves` (tree values)."""
    sampler = DevicePrioritizedSampler(capacity, CPU, steps=steps, **options)
    for _ in range(filled):
        sampler.add()
    state = sampler.state_dict()
    state["tree"]["leaves"] = leaves
    sampler.load_state_dict(state)
    return sampler


def test_draws_follow_the_priorities_and_never_a_zero_leaf():
    """64,000 draws (2,000 stratified batches of 32, seed 0) over 40 leaves: 24 with
    priorities spread over two decades, 4 zeros among them and 12 empty positions (zero).
    Pearson's X^2 of the counts against n * P(i), over the 20 positive leaves (19 degrees
    of freedom), must stay below 19 + 6 * sqrt(2 * 19) ~ 56 (the mean plus six standard
    deviations of a chi-square; stratification only makes it smaller); a sampler drawing
    uniformly gives X^2 in the tens of thousands. A zero leaf must never be drawn."""
    rng = np.random.default_rng(0)
    leaves = np.zeros(40)
    leaves[:24] = rng.uniform(0.1, 10.0, size=24)
    leaves[[0, 7, 13, 23]] = 0.0                                 # the first, inner ones and the last filled
    sampler = with_leaves(leaves, capacity=10, steps=4, filled=6)
    counts = np.zeros(40, dtype=np.int64)
    draw_rng = np.random.default_rng(0)
    for _ in range(2000):
        drawn, probabilities = sampler.sample(32, draw_rng)
        np.add.at(counts, drawn, 1)
        np.testing.assert_allclose(probabilities, leaves[drawn] / leaves.sum())
    assert counts[leaves == 0].sum() == 0
    positive = leaves > 0
    expected = counts.sum() * leaves[positive] / leaves.sum()
    chi_square = float(((counts[positive] - expected) ** 2 / expected).sum())
    assert chi_square < 19 + 6 * np.sqrt(2 * 19), chi_square


class EdgeRng:
    """An rng whose uniform draws sit on a slice's lower or upper edge: the targets then hit
    the prefix sums exactly, or come as close to the total as a float allows."""

    def __init__(self, value: float):
        self.value = value

    def random(self, n: int) -> np.ndarray:
        return np.full(n, self.value)


@pytest.mark.parametrize("edge", [0.0, np.nextafter(1.0, 0.0)], ids=["lower", "upper"])
def test_targets_on_the_edges_never_reach_a_zero_leaf(edge):
    """Leaves 1, 0, 2, 0, 1 and two empty ones: targets on the boundaries between leaves
    (lower edge) and just under the total (upper edge) land on positive leaves only.
    Catches a missing clamp of the targets below the total (the last draw would run past
    the last positive leaf into the empty ones) and a searchsorted on the wrong side."""
    leaves = np.array([1.0, 0.0, 2.0, 0.0, 1.0, 0.0, 0.0])
    sampler = with_leaves(leaves, capacity=7, steps=1, filled=5)
    drawn, _ = sampler.sample(4, EdgeRng(edge))
    assert np.all(leaves[drawn] > 0), drawn
    assert drawn.tolist() == ([0, 2, 2, 4] if edge == 0.0 else [0, 2, 4, 4])


def test_state_moves_to_the_host_sampler_and_back_with_the_same_draws():
    """DevicePrioritizedSampler.state_dict loads into PrioritizedSampler (the checkpoint
    format is one) and gives the same probabilities and, with the same rng, the same leaves
    and beta; the host state loads back into a device sampler just as well. Catches a
    device state in its own format, raw priorities saved where tree values belong, a lost
    max_priority (the next add would differ) or sample count (beta)."""
    options = dict(steps=3, alpha=0.7, beta=0.4, beta_annealing_steps=10, epsilon=1e-3)
    device = DevicePrioritizedSampler(5, CPU, **options)
    for t in range(4):
        device.add(np.array([1.0, np.nan, 4.0 * t]))             # the actors' priorities; NaN: the max rule
    device.sample(6, np.random.default_rng(1))
    device.update(np.array([0, 4, 4, 9]), torch.tensor([50.0, 3.0, float("nan"), 0.0]))
    host = PrioritizedSampler(5, **options)
    host.load_state_dict(device.state_dict())
    np.testing.assert_allclose(host.tree.get(np.arange(15)) / host.tree.total, device.probabilities(), rtol=1e-12)
    assert host.beta == device.beta and host.max_priority == 50.0
    for a, b in ((device, host), (host, device)):
        first, second = a.sample(8, np.random.default_rng(3)), b.sample(8, np.random.default_rng(3))
        assert first[0].tolist() == second[0].tolist()
        np.testing.assert_allclose(first[1], second[1], rtol=1e-12)
    assert device.add() == host.add()                             # both at the max rule: 50
    np.testing.assert_allclose(device.probabilities(), host.tree.get(np.arange(15)) / host.tree.total, rtol=1e-12)
    back = DevicePrioritizedSampler(5, CPU, **options)
    back.load_state_dict(host.state_dict())
    np.testing.assert_allclose(back.probabilities(), device.probabilities(), rtol=1e-12)
    assert float(back.max_priority) == 50.0 and back.samples == host.samples and back.beta == host.beta


def test_updates_match_the_host_sampler_with_repeats_and_non_finite_values():
    """The same adds and updates, given as device tensors to the device sampler and numpy
    to the host one: the same leaves after each step. A repeated leaf takes its last finite
    value, a non-finite one is ignored, an all-NaN update changes nothing. Catches an
    update that keeps an arbitrary (or a non-finite) one of repeated leaves, or that lets
    a NaN into the priorities or max_priority."""
    host, device = PrioritizedSampler(4, steps=2, alpha=0.5), DevicePrioritizedSampler(4, CPU, steps=2, alpha=0.5)
    updates = [([1, 1, 3], [2.0, 6.0, -1.5]),                   # 1 -> 6.0 (the last), |-1.5|
               ([2, 2, 2], [9.0, float("nan"), float("inf")]),  # 2 -> 9.0 (the last finite)
               ([0, 5], [float("nan"), float("nan")]),          # nothing
               ([6, 7, 6], [0.25, 12.0, 0.5])]
    for positions, values in updates:
        for sampler in (host, device):
            sampler.add()
        host.update(np.array(positions), np.array(values))
        device.update(np.array(positions), torch.tensor(values, dtype=torch.float32))
        np.testing.assert_allclose(device.state_dict()["tree"]["leaves"], host.tree.get(np.arange(8)), rtol=1e-12)
        assert float(device.max_priority) == pytest.approx(host.max_priority)
    assert host.max_priority == 12.0


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
