"""A sum tree over a fixed number of non-negative leaves, in numpy: set priorities of many
leaves at once, and draw many leaves at once with probability proportional to their
priority, both without a Python loop over items (only one over the tree's levels).

Layout: an array of 2 * size floats (size = the leaf count rounded up to a power of two);
node i has children 2i and 2i+1, the root is node 1 and leaf j is node size + j. Padding
leaves stay 0 and can never be drawn. float64 throughout: a million leaves summed in
float32 would lose the small priorities entirely."""
from __future__ import annotations

import numpy as np


class SumTree:
    def __init__(self, leaves: int):
        if leaves < 1:
            raise ValueError(f"a sum tree needs at least one leaf, got {leaves}")
        self.leaves = leaves
        self.size = 1 << max(0, int(leaves - 1).bit_length())
        self.nodes = np.zeros(2 * self.size, dtype=np.float64)

    @property
    def total(self) -> float:
        return float(self.nodes[1])

    def get(self, indices: np.ndarray) -> np.ndarray:
        return self.nodes[self.size + np.asarray(indices, dtype=np.int64)]

    def set(self, indices: np.ndarray, values: np.ndarray) -> None:
        """leaf indices [k] (repeats: the last value wins) <- values [k] >= 0."""
        indices = np.asarray(indices, dtype=np.int64).ravel()
        values = np.asarray(values, dtype=np.float64).ravel()
        if indices.size == 0:
            return
        if np.any(indices < 0) or np.any(indices >= self.leaves):
            raise IndexError(f"leaf index outside 0..{self.leaves - 1}")
        if np.any(~np.isfinite(values)) or np.any(values < 0):
            raise ValueError("sum tree values must be finite and >= 0")
        nodes = self.size + indices
        self.nodes[nodes] = values        # numpy assigns repeats in order: the last one stays
        # Recompute each touched parent from its two children, level by level: a parent
        # touched by several leaves is simply recomputed once from the final values.
        # (All leaves sit at one depth, so each pass handles exactly one level.) Sorted
        # once; halving keeps the order, so each level drops its repeats without a sort.
        nodes = np.unique(nodes >> 1)
        while nodes[0] >= 1:
            self.nodes[nodes] = self.nodes[2 * nodes] + self.nodes[2 * nodes + 1]
            nodes >>= 1
            nodes = nodes[np.concatenate(([True], nodes[1:] != nodes[:-1]))]

    def find(self, targets: np.ndarray) -> np.ndarray:
        """For each target in [0, total), the leaf whose prefix-sum interval holds it: the
        smallest j with sum(leaves[:j+1]) > target. Vectorised descent from the root."""
        targets = np.asarray(targets, dtype=np.float64).copy()
        nodes = np.ones(targets.shape, dtype=np.int64)
        for _ in range(self.size.bit_length() - 1):          # the tree's depth
            left = 2 * nodes
            left_sum = self.nodes[left]
            # Rounding can leave a target just past the left sum with nothing on the right:
            # only go right into a subtree that holds some priority.
            right = (targets >= left_sum) & (self.nodes[left + 1] > 0)
            targets = np.where(right, targets - left_sum, targets)
            nodes = left + right
        return nodes - self.size

    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray:
        """n leaves, stratified as in Schaul et al.'s PER: one uniform draw in each of n
        equal slices of [0, total). Every draw lands on leaf j with probability
        value_j / total averaged over the slices, so leaf j is expected n * value_j / total
        times per batch, and a batch cannot pile onto one high-priority region by chance."""
        total = self.total
        if not total > 0:
            raise ValueError("cannot sample from a sum tree whose values are all 0")
        targets = (np.arange(n) + rng.random(n)) * (total / n)
        return self.find(np.minimum(targets, np.nextafter(total, 0)))

    def state_dict(self) -> dict:
        return {"leaves": self.get(np.arange(self.leaves)).copy()}

    def load_state_dict(self, state: dict) -> None:
        values = np.asarray(state["leaves"], dtype=np.float64)
        self.nodes[:] = 0
        self.nodes[self.size:self.size + len(values)] = values
        # Rebuild every internal node bottom-up: one vectorised pass per level.
        width = self.size
        while width > 1:
            parents = np.arange(width // 2, width)
            self.nodes[parents] = self.nodes[2 * parents] + self.nodes[2 * parents + 1]
            width //= 2
