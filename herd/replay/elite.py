"""Elite and attentive experience replay: the sampler of the `custom` replay type.

The sampler stays pure numpy: it never sees the model. Distances come from scorers that
`Replay.attach_model` builds (`model_scorers` below) and hands over with `set_scorer` /
`set_attentive_scorer`; tests pass fake ones. A scorer maps stored positions [C] to
distances [C], smaller = closer (`rng` picks the time steps it looks at, see score_steps):
    off-policy scorer  fn(positions, rng) -> distance between the current model's features
                       of each trajectory and the behaviour features stored with it
    attentive scorer   fn(positions, anchor, rng) -> distance between each trajectory's
                       current-model features (mean over its steps) and the current-model
                       features of the last observation of trajectory `anchor`

Cost. Scoring is a forward pass of the current model over candidates x steps frames, next
to a learner step over batch x (T+1) frames forward and backward (about 3x a forward). With
all T steps, lambda 6 and half the batch replayed that is as much work as the learner step
itself. `score_steps` (a herd key of the custom replay) scores k random steps per round
instead of all T: the mean over k uniformly drawn steps is an unbiased estimate of the mean
over all T, and the same k steps are used for every candidate of a round, so the ranking
compares like with like. benchmarks/replay_sampling.py measures the cost.

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
distance) is overwritten instead of the oldest. One scored candidate set serves several
insertions (each takes the farthest candidate left) until half of it is used or the next
sample() call, after which the model has moved on and the set is scored afresh: an actor
rollout of E trajectories then costs one forward pass, not E.

A NaN distance (features never written, a diverged model) counts as infinitely far: never
preferred by sampling, first to go on insertion.
"""
from __future__ import annotations

import math
from typing import Callable, Optional

import numpy as np
import torch

from herd.models import action_distribution_of
from herd.models.core import recurrent_core
from herd.ops.distributions import Categorical, get_distribution
from herd.replay.distances import distance
from herd.replay.recurrent import on_device, recurrent_scorers, scored_steps
from herd.replay.samplers import RingPositions, Sampler

Scorer = Callable[[np.ndarray, np.random.Generator], np.ndarray]
AttentiveScorer = Callable[[np.ndarray, int, np.random.Generator], np.ndarray]

SAMPLE_STRATEGIES = (None, "elite_sampling", "attentive_sampling")
INSERT_STRATEGIES = (None, "elite_insertion")
ELITE_STRATEGIES = ("strategy1", "strategy2", "strategy3", "strategy4")
# Time steps per candidate that elite/attentive scoring looks at, unless the replay's
# score_steps key says otherwise ("all" = every step). Chosen by benchmarks/replay_sampling.py.
DEFAULT_SCORE_STEPS = 2


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


class EliteSampler(Sampler):
    """The sampler protocol of samplers.py, plus per-position sample counters, the
    annealed candidate multiplier and model-based scoring (see the module docstring)."""

    def __init__(self, capacity: int, sample_strategy: Optional[str] = None, insert_strategy: Optional[str] = None,
                 elite_sampling_strategy: str = "strategy3", lambda_batch_multiplier: int = 1,
                 anneal_rounds: int = 10000, elite_batch_size: int = 20, dist_function: str = "ln_norm",
                 p: float = 2, score_steps: Optional[int] = None, seed: int = 0):
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
        # Read by model_scorers, not here. score_steps None: every step of a trajectory.
        self.dist_function, self.p, self.score_steps = dist_function, p, score_steps
        self.counts = np.zeros(capacity, dtype=np.int64)  # times each position was sampled
        self.rounds = 0                                   # sample() calls so far
        self.newest = -1                                  # last inserted position (attentive anchor)
        # insert_position() gets no rng from its caller, so elite insertion keeps its own
        # (saved with the checkpoint, like the mixer's).
        self.rng = np.random.default_rng(seed)
        self.eviction_order: list[int] = []               # scored candidates, nearest first
        self.eviction_budget = 0                          # insertions the scored set may still serve
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

    def _off_policy(self, positions: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        if self.scorer is None:
            raise RuntimeError("this custom replay scores trajectories with the model: call "
                               "Replay.attach_model(model, device) before it fills or samples")
        return _finite(self.scorer(positions, rng))

    def _attentive(self, positions: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        if self.attentive_scorer is None:
            raise RuntimeError("attentive_sampling scores trajectories with the model: call "
                               "Replay.attach_model(model, device) before sampling")
        return _finite(self.attentive_scorer(positions, self.newest, rng))

    # -- the sampler interface --------------------------------------------------------

    def add(self) -> int:
        position = self.insert_position()
        self.counts[position] = 0  # a new trajectory: never sampled yet
        self.newest = int(position)
        return position

    def insert_position(self) -> int:
        capacity = self.ring.capacity
        if self.insert_strategy is None or self.ring.filled < capacity:
            return self.ring.advance()  # ring order; fills 0, 1, ... before any eviction
        if self.eviction_budget <= 0 or not self.eviction_order:
            candidates = self.rng.choice(capacity, size=min(self.elite_batch_size, capacity), replace=False)
            distances = self._off_policy(candidates, self.rng)
            self.eviction_order = [int(c) for c in candidates[np.argsort(distances, kind="stable")]]
            self.eviction_budget = max(1, len(candidates) // 2)
        self.eviction_budget -= 1
        return self.eviction_order.pop()  # the farthest candidate left

    def available(self) -> int:
        return self.ring.filled

    def stored(self) -> int:
        return self.ring.filled  # positions fill in order from 0, also with elite insertion

    def sample(self, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """Positions [n] and the chance [n] each had of entering the candidate set (which of
        the candidates are taken is then decided by distance, not by chance); the chosen
        positions' counters go up by one per pick."""
        filled = self.ring.filled
        if self.sample_strategy is None:
            positions = rng.choice(filled, size=n, replace=n > filled)
            chance = 1.0 / filled
        else:
            size = min(filled, self.current_multiplier() * n)
            chance = size / filled
            candidates = rng.choice(filled, size=size, replace=False)
            if size <= n:
                # Every candidate is taken whatever the distances: skip the forward pass.
                # Fewer stored than n (not reached once the mixer's fill-in holds) repeats some.
                positions = np.resize(candidates, n)
            else:
                scored = self._attentive(candidates, rng) if self.sample_strategy == "attentive_sampling" \
                    else self._off_policy(candidates, rng)
                positions = candidates[choose(scored, self.counts[candidates], n, self.elite_sampling_strategy)]
        positions = positions.astype(np.int64)
        np.add.at(self.counts, positions, 1)
        self.rounds += 1
        self.eviction_budget = 0  # the model has moved on: score eviction candidates afresh
        return positions, np.full(n, chance)

    def update(self, positions: np.ndarray, values: np.ndarray) -> None:
        pass  # distances are recomputed with the current model at every sample: nothing to keep

    def state_dict(self) -> dict:
        return {"ring": self.ring.state_dict(), "counts": self.counts.copy(), "rounds": self.rounds,
                "newest": self.newest, "rng": self.rng.bit_generator.state,
                "eviction_order": np.array(self.eviction_order, dtype=np.int64), "eviction_budget": self.eviction_budget}

    def load_state_dict(self, state: dict) -> None:
        self.ring.load_state_dict(state["ring"])
        counts = np.asarray(state["counts"], dtype=np.int64)[: len(self.counts)]
        self.counts[:] = 0
        self.counts[: len(counts)] = counts
        self.rounds = int(state["rounds"])
        self.newest = int(state["newest"])
        self.rng.bit_generator.state = state["rng"]
        self.eviction_order = [int(p) for p in np.asarray(state.get("eviction_order", []), dtype=np.int64)]
        self.eviction_budget = int(state.get("eviction_budget", 0))


def model_scorers(storage, model: torch.nn.Module, device: torch.device, dist_function: str,
                  p: float = 2, score_steps: Optional[int] = None,
                  bf16: bool = False) -> tuple[Scorer, AttentiveScorer]:
    """The two scorers over `storage` (a TrajectoryStore on the host, or on a
    GPU learner's device: read_steps then gives device tensors and no frame is copied to the host;
    only the distances [C] come back, for the numpy strategies) with the current `model`.

    The learner trains `model` in another thread: the forward passes run under no_grad
    (thread-local, so the learner's autograd is untouched) and never switch train/eval
    mode. Feed-forward networks are per-step, which is what lets both scorers fold the
    chosen steps into the batch axis of one forward pass. A network with an LSTM core
    (--use_lstm) cannot see a step on its own: its features come from unrolling each
    trajectory from its stored start state up to the last step scored (recurrent.py).
    With `bf16` (a bf16 learner) they run under the same autocast; distances are
    computed in float32.

    kl_div with continuous actions (a Gaussian policy) compares policies, not features:
    the KL of the current policy from the stored behaviour Gaussian (behaviour_mean,
    behaviour_log_std), summed over action dimensions and averaged over the steps scored.
    Softmaxed features, what kl_div compares for discrete policies, say nothing about a
    Gaussian's actions. ln_norm and cos_dist compare features either way."""
    if recurrent_core(model) is not None:
        if dist_function == "kl_div" and get_distribution(action_distribution_of(model)) is not Categorical:
            raise ValueError("elite kl_div with an LSTM core and continuous actions is not built: use ln_norm or cos_dist")
        return recurrent_scorers(storage, model, device, dist_function, p, score_steps, bf16)
    T = storage.unroll_length
    dist = get_distribution(action_distribution_of(model))
    policy_kl = dist_function == "kl_div" and dist is not Categorical

    def steps_of(rng: np.random.Generator) -> np.ndarray:
        """The time steps [k] scored this round: all T, or score_steps of them at random."""
        return scored_steps(T, score_steps, rng)

    def features_of(obs) -> torch.Tensor:
        """obs [k, C, ...] (numpy or tensor) -> current-model features [k, C, F] on `device`."""
        with torch.no_grad(), torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            return model(on_device(obs, device)).features.float()

    def gaussian_kl(positions: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        fields = tuple(f"behaviour_{name}" for name in dist.param_names)
        data = storage.read_steps(positions, steps_of(rng), ("obs", *fields))    # obs [k, C, ...], params [k, C, A]
        with torch.no_grad(), torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            current = model(on_device(data["obs"], device)).logits.float()   # [k, C, 2A]
        stored = dist.join(*(on_device(data[f], device) for f in fields))   # [k, C, 2A]
        return dist.kl(stored, current).mean(dim=0).cpu().numpy().astype(np.float64)  # [C]

    def off_policy(positions: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        if policy_kl:
            return gaussian_kl(positions, rng)
        data = storage.read_steps(positions, steps_of(rng), ("obs", "features"))  # obs [k, C, ...], features [k, C, F]
        current = features_of(data["obs"])                                      # [k, C, F], one forward pass
        stored = on_device(data["features"], device)
        # The distances [C] come back to the host: the strategies (choose) are numpy, and C
        # floats are all that crosses, never the frames.
        return distance(dist_function, current, stored, p).cpu().numpy().astype(np.float64)  # [C]

    def attentive(positions: np.ndarray, anchor: int, rng: np.random.Generator) -> np.ndarray:
        obs = on_device(storage.read_steps(positions, steps_of(rng), ("obs",))["obs"], device)     # [k, C, ...]
        k, C = obs.shape[:2]
        last = on_device(storage.read_steps(np.array([anchor]), np.array([T]), ("obs",))["obs"][0], device)  # [1, ...]
        flat = torch.cat([obs.reshape(k * C, *obs.shape[2:]), last])[None]      # [1, k*C+1, ...]
        features = features_of(flat)[0]                                          # [k*C+1, F], one forward pass
        candidates = features[:-1].reshape(k, C, -1).mean(dim=0, keepdim=True)   # [1, C, F]
        anchor_features = features[-1].expand_as(candidates)                     # [1, C, F]
        return distance(dist_function, candidates, anchor_features, p).cpu().numpy().astype(np.float64)

    return off_policy, attentive
