"""A replay is storage + sampler (Dopamine's composition); the on-policy queue is one too."""
from __future__ import annotations

import numpy as np
import torch

from herd.replay.elite import DEFAULT_SCORE_STEPS, EliteSampler, model_scorers
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

    def attach_model(self, model: torch.nn.Module, device, bf16: bool = False) -> None:
        """Gives an elite/attentive replay the learner's model to score trajectories with
        (see herd/replay/elite.py); every other replay ignores it. Call once, before the
        replay fills: the scorers keep a reference, so later weight updates are seen.
        `bf16`: score under bfloat16 autocast, as a bf16 learner computes."""
        if isinstance(self.sampler, EliteSampler):
            off_policy, attentive = model_scorers(self.storage, model, torch.device(device),
                                                  self.sampler.dist_function, self.sampler.p, self.sampler.score_steps,
                                                  bf16=bf16)
            self.sampler.set_scorer(off_policy)
            self.sampler.set_attentive_scorer(attentive)

    def state_dict(self) -> dict:
        return {"storage": self.storage.state_dict(self.sampler.stored()), "sampler": self.sampler.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.storage.load_state_dict(state["storage"])
        self.sampler.load_state_dict(state["sampler"])


def build_replay(spec, layout: TrajectoryLayout, share: int, rollout_size: int, *, compress: bool = False,
                 compression_level: int = 0, anneal_rounds_base: int = 10000, seed: int = 0) -> Replay:
    """One replay from its --replay_parameters entry.

    The queue's capacity is raised to hold one batch share plus one actor rollout, so
    that fresh trajectories are never overwritten before the learner has used them; its
    observations are never compressed (each is read once, soon: packing would only cost).
    The off-policy replays store observations LZ4-packed with `compress`.
    A custom replay anneals its candidate multiplier over anneal_rounds_base (the run's
    lr_scheduler_steps) * alfa_annealing_factor sample calls; `seed` drives its elite
    insertion. It needs Replay.attach_model before use when it has a strategy."""
    if spec.type == "queue":
        capacity = max(spec.capacity, share + rollout_size)
        return Replay("queue", TrajectoryStorage(layout, capacity), FifoSampler(capacity), on_policy=True)
    storage = TrajectoryStorage(layout, spec.capacity, compress_obs=compress, compression_level=compression_level)
    if spec.type == "standard":
        return Replay("standard", storage, UniformSampler(spec.capacity), on_policy=False)
    if spec.type == "custom":
        sampler = EliteSampler(
            spec.capacity,
            sample_strategy=spec.option("sample_strategy"),
            insert_strategy=spec.option("insert_strategy"),
            elite_sampling_strategy=spec.option("elite_sampling_strategy", "strategy3"),
            lambda_batch_multiplier=spec.option("lambda_batch_multiplier", 1),
            anneal_rounds=round(anneal_rounds_base * spec.option("alfa_annealing_factor", 1.0)),
            elite_batch_size=spec.option("elite_batch_size", 20),
            dist_function=spec.option("dist_function", "ln_norm"),
            p=spec.option("p", 2),
            score_steps=None if spec.option("score_steps") == "all" else spec.option("score_steps", DEFAULT_SCORE_STEPS),
            seed=seed)
        return Replay("custom", storage, sampler, on_policy=False)
    raise ValueError(f"unknown replay type '{spec.type}'")
