"""Elite and attentive experience replay: the sampler of the `custom` replay type.

The sampler stays pure numpy: it never sees the model. Distances come from scorers that
`Replay.attach_model` builds (`model_scorers` below) and hands over with `set_scorer` /
`set_attentive_scorer`; tests pass fake ones. A scorer maps stored positions [C] to
distances [C], smaller = closer:
    off-policy scorer  fn(positions) -> distance between the current model's features
                       of each trajectory and the behaviour features stored with it
    attentive scorer   fn(positions, anchor) -> distance between each trajectory's
                       current-model features (mean over its steps) and the current-model
                       features of the last observation of trajectory `anchor`

Sampling (`sample_strategy`):
    None                uniform, like the standard replay (counters are still kept)
    elite_sampling      a random candidate set of lambda_t * n positions is scored with the
                        off-policy scorer; the strategy picks n of them
    attentive_sampling  the same, scored with the attentive scorer against the newest
                        trajectory (Attentive Experience Replay: replay what resembles the
                        states the agent is in now). The four strategies apply unchanged.
Strategies: 1 the n lowest distances; 2 sort by distance, split into n consecutive groups,
the first of each (spreads the picks over the distance range); 3 as 1, least-sampled first,
distance breaking ties; 4 as 2, within each group least-sampled first, then distance.
lambda_t anneals linearly from lambda_batch_multiplier to 1 over `anneal_rounds` sample
calls; with lambda_t * n <= stored every candidate is taken, so no scoring is done.

Insertion (`insert_strategy`): ring order by default; with elite_insertion, once the buffer
is full, `elite_batch_size` random positions are scored and the most off-policy one (largest
distance) is overwritten instead of the oldest.

A NaN distance (features never written, a diverged model) counts as infinitely far: never
preferred by sampling, first to go on insertion.
"""
from __future__ import annotations

import math
from typing import Callable, Optional

import numpy as np
import torch

from herd.replay.distances import distance
from herd.replay.samplers import RingPositions

Scorer = Callable[[np.ndarray], np.ndarray]
AttentiveScorer = Callable[[np.ndarray, int], np.ndarray]

SAMPLE_STRATEGIES = (None, "elite_sampling", "attentive_sampling")
INSERT_STRATEGIES = (None, "elite_insertion")
ELITE_STRATEGIES = ("strategy1", "strategy2", "strategy3", "strategy4")


def _finite(distances: np.ndarray) -> np.ndarray:
    distances = np.asarray(distances, dtype=np.float64)
    return np.where(np.isnan(distances), np.inf, distances)


def choose(distances: np.ndarray, counts: np.ndarray, n: int, strategy: str) -> np.ndarray:
    """Indices [n] into the candidates (distances [m], sample counts [m], m >= n >= 1)."""
    distances = _finite(distances)
    by_distance = np.argsort(distances, kind="stable")
    if strategy == "strategy1":
        return by_distance[:n]
    if strategy == "strategy3":
        return np.lexsort((distances, counts))[:n]  # lexsort: the last key is the primary one
    groups = np.array_split(by_distance, n)         # n consecutive runs, sizes differ by <= 1
    if strategy == "strategy2":
        return np.array([group[0] for group in groups], dtype=np.int64)
    if strategy == "strategy4":
        return np.array([group[np.lexsort((distances[group], counts[group]))[0]] for group in groups],
                        dtype=np.int64)
    raise ValueError(f"unknown elite_sampling_strategy '{strategy}' (use one of {', '.join(ELITE_STRATEGIES)})")


class EliteSampler:
    """The sampler interface of samplers.py, plus per-position sample counters, the
    annealed candidate multiplier and model-based scoring (see the module docstring)."""

    def __init__(self, capacity: int, sample_strategy: Optional[str] = None, insert_strategy: Optional[str] = None,
                 elite_sampling_strategy: str = "strategy3", lambda_batch_multiplier: int = 1,
                 anneal_rounds: int = 10000, elite_batch_size: int = 20, dist_function: str = "ln_norm",
                 p: float = 2, seed: int = 0):
        if sample_strategy not in SAMPLE_STRATEGIES:
            raise ValueError(f"unknown sample_strategy '{sample_strategy}'")
        if insert_strategy not in INSERT_STRATEGIES:
            raise ValueError(f"unknown insert_strategy '{insert_strategy}'")
        if elite_sampling_strategy not in ELITE_STRATEGIES:
            raise ValueError(f"unknown elite_sampling_strategy '{elite_sampling_strategy}'")
        self.ring = RingPositions(capacity)
        self.sample_strategy = sample_strategy
        self.insert_strategy = insert_strategy
        self.elite_sampling_strategy = elite_sampling_strategy
        self.lambda_batch_multiplier = int(lambda_batch_multiplier)
        self.anneal_rounds = int(anneal_rounds)
        self.elite_batch_size = int(elite_batch_size)
        self.dist_function, self.p = dist_function, p  # read by model_scorers, not here
        self.counts = np.zeros(capacity, dtype=np.int64)  # times each position was sampled
        self.rounds = 0                                   # sample() calls so far
        self.newest = -1                                  # last inserted position (attentive anchor)
        # insert_position() gets no rng from its caller, so elite insertion keeps its own
        # (saved with the checkpoint, like the mixer's).
        self.rng = np.random.default_rng(seed)
        self.scorer: Optional[Scorer] = None
        self.attentive_scorer: Optional[AttentiveScorer] = None

    def set_scorer(self, fn: Scorer) -> None:
        self.scorer = fn

    def set_attentive_scorer(self, fn: AttentiveScorer) -> None:
        self.attentive_scorer = fn

    def needs_model(self) -> bool:
        return self.sample_strategy is not None or self.insert_strategy is not None

    def current_multiplier(self) -> int:
        """lambda_t: lambda_batch_multiplier at round 0, linearly down to 1 at round
        anneal_rounds and after, rounded to the nearest integer (never below 1)."""
        if self.anneal_rounds <= 0 or self.rounds >= self.anneal_rounds:
            return 1
        start = self.lambda_batch_multiplier
        value = start + (1 - start) * self.rounds / self.anneal_rounds
        return max(1, math.floor(value + 0.5))

    def _off_policy(self, positions: np.ndarray) -> np.ndarray:
        if self.scorer is None:
            raise RuntimeError("this custom replay scores trajectories with the model: call "
                               "Replay.attach_model(model, device) before it fills or samples")
        return _finite(self.scorer(positions))

    def _attentive(self, positions: np.ndarray) -> np.ndarray:
        if self.attentive_scorer is None:
            raise RuntimeError("attentive_sampling scores trajectories with the model: call "
                               "Replay.attach_model(model, device) before sampling")
        return _finite(self.attentive_scorer(positions, self.newest))

    # -- the sampler interface --------------------------------------------------------

    def insert_position(self) -> int:
        capacity = self.ring.capacity
        if self.insert_strategy is None or self.ring.filled < capacity:
            return self.ring.advance()  # ring order; fills 0, 1, ... before any eviction
        candidates = self.rng.choice(capacity, size=min(self.elite_batch_size, capacity), replace=False)
        return int(candidates[np.argmax(self._off_policy(candidates))])

    def inserted(self, position: int) -> None:
        self.counts[position] = 0  # a new trajectory: never sampled yet
        self.newest = int(position)

    def available(self) -> int:
        return self.ring.filled

    def stored(self) -> int:
        return self.ring.filled  # positions fill in order from 0, also with elite insertion

    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray:
        """Positions [n]; the chosen positions' counters go up by one per pick."""
        filled = self.ring.filled
        if self.sample_strategy is None:
            positions = rng.choice(filled, size=n, replace=n > filled)
        else:
            size = min(filled, self.current_multiplier() * n)
            candidates = rng.choice(filled, size=size, replace=False)
            if size <= n:
                # Every candidate is taken whatever the distances: skip the forward pass.
                # Fewer stored than n (not reached once the mixer's fill-in holds) repeats some.
                positions = np.resize(candidates, n)
            else:
                scored = self._attentive(candidates) if self.sample_strategy == "attentive_sampling" \
                    else self._off_policy(candidates)
                positions = candidates[choose(scored, self.counts[candidates], n, self.elite_sampling_strategy)]
        positions = positions.astype(np.int64)
        np.add.at(self.counts, positions, 1)
        self.rounds += 1
        return positions

    def state_dict(self) -> dict:
        return {"ring": self.ring.state_dict(), "counts": self.counts.copy(), "rounds": self.rounds,
                "newest": self.newest, "rng": self.rng.bit_generator.state}

    def load_state_dict(self, state: dict) -> None:
        self.ring.load_state_dict(state["ring"])
        counts = np.asarray(state["counts"], dtype=np.int64)[: len(self.counts)]
        self.counts[:] = 0
        self.counts[: len(counts)] = counts
        self.rounds = int(state["rounds"])
        self.newest = int(state["newest"])
        self.rng.bit_generator.state = state["rng"]


def model_scorers(storage, model: torch.nn.Module, device: torch.device, dist_function: str,
                  p: float = 2) -> tuple[Scorer, AttentiveScorer]:
    """The two scorers over `storage` (a TrajectoryStorage) with the current `model`.

    The learner trains `model` in another thread: the forward passes run under no_grad
    (thread-local, so the learner's autograd is untouched) and never switch train/eval
    mode. The networks are per-step feed-forward, which is what lets the attentive scorer
    fold time into the batch axis."""

    def features_of(obs: np.ndarray) -> torch.Tensor:
        """obs [T, B, ...] (numpy) -> current-model features [T, B, F] on `device`."""
        with torch.no_grad():
            return model(torch.from_numpy(obs).to(device)).features.float()

    def off_policy(positions: np.ndarray) -> np.ndarray:
        data = storage.read(positions)                       # obs [T+1, C, ...], features [T, C, F]
        current = features_of(data["obs"][:-1])              # [T, C, F], one forward pass
        stored = torch.from_numpy(data["features"]).to(device)
        return distance(dist_function, current, stored, p).cpu().numpy().astype(np.float64)  # [C]

    def attentive(positions: np.ndarray, anchor: int) -> np.ndarray:
        obs = storage.read(positions)["obs"][:-1]            # [T, C, ...]
        T, C = obs.shape[:2]
        last = storage.read(np.array([anchor]))["obs"][-1]   # [1, ...]: the anchor's last state
        flat = np.concatenate([obs.reshape(T * C, *obs.shape[2:]), last])[None]  # [1, T*C+1, ...]
        features = features_of(flat)[0]                      # [T*C+1, F], one forward pass
        candidates = features[:-1].reshape(T, C, -1).mean(dim=0, keepdim=True)  # [1, C, F]
        anchor_features = features[-1].expand_as(candidates)                  # [1, C, F]
        return distance(dist_function, candidates, anchor_features, p).cpu().numpy().astype(np.float64)

    return off_policy, attentive
