"""Samplers decide where a new trajectory is stored and which positions a batch reads.

A sampler never touches the data; `Replay` composes it with a `TrajectoryStorage`.
Interface (what a new strategy implements):
    insert_position() -> int        where the next trajectory goes
    inserted(position)              the trajectory is written
    available() -> int              how many positions can be sampled now
    stored() -> int                 how many positions hold data (saved with a checkpoint)
    sample(n, rng) -> np.ndarray    positions for a batch share
    state_dict() / load_state_dict()
"""
from __future__ import annotations

from collections import deque

import numpy as np


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


class FifoSampler:
    """The on-policy queue: each trajectory is sampled once, oldest first. When more
    arrive than wait unused, the oldest unused one is overwritten and forgotten."""

    def __init__(self, capacity: int):
        self.ring = RingPositions(capacity)
        self.pending: deque[int] = deque()

    def insert_position(self) -> int:
        position = self.ring.advance()
        if len(self.pending) == self.ring.capacity:
            self.pending.popleft()  # the overwritten trajectory can no longer be sampled
        return position

    def inserted(self, position: int) -> None:
        self.pending.append(position)

    def available(self) -> int:
        return len(self.pending)

    def stored(self) -> int:
        return self.ring.filled

    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray:
        return np.array([self.pending.popleft() for _ in range(n)], dtype=np.int64)

    def state_dict(self) -> dict:
        return {"ring": self.ring.state_dict(), "pending": list(self.pending)}

    def load_state_dict(self, state: dict) -> None:
        self.ring.load_state_dict(state["ring"])
        self.pending = deque(int(p) for p in state["pending"])


class UniformSampler:
    """Standard experience replay: a ring buffer sampled uniformly (without replacement
    within one batch share when enough trajectories are stored)."""

    def __init__(self, capacity: int):
        self.ring = RingPositions(capacity)

    def insert_position(self) -> int:
        return self.ring.advance()

    def inserted(self, position: int) -> None:
        pass

    def available(self) -> int:
        return self.ring.filled

    def stored(self) -> int:
        return self.ring.filled

    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray:
        filled = self.ring.filled
        return rng.choice(filled, size=n, replace=n > filled).astype(np.int64)

    def state_dict(self) -> dict:
        return {"ring": self.ring.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.ring.load_state_dict(state["ring"])
