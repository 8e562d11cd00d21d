"""The prioritized sampler (herd/replay/prioritized.py) against plain arrays and formulas:
leaves per trajectory, the max rule, alpha-powered updates with repeats and non-finite
values, importance weights and beta's annealing, sampling frequencies (chi-square), the
edges of the stratified draws, and its state (also in the sum tree's older format)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from herd.replay.prioritized import PrioritizedSampler


def with_leaves(leaves: np.ndarray, capacity: int, steps: int, filled: int, **options) -> PrioritizedSampler:
    """A sampler holding `filled` trajectories whose leaves are `leaves` (tree values)."""
    sampler = PrioritizedSampler(capacity, steps=steps, **options)
    for _ in range(filled):
        sampler.add()
    state = sampler.state_dict()
    state["tree"]["leaves"] = leaves
    sampler.load_state_dict(state)
    return sampler


def assert_drawn_as_the_priorities(sampler: PrioritizedSampler, leaves: np.ndarray, seed: int) -> None:
    """64,000 draws (2,000 stratified batches of 32): each probability is the leaf's share,
    no zero leaf is drawn, and Pearson's X^2 of the counts against n * P(i) over the k
    positive leaves stays below dof + 6 sqrt(2 dof), dof = k - 1 (the mean plus six
    standard deviations of a chi-square; stratification only makes it smaller). A sampler
    drawing uniformly gives X^2 in the tens of thousands."""
    counts = np.zeros(len(leaves), dtype=np.int64)
    draw_rng = np.random.default_rng(seed)
    for _ in range(2000):
        drawn, probabilities = sampler.sample(32, draw_rng)
        np.add.at(counts, drawn, 1)
        np.testing.assert_allclose(probabilities, leaves[drawn] / leaves.sum())
    assert counts[leaves == 0].sum() == 0
    positive = leaves > 0
    dof = int(positive.sum()) - 1
    expected = counts.sum() * leaves[positive] / leaves.sum()
    chi_square = float(((counts[positive] - expected) ** 2 / expected).sum())
    assert chi_square < dof + 6 * np.sqrt(2 * dof), chi_square


def test_draws_follow_the_priorities_and_never_a_zero_leaf():
    """40 leaves in one block: 24 with priorities spread over two decades, 4 zeros among
    them and 12 empty positions (zero)."""
    rng = np.random.default_rng(0)
    leaves = np.zeros(40)
    leaves[:24] = rng.uniform(0.1, 10.0, size=24)
    leaves[[0, 7, 13, 23]] = 0.0                                 # the first, inner ones and the last filled
    assert_drawn_as_the_priorities(with_leaves(leaves, capacity=10, steps=4, filled=6), leaves, seed=0)


def test_draws_across_blocks_skip_empty_blocks_and_zero_leaves():
    """300 leaves over five blocks of the two-level tree (herd/replay/prioritized.py BLOCK =
    64): the second block all zero, zeros inside the others, the last block part padding.
    Catches a leaf found in the wrong block (the mass before a block not subtracted, or a
    block found with its neighbour's prefix)."""
    from herd.replay.prioritized import BLOCK
    rng = np.random.default_rng(1)
    leaves = rng.uniform(0.1, 10.0, size=300)
    leaves[BLOCK:2 * BLOCK] = 0.0
    leaves[rng.choice(300, 30, replace=False)] = 0.0
    assert_drawn_as_the_priorities(with_leaves(leaves, capacity=100, steps=3, filled=100), leaves, seed=2)


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


def test_state_round_trips_with_the_same_draws_and_loads_the_sum_tree_format():
    """state_dict into a new sampler: the same probabilities, beta, max_priority and, with
    the same rng, the same leaves; a state in the format the numpy sum tree saved (plain
    lists of tree values) loads too. Catches raw priorities saved where tree values belong,
    a lost max_priority (the next add would differ) or sample count (beta)."""
    options = dict(steps=3, alpha=0.7, beta=0.4, beta_annealing_steps=10, epsilon=1e-3)
    first = PrioritizedSampler(5, **options)
    for t in range(4):
        first.add(np.array([1.0, np.nan, 4.0 * t]))              # the actors' priorities; NaN: the max rule
    first.sample(6, np.random.default_rng(1))
    first.update(np.array([0, 4, 4, 9]), torch.tensor([50.0, 3.0, float("nan"), 0.0]))
    state = first.state_dict()
    second = PrioritizedSampler(5, **options)
    second.load_state_dict(state)
    np.testing.assert_allclose(second.probabilities(), first.probabilities(), rtol=1e-12)
    assert second.beta == first.beta and float(second.max_priority) == 50.0 and second.samples == 1
    a, b = first.sample(8, np.random.default_rng(3)), second.sample(8, np.random.default_rng(3))
    assert a[0].tolist() == b[0].tolist()
    np.testing.assert_allclose(a[1], b[1], rtol=1e-12)
    assert first.add() == second.add()                            # both at the max rule: 50
    np.testing.assert_allclose(second.probabilities(), first.probabilities(), rtol=1e-12)
    old = {"ring": {"next": 2, "filled": 2}, "tree": {"leaves": [1.0, 3.0, 0.5, 0.5]}, "max_priority": 3.0,
           "samples": 7}
    loaded = PrioritizedSampler(3, steps=2)
    loaded.load_state_dict(old)
    assert loaded.priorities.tolist() == [1.0, 3.0, 0.5, 0.5, 0.0, 0.0] and loaded.available() == 4


def test_updates_with_repeats_and_non_finite_values():
    """Updates given as tensors and as numpy arrays: after each, the leaves of a plain
    transcription (a dict, applied in order, non-finite values skipped). A repeated leaf
    takes its last finite value, a non-finite one is ignored, an all-NaN update changes
    nothing. Catches an update that keeps an arbitrary (or a non-finite) one of repeated
    leaves, or that lets a NaN into the priorities or max_priority."""
    alpha, epsilon = 0.5, 1e-6
    samplers = PrioritizedSampler(4, steps=2, alpha=alpha), PrioritizedSampler(4, steps=2, alpha=alpha)
    expected = np.zeros(8)
    updates = [([1, 1, 3], [2.0, 6.0, -1.5]),                   # 1 -> 6.0 (the last), |-1.5|
               ([2, 2, 2], [9.0, float("nan"), float("inf")]),  # 2 -> 9.0 (the last finite)
               ([0, 5], [float("nan"), float("nan")]),          # nothing
               ([6, 7, 6], [0.25, 12.0, 0.5])]
    largest = 1.0
    for round_, (positions, values) in enumerate(updates):
        for sampler in samplers:
            sampler.add()
        expected[2 * round_:2 * round_ + 2] = (largest + epsilon) ** alpha     # the max rule
        samplers[0].update(np.array(positions), np.array(values))
        samplers[1].update(np.array(positions), torch.tensor(values, dtype=torch.float32))
        for position, value in zip(positions, values):
            if np.isfinite(value):
                expected[position] = (abs(value) + epsilon) ** alpha
                largest = max(largest, abs(value))
        for sampler in samplers:
            np.testing.assert_allclose(sampler.priorities.numpy(), expected, rtol=1e-6)
            assert float(sampler.max_priority) == pytest.approx(largest)
    assert largest == 12.0


def test_leaves_per_trajectory_get_the_actor_priorities_and_eviction_is_oldest_first():
    sampler = PrioritizedSampler(capacity=3, steps=2, alpha=1.0, epsilon=1e-6)
    for k in range(4):                                   # the 4th trajectory evicts the 1st
        position = sampler.add(np.array([k + 1.0, -(k + 10.0)]))   # |priority| is used
        assert position == k % 3
    leaves = sampler.priorities.numpy() - 1e-6
    assert np.allclose(leaves, [4, 13, 2, 11, 3, 12])
    assert sampler.available() == 6 and sampler.stored() == 3
    assert np.isclose(float(sampler.priorities.sum()), sum([4, 13, 2, 11, 3, 12]) + 6e-6)


def test_missing_or_nan_priorities_take_the_largest_seen():
    sampler = PrioritizedSampler(capacity=4, steps=2, alpha=1.0, epsilon=0.0)
    sampler.add(np.array([3.0, 7.0]))
    sampler.add(np.array([np.nan, 1.0]))
    sampler.add()
    assert sampler.priorities.tolist() == [3.0, 7.0, 7.0, 1.0, 7.0, 7.0, 0.0, 0.0]


def test_updates_set_alpha_powered_priorities():
    sampler = PrioritizedSampler(capacity=2, steps=3, alpha=0.5, epsilon=0.01)
    sampler.add(np.zeros(3))
    sampler.add(np.zeros(3))
    sampler.update(np.array([1, 4]), np.array([-3.99, 15.99]))
    assert np.allclose(sampler.priorities[[1, 4]].numpy(), [2.0, 4.0])
    assert float(sampler.max_priority) == pytest.approx(15.99)
    sampler.update(np.array([0]), np.array([np.inf]))       # non-finite values are ignored
    assert float(sampler.priorities[0]) == pytest.approx(0.1)


def test_importance_weights_match_the_formula_and_beta_anneals():
    sampler = PrioritizedSampler(capacity=5, steps=1, alpha=1.0, beta=0.4, beta_annealing_steps=10, epsilon=0.0)
    for p in [1.0, 2.0, 3.0, 4.0]:
        sampler.add(np.array([p]))
    rng = np.random.default_rng(0)
    leaves, probabilities = sampler.sample(8, rng)
    assert np.allclose(probabilities, (leaves + 1.0) / 10.0)
    beta = 0.4 + 0.6 * 1 / 10                            # after one sample() call
    assert sampler.beta == pytest.approx(beta)
    expected = [(4 * p) ** -beta for p in probabilities]
    assert np.allclose(sampler.importance_weights(probabilities), np.array(expected) / max(expected))
    for _ in range(20):
        sampler.sample(2, rng)
    assert sampler.beta == 1.0
