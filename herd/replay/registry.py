"""The replay kinds, keyed by the "type" of a --replay_parameters entry: what extra keys a
kind accepts (checked when the options are parsed, before anything runs) and how it is
built. A new kind is a sampler class (the protocol of samplers.py) and one entry here."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from herd.errors import ConfigError
from herd.inputs import excerpt
from herd.replay.circular import CircularSampler
from herd.replay.distances import DISTANCES
from herd.replay.elite import (DEFAULT_SCORE_STEPS, ELITE_STRATEGIES, INSERT_STRATEGIES, SAMPLE_STRATEGIES,
                               EliteSampler)
from herd.replay.prioritized import PrioritizedSampler
from herd.replay.replay import Replay
from herd.replay.samplers import UniformSampler
from herd.replay.slot_queue import SlotQueue
from herd.replay.transitions import TransitionReplay
from herd.store import TrajectoryStore
from herd.trajectory import TrajectoryLayout


@dataclass(frozen=True)
class BuildOptions:
    share: int                      # trajectories this replay gives to each batch
    rollout_size: int               # trajectories one actor rollout brings (envs_per_worker)
    compress: bool = False          # LZ4-pack stored observations (off-policy replays)
    compression_level: int = 0
    anneal_rounds_base: int = 10000  # custom, prioritized: the run's lr_scheduler_steps
    seed: int = 0
    n_step: int = 1                 # prioritized: transitions carry n-step windows (Ape-X's --n_step)
    # Where every replay keeps its items: None on the host (numpy), or a torch device (the
    # learner's GPU): queue, standard, custom (elite/attentive) and circular replays then keep
    # their herd/store.py TrajectoryStore there, and a prioritized replay's priorities with them.
    storage_device: Any = None
    # With storage_device: the learner's copy stream (herd/device_copies.py), which every
    # replay's store copies rollouts on.
    device_copies: Any = None
    # queue: batches it may have lent at once (read in place by a CPU learner, herd/replay/
    # mixer.py `lends`: the one being trained and those prepared ahead), kept from new writes.
    lent_batches: int = 0


@dataclass(frozen=True)
class ReplayKind:
    on_policy: bool
    check_options: Callable[[str, dict], None] | None   # where, extra keys -> raises ConfigError; None: no keys
    build: Callable[[Any, TrajectoryLayout, BuildOptions], Replay]


def build_queue(spec, layout: TrajectoryLayout, o: BuildOptions) -> Replay:
    # Room for the batches lent, one batch share and one actor rollout, so fresh trajectories
    # are never overwritten before the learner used them and a rollout never waits for a
    # lent batch to come back; never compressed (each is read once, soon). A whole number
    # of shares, so that no batch wraps around the ring: each is one run of positions, which
    # a CPU learner reads in place (TrajectoryStore.lend) instead of copying.
    needed = max(spec.capacity, o.share * (o.lent_batches + 1) + o.rollout_size)
    capacity = -(-needed // o.share) * o.share if o.share > 0 else needed
    storage = TrajectoryStore(layout, capacity, o.storage_device, copies=o.device_copies)
    return SlotQueue(storage, o.share)


def off_policy_storage(spec, layout: TrajectoryLayout, o: BuildOptions) -> TrajectoryStore:
    """A host store (LZ4-packed observations with --use_replay_compression), or one on a
    GPU learner's device (never compressed: decompressing on the host is the copy it removes)."""
    if o.storage_device is not None:
        return TrajectoryStore(layout, spec.capacity, o.storage_device, copies=o.device_copies)
    return TrajectoryStore(layout, spec.capacity, compress_obs=o.compress, compression_level=o.compression_level)


def build_standard(spec, layout: TrajectoryLayout, o: BuildOptions) -> Replay:
    return Replay("standard", off_policy_storage(spec, layout, o), UniformSampler(spec.capacity), on_policy=False)


# The custom (elite/attentive) type's keys: allowed values, or None for a number checked below.
CUSTOM_KEYS = {
    "dist_function": DISTANCES,
    "p": None,
    "insert_strategy": tuple(s for s in INSERT_STRATEGIES if s),
    "sample_strategy": tuple(s for s in SAMPLE_STRATEGIES if s),
    "lambda_batch_multiplier": None,
    "alfa_annealing_factor": None,
    "elite_sampling_strategy": ELITE_STRATEGIES,
    "elite_batch_size": None,
    "score_steps": None,  # herd's own: time steps per candidate scored (int >= 1 or "all"); see elite.py
}


def is_int_at_least(value, low: int) -> bool:
    return not isinstance(value, bool) and isinstance(value, int) and value >= low


def is_positive_number(value) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, float)) and value > 0


def check_custom_options(where: str, extra: dict) -> None:
    for key, value in extra.items():
        if key not in CUSTOM_KEYS:
            raise ConfigError(f"{where}: unknown key '{excerpt(key)}' for type 'custom' (known: {', '.join(CUSTOM_KEYS)})")
        allowed = CUSTOM_KEYS[key]
        if allowed is not None and value not in allowed:
            raise ConfigError(f"{where}: {key} '{excerpt(value)}' is not one of {', '.join(allowed)}")
    if "dist_function" not in extra:
        raise ConfigError(f"{where}: type 'custom' needs a dist_function ({', '.join(DISTANCES)})")
    checks = (("lambda_batch_multiplier", 1, lambda v: is_int_at_least(v, 1), "an integer >= 1"),
              ("alfa_annealing_factor", 1.0, is_positive_number, "a number > 0"),
              ("p", 2, is_positive_number, "a number > 0"),
              ("score_steps", 1, lambda v: v == "all" or is_int_at_least(v, 1), 'an integer >= 1 or "all"'),
              ("elite_batch_size", 20, lambda v: is_int_at_least(v, 1), "an integer >= 1"))
    for key, default, ok, what in checks:
        value = extra.get(key, default)
        if not ok(value):
            raise ConfigError(f"{where}: {key} must be {what}, got {excerpt(value)}")


def build_custom(spec, layout: TrajectoryLayout, o: BuildOptions) -> Replay:
    """Anneals its candidate multiplier over anneal_rounds_base * alfa_annealing_factor
    sample calls; `seed` drives elite insertion. Needs Replay.attach_model before use when
    it has a strategy."""
    score_steps = spec.option("score_steps", DEFAULT_SCORE_STEPS)
    sampler = EliteSampler(
        spec.capacity,
        sample_strategy=spec.option("sample_strategy"),
        insert_strategy=spec.option("insert_strategy"),
        elite_sampling_strategy=spec.option("elite_sampling_strategy", "strategy3"),
        lambda_batch_multiplier=spec.option("lambda_batch_multiplier", 1),
        anneal_rounds=round(o.anneal_rounds_base * spec.option("alfa_annealing_factor", 1.0)),
        elite_batch_size=spec.option("elite_batch_size", 20),
        dist_function=spec.option("dist_function", "ln_norm"),
        p=spec.option("p", 2),
        score_steps=None if score_steps == "all" else score_steps,
        seed=o.seed)
    return Replay("custom", off_policy_storage(spec, layout, o), sampler, on_policy=False)


# The prioritized type's keys: (default, check, what the check wants).
PRIORITIZED_KEYS = {
    "alpha": (0.6, lambda v: is_number(v) and v >= 0, "a number >= 0"),
    "beta": (0.4, lambda v: is_number(v) and 0 <= v <= 1, "a number in [0, 1]"),
    "beta_annealing_steps": (None, lambda v: is_int_at_least(v, 0), "an integer >= 0 (learner batches)"),
    "epsilon": (1e-6, is_positive_number, "a number > 0"),
}


def is_number(value) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, float))


def check_prioritized_options(where: str, extra: dict) -> None:
    for key, value in extra.items():
        if key not in PRIORITIZED_KEYS:
            raise ConfigError(f"{where}: unknown key '{excerpt(key)}' for type 'prioritized' "
                              f"(known: {', '.join(PRIORITIZED_KEYS)})")
        _, ok, what = PRIORITIZED_KEYS[key]
        if not ok(value):
            raise ConfigError(f"{where}: {key} must be {what}, got {excerpt(value)}")


def build_prioritized(spec, layout: TrajectoryLayout, o: BuildOptions) -> TransitionReplay:
    """Ape-X's replay: one item per transition (see transitions.py). beta anneals to 1 over
    beta_annealing_steps batches, by default the run's lr_scheduler_steps (its whole length)."""
    annealing = spec.option("beta_annealing_steps")
    options = dict(steps=layout.unroll_length, alpha=spec.option("alpha", 0.6), beta=spec.option("beta", 0.4),
                   epsilon=spec.option("epsilon", 1e-6),
                   beta_annealing_steps=o.anneal_rounds_base if annealing is None else annealing)
    # On a GPU learner the priorities live beside the trajectories, on its device.
    sampler = PrioritizedSampler(spec.capacity, device=o.storage_device or "cpu", **options)
    return TransitionReplay("prioritized", off_policy_storage(spec, layout, o), sampler, n_step=o.n_step)


# The circular type's one key: K, the passes over each batch (IMPACT's
# circular_buffer_iterations_per_batch; its capacity, N batches, is the entry's capacity).
CIRCULAR_DEFAULT_ITERATIONS = 2


def check_circular_options(where: str, extra: dict) -> None:
    for key, value in extra.items():
        if key != "iterations_per_batch":
            raise ConfigError(f"{where}: unknown key '{key}' for type 'circular' (known: iterations_per_batch)")
        if not is_int_at_least(value, 1):
            raise ConfigError(f"{where}: iterations_per_batch must be an integer >= 1, got {value!r}")


def build_circular(spec, layout: TrajectoryLayout, o: BuildOptions) -> Replay:
    """IMPACT's circular buffer (herd/replay/circular.py): the entry's capacity counts
    BATCHES (N), each of the replay's share; every batch is served iterations_per_batch (K)
    times. Never compressed: each batch is read K times within moments."""
    sampler = CircularSampler(spec.capacity, o.share, spec.option("iterations_per_batch", CIRCULAR_DEFAULT_ITERATIONS))
    # On a GPU learner the batches stay in device memory, as the queue's do.
    storage = TrajectoryStore(layout, sampler.capacity, o.storage_device, copies=o.device_copies)
    return Replay("circular", storage, sampler, on_policy=True)


REPLAY_KINDS: dict[str, ReplayKind] = {
    "queue": ReplayKind(on_policy=True, check_options=None, build=build_queue),
    "standard": ReplayKind(on_policy=False, check_options=None, build=build_standard),
    "custom": ReplayKind(on_policy=False, check_options=check_custom_options, build=build_custom),
    "prioritized": ReplayKind(on_policy=False, check_options=check_prioritized_options, build=build_prioritized),
    # on_policy: fresh data the mixer waits for (a batch with uses left), never CLEAR's "replayed".
    "circular": ReplayKind(on_policy=True, check_options=check_circular_options, build=build_circular),
}


def build_replay(spec, layout: TrajectoryLayout, share: int, rollout_size: int, **options) -> Replay:
    """One replay from its --replay_parameters entry (see BuildOptions for `options`)."""
    return REPLAY_KINDS[spec.type].build(spec, layout, BuildOptions(share, rollout_size, **options))
