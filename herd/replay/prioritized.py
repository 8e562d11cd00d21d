"""Proportional prioritized replay (Schaul et al. 2016, as Ape-X uses it): items are drawn
with probability P(i) = p_i / sum_k p_k, p_i = (|priority_i| + epsilon)^alpha, and the
learner corrects the bias with importance weights (N * P(i))^-beta, normalised by the
largest weight of the batch; beta anneals linearly to 1.

Items. Each stored trajectory (a position of the ring, oldest evicted first) owns `steps`
consecutive leaves of one sum tree, one per transition: leaf = position * steps + t. So
`add()` returns a trajectory position like every sampler, while `sample()` returns leaf
indices; with steps=1 the two coincide (and the sampler is a plain prioritized sampler of
whole trajectories). herd/replay/transitions.py maps leaves back to (position, t).

Priorities come from two places: the actors' own estimate when a trajectory is added
(`add(priorities)`, Ape-X), else the largest priority seen so far (PER's rule, so a new
item is drawn at least once soon); and the learner's |TD error| through `update`."""
from __future__ import annotations

import numpy as np
import torch

from herd.replay.samplers import RingPositions, Sampler
from herd.replay.sumtree import SumTree


class PrioritizedRing(Sampler):
    """What the host and the device prioritized samplers share: the ring of trajectory
    positions, beta's annealing and the importance weights (host arrays of [n])."""

    def __init__(self, capacity: int, steps: int, alpha: float, beta: float, beta_annealing_steps: int,
                 epsilon: float):
        self.ring = RingPositions(capacity)
        self.steps = steps
        self.alpha, self.beta0, self.epsilon = alpha, beta, epsilon
        self.beta_annealing_steps = beta_annealing_steps
        self.samples = 0             # sample() calls so far: what beta anneals over

    def available(self) -> int:
        """Items (leaves) that can be drawn."""
        return self.ring.filled * self.steps

    def stored(self) -> int:
        return self.ring.filled

    @property
    def beta(self) -> float:
        if self.beta_annealing_steps <= 0:
            return self.beta0
        return self.beta0 + (1.0 - self.beta0) * min(1.0, self.samples / self.beta_annealing_steps)

    def importance_weights(self, probabilities: np.ndarray) -> np.ndarray:
        """(N * P(i))^-beta / max over the batch: in (0, 1], the rarest item weighs 1."""
        weights = (self.available() * np.asarray(probabilities, dtype=np.float64)) ** -self.beta
        return weights / weights.max()


class PrioritizedSampler(PrioritizedRing):
    def __init__(self, capacity: int, steps: int = 1, alpha: float = 0.6, beta: float = 0.4,
                 beta_annealing_steps: int = 0, epsilon: float = 1e-6):
        """capacity: trajectories; steps: leaves (transitions) per trajectory;
        beta_annealing_steps: sample() calls over which beta rises linearly to 1 (0: fixed)."""
        super().__init__(capacity, steps, alpha, beta, beta_annealing_steps, epsilon)
        self.tree = SumTree(capacity * steps)
        self.max_priority = 1.0      # of raw priorities (|TD|), before epsilon and alpha

    def to_tree(self, priorities: np.ndarray) -> np.ndarray:
        return (np.abs(priorities) + self.epsilon) ** self.alpha

    def add(self, priorities: np.ndarray | None = None) -> int:
        """A new trajectory's position; its `steps` leaves get `priorities` [steps] (missing
        or non-finite ones: the largest priority seen so far)."""
        position = self.ring.advance()
        raw = np.full(self.steps, self.max_priority)
        if priorities is not None:
            given = np.asarray(priorities, dtype=np.float64).reshape(self.steps)
            finite = np.isfinite(given)
            raw[finite] = np.abs(given[finite])
            if finite.any():
                self.max_priority = max(self.max_priority, float(raw[finite].max()))
        self.tree.set(position * self.steps + np.arange(self.steps), self.to_tree(raw))
        return position

    def sample(self, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """n leaves (stratified over the priority mass) and each one's P(i)."""
        leaves = self.tree.sample(n, rng)
        self.samples += 1
        return leaves, self.tree.get(leaves) / self.tree.total

    def update(self, positions: np.ndarray, values: np.ndarray) -> None:
        """New raw priorities (the learner's |TD errors|) for sampled leaves (numpy, or a
        tensor from the learner: read to the host here, the one place that needs it)."""
        values = np.abs(host_array(values).astype(np.float64))
        finite = np.isfinite(values)
        if not finite.any():
            return
        self.tree.set(np.asarray(positions)[finite], self.to_tree(values[finite]))
        self.max_priority = max(self.max_priority, float(values[finite].max()))

    def state_dict(self) -> dict:
        return {"ring": self.ring.state_dict(), "tree": self.tree.state_dict(), "max_priority": self.max_priority,
                "samples": self.samples}

    def load_state_dict(self, state: dict) -> None:
        self.ring.load_state_dict(state["ring"])
        self.tree.load_state_dict(state["tree"])
        self.max_priority = float(state["max_priority"])
        self.samples = int(state["samples"])


def host_array(values) -> np.ndarray:
    """values as a numpy array: a tensor (perhaps on a GPU) is copied to the host."""
    if isinstance(values, torch.Tensor):
        return values.detach().float().cpu().numpy()
    return np.asarray(values)
