"""The prioritized sampler (herd/replay/prioritized.py) with its priorities in the learner's
device memory: what a GPU learner's Ape-X replay uses beside a DeviceTrajectoryStorage.

Priorities are one float64 tensor [capacity * steps] of (|p| + epsilon)^alpha, leaf =
position * steps + t as in the host sampler. Instead of a sum tree, sample() takes the
cumulative sum (one scan over the leaves: on a GPU a few microseconds even for millions)
and finds the stratified targets in it with searchsorted; update() is one scatter. So the
learner's |TD errors| (device tensors) never need a host read, and max_priority stays a
device scalar (read only for state_dict).

What crosses to the host per batch: the sampled leaves and their probabilities, [2, n]
float64 in one copy (the replay's keys, generations and policy versions are numpy
bookkeeping). Checkpoints keep PrioritizedSampler's format ({"ring", "tree": {"leaves"},
"max_priority", "samples"}), so a checkpoint moves between a GPU and a CPU learner."""
from __future__ import annotations

import numpy as np
import torch

from herd.replay.prioritized import PrioritizedRing


class DevicePrioritizedSampler(PrioritizedRing):
    def __init__(self, capacity: int, device: torch.device, steps: int = 1, alpha: float = 0.6, beta: float = 0.4,
                 beta_annealing_steps: int = 0, epsilon: float = 1e-6):
        super().__init__(capacity, steps, alpha, beta, beta_annealing_steps, epsilon)
        self.device = torch.device(device)
        self.leaves = capacity * steps
        # float64 as the host tree: a million leaves summed in float32 lose the small ones.
        self.priorities = torch.zeros(self.leaves, dtype=torch.float64, device=self.device)   # [capacity * steps]
        # Of raw priorities (|TD|), before epsilon and alpha; a device scalar so that an
        # update with device values needs no host read.
        self.max_priority = torch.ones((), dtype=torch.float64, device=self.device)

    def to_tree(self, priorities: torch.Tensor) -> torch.Tensor:
        return (priorities.abs() + self.epsilon) ** self.alpha

    def values(self, values) -> torch.Tensor:
        """|values| as float64 on the device (numpy, lists or tensors; device tensors stay there)."""
        return torch.as_tensor(values).to(self.device, torch.float64, non_blocking=True).abs().reshape(-1)

    def add(self, priorities: np.ndarray | None = None) -> int:
        """A new trajectory's position; its `steps` leaves get `priorities` [steps] (missing
        or non-finite ones: the largest priority seen so far)."""
        position = self.ring.advance()
        leaves = slice(position * self.steps, (position + 1) * self.steps)
        if priorities is None:
            self.priorities[leaves] = self.to_tree(self.max_priority.expand(self.steps))
            return position
        given = self.values(priorities)                                                     # [steps]
        finite = torch.isfinite(given)
        raw = torch.where(finite, given, self.max_priority)
        # 0 where not finite: raw priorities are >= 0, so it never raises the maximum.
        self.max_priority = torch.maximum(self.max_priority, torch.where(finite, given, 0.0).max())
        self.priorities[leaves] = self.to_tree(raw)
        return position

    def sample(self, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """n leaves (stratified over the priority mass, as SumTree.sample: one uniform draw
        in each of n equal slices) and each one's P(i), both host arrays [n]."""
        if self.ring.filled == 0:
            raise ValueError("cannot sample from a prioritized replay that holds nothing")
        # Zero leaves (empty positions) repeat their predecessor's prefix sum exactly, and
        # cummax makes the sums non-decreasing whatever order the scan added in: leaf j is
        # found for targets in [prefix[j-1], prefix[j]), empty for a zero leaf.
        prefix = torch.cumsum(self.priorities, 0)
        prefix = torch.where(self.priorities > 0, prefix, torch.zeros_like(prefix)).cummax(0).values   # [leaves]
        total = prefix[-1]
        # The draws come from the numpy rng (one per slice, as the host tree's), like them reproducible.
        fractions = torch.from_numpy((np.arange(n) + rng.random(n)) / n).to(self.device, non_blocking=True)
        targets = torch.minimum(fractions * total, torch.nextafter(total, total.new_zeros(())))   # < total
        leaves = torch.searchsorted(prefix, targets, right=True).clamp_(max=self.leaves - 1)      # [n]
        probabilities = self.priorities[leaves] / total                                          # [n]
        self.samples += 1
        # The one host read per batch: leaves (exact in float64) and probabilities together.
        host = torch.stack([leaves.to(torch.float64), probabilities]).cpu().numpy()               # [2, n]
        return host[0].astype(np.int64), host[1]

    def update(self, positions: np.ndarray, values) -> None:
        """New raw priorities (the learner's |TD errors|, numpy or device tensors [k]) for
        sampled leaves `positions` [k] (host, from the replay's keys). As the host sampler:
        non-finite values are ignored, and of repeated leaves the last finite value wins."""
        positions = np.asarray(positions, dtype=np.int64).reshape(-1)
        if positions.size == 0:
            return
        values = self.values(values)                                                        # [k]
        finite = torch.isfinite(values)
        # A scatter with repeated indices keeps an arbitrary one on a GPU: pick, per leaf,
        # the last finite occurrence (host index bookkeeping, the values stay on the device).
        leaves, inverse = np.unique(positions, return_inverse=True)
        inverse = torch.from_numpy(inverse.reshape(-1)).to(self.device, non_blocking=True)
        order = torch.where(finite, torch.arange(len(positions), device=self.device), -1)
        last = torch.full((len(leaves),), -1, dtype=torch.int64, device=self.device)
        last = last.scatter_reduce(0, inverse, order, reduce="amax")                           # [unique leaves]
        index = torch.from_numpy(leaves).to(self.device, non_blocking=True)
        chosen = values[last.clamp(min=0)]
        self.priorities[index] = torch.where(last >= 0, self.to_tree(chosen), self.priorities[index])
        self.max_priority = torch.maximum(self.max_priority, torch.where(finite, values, 0.0).max())

    def probabilities(self) -> np.ndarray:
        """P(i) of every leaf [capacity * steps] (host; for tests and inspection)."""
        return (self.priorities / self.priorities.sum()).cpu().numpy()

    def state_dict(self) -> dict:
        """PrioritizedSampler's format: a checkpoint loads into either sampler."""
        return {"ring": self.ring.state_dict(), "tree": {"leaves": self.priorities.cpu().numpy().copy()},
                "max_priority": float(self.max_priority), "samples": self.samples}

    def load_state_dict(self, state: dict) -> None:
        self.ring.load_state_dict(state["ring"])
        leaves = torch.as_tensor(np.asarray(state["tree"]["leaves"], dtype=np.float64))[: self.leaves]
        self.priorities.zero_()
        self.priorities[: len(leaves)] = leaves.to(self.device)
        self.max_priority = torch.tensor(float(state["max_priority"]), dtype=torch.float64, device=self.device)
        self.samples = int(state["samples"])
