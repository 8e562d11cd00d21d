"""Preallocated trajectory storage, time-major: field -> array [time, capacity, ...].

Storing capacity on the second axis means that reading a batch of positions with one
fancy index already gives the learner's time-major layout [time, B, ...]."""
from __future__ import annotations

import numpy as np

from herd.trajectory import SENTINELS, TrajectoryLayout


class TrajectoryStorage:
    def __init__(self, layout: TrajectoryLayout, capacity: int):
        self.capacity = capacity
        self.arrays: dict[str, np.ndarray] = {}
        for name, (shape, dtype) in layout.fields().items():
            array = np.empty((shape[0], capacity, *shape[1:]), dtype=dtype)
            array.fill(SENTINELS[name])
            self.arrays[name] = array
        self.version = np.full(capacity, -1, dtype=np.int64)  # policy version that acted

    def write(self, position: int, trajectory: dict[str, np.ndarray], version: int) -> None:
        """trajectory: field -> [time, ...] for one environment."""
        for name, array in self.arrays.items():
            array[:, position] = trajectory[name]
        self.version[position] = version

    def read(self, positions: np.ndarray) -> dict[str, np.ndarray]:
        """field -> [time, B, ...] copies for the given positions."""
        return {name: array[:, positions] for name, array in self.arrays.items()}

    def state_dict(self, filled: int) -> dict[str, np.ndarray]:
        return {"arrays": {name: a[:, :filled].copy() for name, a in self.arrays.items()},
                "version": self.version[:filled].copy()}

    def load_state_dict(self, state: dict) -> None:
        for name, array in state["arrays"].items():
            self.arrays[name][:, : array.shape[1]] = array
        self.version[: len(state["version"])] = state["version"]
