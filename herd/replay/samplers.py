"""Samplers decide where a new trajectory is stored and which positions a batch reads.

A sampler never touches the data; `Replay` composes it with a `TrajectoryStore` and
keeps the keys (position + generation) that let updates find their item. The protocol
every sampler implements (and tests/replay/test_sampler_protocol.py checks):

    add() -> int                         position for a new trajectory (about to be written there)
    available() -> int                   how many positions can be sampled now
    stored() -> int                      how many positions hold data (saved with a checkpoint)
    sample(n, rng) -> (positions [n] int64, probabilities [n] float64)
                                         probabilities: the chance each position had of being
                                         drawn (prioritized replay weights its updates by them)
    update(positions [k], values [k])    new per-item values from the learner (priorities);
                                         samplers without any accept and ignore them
    state_dict() / load_state_dict()

and members with defaults on `Sampler`, the base class every sampler derives from, which
a sampler that serves whole stored batches several times (circular.py) or lends what it
samples (the FIFO queue) overrides:

    room(capacity) -> int                how many trajectories can be added before an unused one
                                         is overwritten (default: the positions not available)
    served                               (slot, whether it was the last pass) of the batch the
                                         last sample() served; None (the default): not such a sampler
    lends                                whether sampled positions can be lent: read in place by
                                         the learner's step (a view, no copy) and kept from being
                                         overwritten until given back (default False)
    lend(positions) / give_back(positions)
    ring_order                           whether add() hands out ring positions and looks at nothing
                                         stored: a rollout's n adds may then be taken before its n
                                         trajectories are written, as one block (default False)

The prioritized sampler (prioritized.py) can also give each trajectory several items (one
per transition, for Ape-X): its sample() and update() then speak of those items, and
herd/replay/transitions.py maps them back to trajectory positions.
"""
from __future__ import annotations

from collections import deque

import numpy as np


class Sampler:
    """The base of every sampler: the protocol's members that have a default."""
    served: tuple[int, bool] | None = None
    lends = False
    ring_order = False

    def lend(self, positions: np.ndarray) -> None:
        raise NotImplementedError(f"{type(self).__name__} does not lend its positions")

    def give_back(self, positions: np.ndarray) -> None:
        """Positions lent by lend() are no longer read; for the others nothing to do."""

    def available(self) -> int:
        raise NotImplementedError

    def room(self, capacity: int) -> int:
        """Trajectories that can be added to `capacity` positions before an unused one is
        overwritten."""
        return capacity - self.available()


class RingPositions:
    """The oldest-first write order of a ring buffer, shared by FIFO and uniform."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self.next = 0
        self.filled = 0

    def advance(self) -> int:
        position = self.next
        self.next = (self.next + 1) % self.capacity
        self.filled = min(self.filled + 1, self.capacity)
        return position

    def state_dict(self) -> dict:
        return {"next": self.next, "filled": self.filled}

    def load_state_dict(self, state: dict) -> None:
        self.next, self.filled = int(state["next"]), int(state["filled"])


class FifoSampler(Sampler):
    """The on-policy queue: each trajectory is sampled once, oldest first. When more
    arrive than wait unused, the oldest unused one is overwritten and forgotten. A batch
    it lends (the learner reads it in place) keeps its positions from being written until
    it is given back: room() stops before them."""

    lends = True
    ring_order = True

    def __init__(self, capacity: int):
        self.ring = RingPositions(capacity)
        self.pending: deque[int] = deque()
        self.lent: set[int] = set()

    def add(self) -> int:
        if self.ring.next in self.lent:
            raise RuntimeError(f"queue position {self.ring.next} is lent to a batch in training: the caller "
                               "must wait for room()")
        position = self.ring.advance()
        if len(self.pending) == self.ring.capacity:
            self.pending.popleft()  # the overwritten trajectory can no longer be sampled
        self.pending.append(position)
        return position

    def available(self) -> int:
        return len(self.pending)

    def room(self, capacity: int) -> int:
        """Adds before the oldest unused or lent position would be written over."""
        kept = [*self.lent, *([self.pending[0]] if self.pending else [])]
        return min(((position - self.ring.next) % capacity for position in kept), default=capacity)

    def lend(self, positions: np.ndarray) -> None:
        self.lent.update(int(p) for p in positions)

    def give_back(self, positions: np.ndarray) -> None:
        self.lent.difference_update(int(p) for p in positions)

    def stored(self) -> int:
        return self.ring.filled

    def sample(self, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        positions = np.array([self.pending.popleft() for _ in range(n)], dtype=np.int64)
        return positions, np.ones(n)  # the oldest, with certainty

    def update(self, positions: np.ndarray, values: np.ndarray) -> None:
        pass  # each item is used once: nothing to re-weigh

    def state_dict(self) -> dict:
        return {"ring": self.ring.state_dict(), "pending": list(self.pending)}

    def load_state_dict(self, state: dict) -> None:
        self.ring.load_state_dict(state["ring"])
        self.pending = deque(int(p) for p in state["pending"])


class UniformSampler(Sampler):
    """Standard experience replay: a ring buffer sampled uniformly (without replacement
    within one batch share when enough trajectories are stored)."""

    ring_order = True

    def __init__(self, capacity: int):
        self.ring = RingPositions(capacity)

    def add(self) -> int:
        return self.ring.advance()

    def available(self) -> int:
        return self.ring.filled

    def stored(self) -> int:
        return self.ring.filled

    def sample(self, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        filled = self.ring.filled
        positions = rng.choice(filled, size=n, replace=n > filled).astype(np.int64)
        return positions, np.full(n, 1.0 / filled)

    def update(self, positions: np.ndarray, values: np.ndarray) -> None:
        pass  # uniform: values do not change the odds

    def state_dict(self) -> dict:
        return {"ring": self.ring.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.ring.load_state_dict(state["ring"])
