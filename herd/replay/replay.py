"""A replay is storage + sampler (Dopamine's composition); the on-policy queue is one too."""
from __future__ import annotations

import numpy as np

from herd.replay.samplers import FifoSampler, UniformSampler
from herd.replay.storage import TrajectoryStorage
from herd.trajectory import TrajectoryLayout


class Replay:
    def __init__(self, name: str, storage: TrajectoryStorage, sampler, on_policy: bool):
        self.name = name
        self.storage = storage
        self.sampler = sampler
        self.on_policy = on_policy  # fresh data: no CLEAR cloning terms on it

    def add(self, trajectory: dict[str, np.ndarray], version: int) -> None:
        position = self.sampler.insert_position()
        self.storage.write(position, trajectory, version)
        self.sampler.inserted(position)

    def available(self) -> int:
        return self.sampler.available()

    def room(self) -> int:
        """Trajectories that can be added before an unused one is overwritten."""
        return self.storage.capacity - self.sampler.available()

    def sample(self, n: int, rng: np.random.Generator) -> tuple[dict[str, np.ndarray], np.ndarray]:
        """n trajectories, field -> [time, n, ...], and the policy versions that made them."""
        positions = self.sampler.sample(n, rng)
        return self.storage.read(positions), self.storage.version[positions]

    def state_dict(self) -> dict:
        return {"storage": self.storage.state_dict(self.sampler.stored()), "sampler": self.sampler.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.storage.load_state_dict(state["storage"])
        self.sampler.load_state_dict(state["sampler"])


AVAILABLE_TYPES = ("queue", "standard")  # "custom" (elite/attentive) is parsed but not built yet


def build_replay(spec, layout: TrajectoryLayout, share: int, rollout_size: int) -> Replay:
    """One replay from its --replay_parameters entry.

    The queue's capacity is raised to hold one batch share plus one actor rollout, so
    that fresh trajectories are never overwritten before the learner has used them."""
    if spec.type == "queue":
        capacity = max(spec.capacity, share + rollout_size)
        return Replay("queue", TrajectoryStorage(layout, capacity), FifoSampler(capacity), on_policy=True)
    if spec.type == "standard":
        return Replay("standard", TrajectoryStorage(layout, spec.capacity), UniformSampler(spec.capacity), on_policy=False)
    raise ValueError(f"replay type '{spec.type}' is not available yet")
