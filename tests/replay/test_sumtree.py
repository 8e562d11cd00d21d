"""The sum tree and the prioritized sampler against brute-force arrays: sums, the leaf a
prefix sum lands on, sampling frequencies, updates, eviction, importance weights."""
from __future__ import annotations

import copy

import numpy as np
import pytest

from herd.replay.prioritized import PrioritizedSampler
from herd.replay.sumtree import SumTree


def brute_find(values: np.ndarray, target: float) -> int:
    """The smallest j with sum(values[:j+1]) > target, by a linear scan."""
    running = 0.0
    for j, v in enumerate(values):
        running += v
        if running > target:
            return j
    raise AssertionError("target beyond the total")


@pytest.mark.parametrize("leaves", [1, 2, 5, 8, 13, 100])
def test_sums_and_prefix_search_match_a_plain_array(leaves):
    rng = np.random.default_rng(leaves)
    tree, plain = SumTree(leaves), np.zeros(leaves)
    for _ in range(20):
        index = rng.integers(0, leaves, size=rng.integers(1, 2 * leaves + 1))   # repeats included
        values = rng.random(index.size) * 3
        tree.set(index, values)
        for i, v in zip(index, values):     # the last value of a repeated index wins
            plain[i] = v
        assert np.isclose(tree.total, plain.sum())
        assert np.allclose(tree.get(np.arange(leaves)), plain)
        targets = rng.random(50) * plain.sum()
        assert tree.find(targets).tolist() == [brute_find(plain, t) for t in targets]
    # every internal node is the sum of its children
    internal = np.arange(1, tree.size)
    assert np.allclose(tree.nodes[internal], tree.nodes[2 * internal] + tree.nodes[2 * internal + 1])


def test_zero_leaves_are_never_found_even_at_the_edges():
    tree = SumTree(6)
    tree.set(np.array([1, 3]), np.array([0.5, 0.25]))
    edges = np.array([0.0, 0.4999999, 0.5, 0.75 - 1e-12, np.nextafter(0.75, 0)])
    assert tree.find(edges).tolist() == [1, 1, 3, 3, 3]
    assert set(tree.sample(1000, np.random.default_rng(0)).tolist()) == {1, 3}


def test_sampling_frequencies_follow_the_priorities():
    """200,000 draws over 7 leaves. Each count is checked against its expectation N p_j
    within 5 binomial standard deviations: stratified draws vary less than independent
    ones, so this bound is conservative (a correct tree fails it with probability well
    below 1e-5), while a leaf drawn with the wrong probability (even 3% off) fails it."""
    values = np.array([1.0, 0.0, 2.0, 4.0, 0.5, 8.0, 0.25])
    tree = SumTree(len(values))
    tree.set(np.arange(len(values)), values)
    rng = np.random.default_rng(1)
    draws = np.concatenate([tree.sample(64, rng) for _ in range(3125)])
    n, p = draws.size, values / values.sum()
    counts = np.bincount(draws, minlength=len(values))
    assert counts[1] == 0
    sigma = np.sqrt(n * p * (1 - p))
    assert np.all(np.abs(counts - n * p) <= 5 * sigma + 1e-9), (counts, n * p)


def test_state_round_trip_rebuilds_the_sums():
    tree = SumTree(11)
    tree.set(np.arange(11), np.arange(11, dtype=float))
    twin = SumTree(11)
    twin.load_state_dict(copy.deepcopy(tree.state_dict()))
    assert np.array_equal(twin.nodes, tree.nodes)


def test_bad_values_are_refused():
    tree = SumTree(4)
    with pytest.raises(ValueError):
        tree.set(np.array([0]), np.array([-1.0]))
    with pytest.raises(ValueError):
        tree.set(np.array([0]), np.array([np.nan]))
    with pytest.raises(IndexError):
        tree.set(np.array([4]), np.array([1.0]))


# ---------------------------------------------------------------- the prioritized sampler

def test_leaves_per_trajectory_get_the_actor_priorities_and_eviction_is_oldest_first():
    sampler = PrioritizedSampler(capacity=3, steps=2, alpha=1.0, epsilon=1e-6)
    for k in range(4):                                   # the 4th trajectory evicts the 1st
        position = sampler.add(np.array([k + 1.0, -(k + 10.0)]))   # |priority| is used
        assert position == k % 3
    leaves = sampler.tree.get(np.arange(6)) - 1e-6
    assert np.allclose(leaves, [4, 13, 2, 11, 3, 12])
    assert sampler.available() == 6 and sampler.stored() == 3
    assert np.isclose(sampler.tree.total, sum([4, 13, 2, 11, 3, 12]) + 6e-6)


def test_missing_or_nan_priorities_take_the_largest_seen():
    sampler = PrioritizedSampler(capacity=4, steps=2, alpha=1.0, epsilon=0.0)
    sampler.add(np.array([3.0, 7.0]))
    sampler.add(np.array([np.nan, 1.0]))
    sampler.add()
    assert sampler.tree.get(np.arange(6)).tolist() == [3.0, 7.0, 7.0, 1.0, 7.0, 7.0]


def test_updates_set_alpha_powered_priorities():
    sampler = PrioritizedSampler(capacity=2, steps=3, alpha=0.5, epsilon=0.01)
    sampler.add(np.zeros(3))
    sampler.add(np.zeros(3))
    sampler.update(np.array([1, 4]), np.array([-3.99, 15.99]))
    assert np.allclose(sampler.tree.get(np.array([1, 4])), [2.0, 4.0])
    assert sampler.max_priority == pytest.approx(15.99)
    sampler.update(np.array([0]), np.array([np.inf]))       # non-finite values are ignored
    assert sampler.tree.get(np.array([0]))[0] == pytest.approx(0.1)


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
