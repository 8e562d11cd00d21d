"""Proportional prioritized replay (Schaul et al. 2016, as Ape-X uses it): items are drawn
with probability P(i) = p_i / sum_k p_k, p_i = (|priority_i| + epsilon)^alpha, and the
learner corrects the bias with importance weights (N * P(i))^-beta, normalised by the
largest weight of the batch; beta anneals linearly to 1.

Items. Each stored trajectory (a position of the ring, oldest evicted first) owns `steps`
consecutive leaves, one per transition: leaf = position * steps + t. So `add()` returns a
trajectory position like every sampler, while `sample()` returns leaf indices; with steps=1
the two coincide (and the sampler is a plain prioritized sampler of whole trajectories).
herd/replay/transitions.py maps leaves back to (position, t).

Priorities come from two places: the actors' own estimate when a trajectory is added
(`add(priorities)`, Ape-X), else the largest priority seen so far (PER's rule, so a new
item is drawn at least once soon); and the learner's |TD error| through `update`.

One sampler for every learner: the priorities are one float64 tensor on the device of the
replay's storage (the host, or a GPU learner's device beside a TrajectoryStore there),
seen as blocks of BLOCK leaves with one sum per block: a two-level sum tree. sample() scans
the block sums, finds each stratified target's block with searchsorted, then scans only
those n blocks ([n, BLOCK]) for the leaf: O(N / BLOCK + n * BLOCK) work in a few tensor
ops, no Python loop; update() is one scatter and re-sums the blocks it touched. So a GPU
learner's |TD errors| never need a host read, and max_priority is a device scalar (read
only for state_dict). What crosses to the host per batch: the sampled leaves and their
probabilities, [2, n] float64 in one copy (the replay's keys, generations and policy
versions are numpy bookkeeping).

Checkpoints: {"ring", "tree": {"leaves"}, "max_priority", "samples"}, the leaves being the
tree values (|p| + epsilon)^alpha, the format every herd checkpoint of a prioritized replay
has."""
from __future__ import annotations

import numpy as np
import torch

from herd.replay.samplers import RingPositions, Sampler

# Leaves per block: the block sums and one block per draw are scanned (128 draws over
# Ape-X's 100,000 Atari leaves: 1,563 sums and 128 x 64 leaves, not 100,000).
BLOCK = 64


class PrioritizedSampler(Sampler):
    def __init__(self, capacity: int, steps: int = 1, alpha: float = 0.6, beta: float = 0.4,
                 beta_annealing_steps: int = 0, epsilon: float = 1e-6, device: torch.device | str = "cpu"):
        """capacity: trajectories; steps: leaves (transitions) per trajectory;
        beta_annealing_steps: sample() calls over which beta rises linearly to 1 (0: fixed);
        device: where the priorities live (the storage's)."""
        self.ring = RingPositions(capacity)
        self.steps = steps
        self.alpha, self.beta0, self.epsilon = alpha, beta, epsilon
        self.beta_annealing_steps = beta_annealing_steps
        self.samples = 0             # sample() calls so far: what beta anneals over
        self.device = torch.device(device)
        self.leaves = capacity * steps
        blocks = -(-self.leaves // BLOCK)
        # float64: a million leaves summed in float32 lose the small ones. Padded to whole
        # blocks with zero leaves, which are never drawn.
        self.padded = torch.zeros(blocks * BLOCK, dtype=torch.float64, device=self.device)  # [blocks * BLOCK]
        self.priorities = self.padded[: self.leaves]                                          # [capacity * steps]
        self.block_sums = torch.zeros(blocks, dtype=torch.float64, device=self.device)        # [blocks]
        # Of raw priorities (|TD|), before epsilon and alpha; a device scalar so that an
        # update with device values needs no host read.
        self.max_priority = torch.ones((), dtype=torch.float64, device=self.device)

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

    def to_tree(self, priorities: torch.Tensor) -> torch.Tensor:
        return (priorities.abs() + self.epsilon) ** self.alpha

    def values(self, values) -> torch.Tensor:
        """|values| as float64 on the device (numpy, lists or tensors; device tensors stay there)."""
        if not isinstance(values, torch.Tensor):
            values = torch.from_numpy(np.array(values, dtype=np.float64))   # a copy: trajectory views are read-only
        return values.to(self.device, torch.float64, non_blocking=True).abs().reshape(-1)

    def add(self, priorities: np.ndarray | None = None) -> int:
        """A new trajectory's position; its `steps` leaves get `priorities` [steps] (missing
        or non-finite ones: the largest priority seen so far)."""
        position = self.ring.advance()
        leaves = slice(position * self.steps, (position + 1) * self.steps)
        if priorities is None:
            self.priorities[leaves] = self.to_tree(self.max_priority.expand(self.steps))
        else:
            given = self.values(priorities)                                                 # [steps]
            finite = torch.isfinite(given)
            raw = torch.where(finite, given, self.max_priority)
            # 0 where not finite: raw priorities are >= 0, so it never raises the maximum.
            self.max_priority = torch.maximum(self.max_priority, torch.where(finite, given, 0.0).max())
            self.priorities[leaves] = self.to_tree(raw)
        self.resum(slice(leaves.start // BLOCK, (leaves.stop - 1) // BLOCK + 1))
        return position

    def resum(self, blocks) -> None:
        """The sums of `blocks` (a slice or an index tensor) from their leaves."""
        self.block_sums[blocks] = self.padded.view(-1, BLOCK)[blocks].sum(1)

    @staticmethod
    def find(prefix_of: torch.Tensor, values: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """For targets [n] in [0, total of each row), the index of the non-zero value whose
        cumulative range holds it, along the last dim of values ([K] or [n, K]). Zero values
        repeat their predecessor's prefix sum exactly, and cummax keeps the sums
        non-decreasing whatever order the scan added in: value j is found for targets in
        [prefix[j-1], prefix[j]), never a zero one."""
        prefix = torch.where(values > 0, prefix_of, torch.zeros_like(prefix_of)).cummax(-1).values
        total = prefix[..., -1]
        targets = torch.minimum(targets, torch.nextafter(total, torch.zeros_like(total)))      # < the row's total
        if prefix.dim() == 1:
            return torch.searchsorted(prefix, targets, right=True)
        return torch.searchsorted(prefix, targets[:, None], right=True)[:, 0]

    def sample(self, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """n leaves, stratified over the priority mass (one uniform draw in each of n equal
        slices), and each one's P(i), both host arrays [n]."""
        if self.ring.filled == 0:
            raise ValueError("cannot sample from a prioritized replay that holds nothing")
        block_prefix = torch.cumsum(self.block_sums, 0)                                         # [blocks]
        total = block_prefix[-1]
        # The draws come from the numpy rng (one per slice), so that a seeded run repeats them.
        fractions = torch.from_numpy((np.arange(n) + rng.random(n)) / n).to(self.device, non_blocking=True)
        targets = fractions * total                                                              # [n]
        blocks = self.find(block_prefix, self.block_sums, targets).clamp_(max=len(self.block_sums) - 1)   # [n]
        before = torch.where(blocks > 0, block_prefix[(blocks - 1).clamp(min=0)], 0.0)         # [n]
        rows = self.padded.view(-1, BLOCK)[blocks]                                               # [n, BLOCK]
        # A target minus the mass before its block: >= 0, and kept under the block's own
        # scan total, which may differ from its block sum by a rounding.
        within = self.find(torch.cumsum(rows, 1), rows, (targets - before).clamp_(min=0)).clamp_(max=BLOCK - 1)  # [n]
        leaves = blocks * BLOCK + within                                                         # [n]
        probabilities = self.padded[leaves] / total                                              # [n]
        self.samples += 1
        # The one host read per batch: leaves (exact in float64) and probabilities together.
        host = torch.stack([leaves.to(torch.float64), probabilities]).cpu().numpy()               # [2, n]
        return host[0].astype(np.int64), host[1]

    def update(self, positions: np.ndarray, values) -> None:
        """New raw priorities (the learner's |TD errors|, numpy or device tensors [k]) for
        sampled leaves `positions` [k] (host, from the replay's keys). Non-finite values
        are ignored, and of repeated leaves the last finite value wins."""
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
        self.resum(torch.from_numpy(np.unique(leaves // BLOCK)).to(self.device, non_blocking=True))
        self.max_priority = torch.maximum(self.max_priority, torch.where(finite, values, 0.0).max())

    def probabilities(self) -> np.ndarray:
        """P(i) of every leaf [capacity * steps] (host; for tests and inspection)."""
        return (self.priorities / self.priorities.sum()).cpu().numpy()

    def state_dict(self) -> dict:
        return {"ring": self.ring.state_dict(), "tree": {"leaves": self.priorities.cpu().numpy().copy()},
                "max_priority": float(self.max_priority), "samples": self.samples}

    def load_state_dict(self, state: dict) -> None:
        self.ring.load_state_dict(state["ring"])
        leaves = torch.as_tensor(np.asarray(state["tree"]["leaves"], dtype=np.float64))[: self.leaves]
        self.padded.zero_()
        self.priorities[: len(leaves)] = leaves.to(self.device)
        self.resum(slice(None))
        self.max_priority = torch.tensor(float(state["max_priority"]), dtype=torch.float64, device=self.device)
        self.samples = int(state["samples"])
