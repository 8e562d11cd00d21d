"""herd's defaults: per kind of environment (PROFILES), per algorithm (ALGORITHM_PROFILES)
and per machine (MACHINE_PROFILES). Data only, and the one lookup that needs the hardware;
herd/config.py's apply_profile fills a config's unset options from them (the algorithm's
first, then the machine's, then the environment kind's), and `--help` shows them.

A field whose default is None in herd/config.py and which appears here takes its default
from these tables; the command line, multi_train.py and a resumed checkpoint still win."""
from __future__ import annotations

from typing import Any

from herd.devices import learner_device

QUEUE_ONLY = '[{"type": "queue", "capacity": 1, "sample_ratio": 1}]'           # on-policy: fresh data only
CONTINUOUS_REPLAY = ('[{"type": "queue", "capacity": 1, "sample_ratio": 0.25}, '
                     '{"type": "standard", "capacity": 2000, "sample_ratio": 0.75}]')     # continuous control


# What the tasks with small vector observations share (vector and continuous, below): Adam
# on small batches, a one-thread fp32 learner, no prefetching or compression (nothing to
# gain at this size), rewards x 0.1 for learning (scores stay raw): CartPole's returns of
# ~100 made the policy collapse after solving in some seeds (README, CartPole: the late
# collapse).
SMALL_INPUTS: dict[str, Any] = dict(
    lr=0.001, batch_size=8, r_f_steps=16, optimizer="adam", rmsprop_eps=0.01, clip_rewards=False,
    feature_out_layer_size=64, learner_thread_count=1, learner_precision="fp32", shared_queue_size=4, caching=False,
    use_replay_compression=False, reward_scale=0.1,
    # An LSTM core as wide as the MLP: with 256 units the policy head reads 4x
    # the inputs of the feed-forward one, Adam moves each weight by about lr per update
    # regardless, and the policy's entropy fell from ln 2 to 0.13 within 50 updates on
    # CartPole (0.62 feed-forward, 0.53 with 64 units): runs that learned then collapsed.
    lstm_size=64,
)
# Defaults that depend on the kind of environment. The README's table of differing
# defaults says where and why they differ from the seed's.
PROFILES: dict[str, dict[str, Any]] = {
    # The batch, unroll, learning rate, actors' envs and replays depend on the machine:
    # MACHINE_PROFILES below.
    "atari": dict(
        optimizer="rmsprop", rmsprop_eps=1e-5, environment_max_steps=15_000_000, clip_rewards=True,
        feature_out_layer_size=512, lstm_size=256, learner_precision="auto", shared_queue_size=16, caching=True,
        use_replay_compression=True, reward_scale=1.0,
        # Frames normalised per pixel (herd/models/normalize.py FrameNormalizer), as Sample
        # Factory's and rl_games' Atari defaults normalise their inputs: on Pong (2-core
        # Xeon) IMPALA's 100-game average reached 10 at 2.8M frames instead of 8.9M, and
        # with no flag 18 at 13 minutes instead of not within 35 (docs/benchmarks.md).
        normalize_observations=True,
        # The entropy bonus a tenth of the seed's 0.01: herd's losses are means and its
        # V-trace advantages on Pong's clipped rewards are small (no normalisation), so at
        # 0.01 the bonus outweighed the policy gradient and the policy stayed near uniform
        # (entropy 1.65 of ln 6 = 1.79 at a 100-game average of 18); at 0.001 IMPALA's
        # average reached 18 on 2.4M frames instead of 3.8M (2-core Xeon; docs/benchmarks.md,
        # "The entropy bonus on Atari"). APPO normalises its advantages and keeps PPO's 0.01
        # (APPO_PROFILE).
        entropy_loss_weight=0.001,
    ),
    "vector": dict(
        SMALL_INPUTS, environment_max_steps=500_000, envs_per_worker=16, replay_parameters=QUEUE_ONLY,
        normalize_observations=False,
    ),
    # -- continuous control: vector observations, Box actions (Pendulum, MuJoCo,
    # Box2D). README, "Continuous control", says how these were chosen.
    # A quarter of each batch fresh, three quarters replayed (CLEAR): each step is trained on
    # about four times; on-policy batches alone did not learn Pendulum in 200k steps.
    "continuous": dict(
        SMALL_INPUTS, environment_max_steps=1_000_000, envs_per_worker=8, replay_parameters=CONTINUOUS_REPLAY,
        normalize_observations=True,
    ),
    # --- MinAtar -------------------------------------------------------------
    # 10x10 frames, 0/1 rewards, cheap steps: on-policy IMPALA as on vector tasks (Adam,
    # the queue only, a 1-thread fp32 learner, no prefetching: the extra policy lag costs
    # more than sampling does), with longer unrolls and bigger batches for the longer
    # games. `--network=auto` picks minatar_cnn for these frames (herd/models/__init__.py).
    "minatar": dict(
        lr=0.001, batch_size=16, r_f_steps=20, optimizer="adam", rmsprop_eps=0.01,
        environment_max_steps=5_000_000, clip_rewards=False, envs_per_worker=16,
        replay_parameters=QUEUE_ONLY,
        feature_out_layer_size=128, lstm_size=256, learner_thread_count=1, learner_precision="fp32", shared_queue_size=4,
        caching=False, use_replay_compression=False,
    ),
    # --- end MinAtar ----------------------------------------------------------------------
}


# Defaults that depend on the machine a run finds, per environment kind and learner device
# ("cpu" or "cuda"), applied after the algorithm's profile and before the kind's.
# Atari: on-policy IMPALA (the queue only: every frame trained on once, as in the IMPALA
# paper's Pong runs) with unrolls of 20 and RMSprop at 0.0006, in batches of 8 on either
# learner device. A CPU learner is what limits learning there (README, Pong learning: with
# 32 trajectories per batch 12 minutes on 2 cores were not enough to start); a GPU learner
# has the updates to spare, and there too batches of 8 need fewer frames: on one H100 in
# 175 s Pong's average reached -8.4 on 7.5M frames with 8 and -20.2 on 7.7M with 32
# (herd 3e1816f; docs/benchmarks.md, "The entropy bonus on Atari"). The learning rate
# decays over the whole run (15M steps: about 94,000 updates of 8 x 20 steps). Precision,
# threads, compiling and capture are picked in apply_profile from the hardware. APPO's
# profile, applied before this one, sets its own (a GPU run is APPO unless it asks for
# IMPALA: MACHINE_ALGORITHMS below).
ATARI_ON_POLICY = dict(r_f_steps=20, lr=0.0006, envs_per_worker=8, replay_parameters=QUEUE_ONLY, batch_size=8)
MACHINE_PROFILES: dict[str, dict[str, dict[str, Any]]] = {
    "atari": {"cpu": ATARI_ON_POLICY, "cuda": ATARI_ON_POLICY},
}
# The algorithm where --algorithm is unset, per environment kind and learner device: the
# one that needs the fewest frames where the learner has compute to spare. A GPU learner's
# captured update is about 1 ms, a few percent of its time, so on Atari it runs APPO (16
# gradient steps per 1,024 agent steps): on Pong APPO reached 20 within 5M frames in 2
# seeds of 3, IMPALA's one pass in 1 seed of 7 (docs/benchmarks.md, "APPO on Pong"). A CPU
# learner pays for each pass with the actors' cores, and there IMPALA reached 20 sooner in
# wall time (16 minutes against APPO's 28 on a 2-core EPYC). A run that names an option only IMPALA has (a replay
# other than the queue, LASER's mask, CLEAR's cloning terms, the entropy decay) runs IMPALA.
MACHINE_ALGORITHMS: dict[str, dict[str, str]] = {"atari": {"cuda": "appo"}}
DEFAULT_ALGORITHM = "impala"


def machine_algorithm(kind: str, device: str, needs_impala: bool) -> str:
    """--algorithm's default for this kind of environment on the learner device that
    --device gives here; needs_impala: the run names an option only IMPALA has."""
    if needs_impala:
        return DEFAULT_ALGORITHM
    return MACHINE_ALGORITHMS.get(kind, {}).get(learner_device(device).type, DEFAULT_ALGORITHM)


# A run this long (environment steps) compiles its Atari learner by default: compiling costs
# 20-40 s at the start; over the channels-last learner it gains nothing at batch 8 and up
# to 10% at batch 32 in bf16 on a 2-core Xeon (README, learner step).
COMPILE_FROM_STEPS = 1_000_000


# Ape-X's defaults per environment kind, applied before (so over) the kind's own profile
# where --algorithm=apex. Transitions, not trajectories, are its batch items (README, Ape-X).
# IMPACT (Luo et al. 2020; docs/impact.md): the paper's Atari circular buffer (N = 4 batches,
# each trained on K = 2 times) on every kind, and a target network synced once per N x K
# updates (a full turn of the buffer). The rest is IMPALA's profile for the kind.
CIRCULAR = '[{"type": "circular", "capacity": 4, "sample_ratio": 1, "iterations_per_batch": 2}]'
IMPACT_PROFILE: dict[str, Any] = dict(replay_parameters=CIRCULAR, target_update_period=8)

# APPO (herd/losses/appo.py): PPO's reuse on the V-trace path, with PPO's published Atari
# settings where herd has the same knob (CleanRL's ppo_atari, Sample Factory's APPO on
# Atari): 4 passes of 4 minibatches over each stored batch, clip 0.1, lambda 0.95,
# advantages normalised, Adam at 2.5e-4 with a gradient clip of 0.5 that acts. The target
# network is the learner as each stored batch arrives (PPO's old policy).
# On Atari, Sample Factory's shape, measured (docs/benchmarks.md, APPO on Pong): frames
# normalised per pixel (as every Atari run) and returns by their running scale, 128-step rollouts sampled
# synchronously (samples_synchronously). On Pong the normalisations took the 100-game
# average at 1.5M frames from -19.6 to +13.9 (18 at 2.8M frames; 20 not reached within 5M
# with the clip at 0.1).
APPO_PROFILE: dict[str, Any] = dict(
    passes_per_batch=4, minibatches_per_pass=4, vtrace_lambda=0.95, clip_param=0.1, normalize_advantages=True,
    gradient_clip_by_norm_threshold=0.5, target_update_period=1, optimizer="adam", replay_parameters=QUEUE_ONLY,
    use_policy_cloning_loss=False, use_value_cloning_loss=False, entropy_loss_weight=0.01)
# On Atari the clip is 0.3, not PPO's 0.1: with 0.1 no seed of 3 reached 20 within 5M frames
# on Pong, with 0.2 one of 3, with 0.3 two of 3 (3.68M and 4.81M frames; docs/benchmarks.md,
# "APPO on Pong"). A stored batch is 8 trajectories of 128 steps (PPO's 1,024 steps, in
# minibatches of 256) whatever the actors' count: one rollout of every game on 2 cores.
APPO_KINDS: dict[str, dict[str, Any]] = {
    "atari": dict(lr=0.00025, r_f_steps=128, envs_per_worker=4, normalize_returns=True, clip_param=0.3, batch_size=8),
    "minatar": dict(batch_size=32),
    "vector": dict(batch_size=32),
    "continuous": dict(batch_size=32),
}

# (algorithm, environment kind) whose actors sample synchronously by default (Sample
# Factory's async_rl=False for its Atari APPO): the local backend only, which builds it.
SYNCHRONOUS_BY_DEFAULT = {("appo", "atari")}


def samples_synchronously(algorithm: str, kind: str, backend: str) -> bool:
    """--synchronous_sampling's default."""
    return (algorithm, kind) in SYNCHRONOUS_BY_DEFAULT and backend == "python_native"


def slots_for_bounded_lag(batch_size: int, worker_count: int, envs_per_worker: int, fewest: int = 1) -> int:
    """--shared_queue_size for an algorithm that reuses each batch (APPO): the actors' slots
    hold about one batch waiting plus one round being filled, so the behaviour policies stay
    within a few updates of the learner (16 slots per actor let 4-10 updates of lag build up
    on 2 cores, where the learner is the slower side). A slot holds one rollout of
    envs_per_worker trajectories. Where one round of every actor already holds more than a
    batch, one slot each: a second would only add whole batches of waiting. fewest: 2 where
    the actors need two (env batches, double buffering)."""
    per_round = worker_count * envs_per_worker            # trajectories, one slot per actor
    if batch_size < per_round:
        return fewest
    return max(fewest, -(-batch_size // per_round) + 1)


# Defaults for one game with one algorithm, applied before (so over) the kind's profile:
# the run's length, which is also the span over which the learning rate decays to its end
# (--lr_scheduler_steps unset). On Pong, IMPALA with the learning rate decayed over the
# first 8M frames (2M agent steps) reached a 100-game average of 20 at 7.0M frames, winning
# 60 of its last 100 games 21-0; with the Atari-wide 60M-frame run (the rate still at 0.87 of
# its start at 8M frames) the same configuration stayed at 18-19.8, losing every game's
# opening rally (docs/benchmarks.md, "The learning rate's decay on Pong").
# Its entropy bonus is 0.0003, not Atari's 0.001: with the rate decayed over 5M frames,
# 0.001 reached 18 at 2.41M frames and stayed at 19.0-19.4 as the policy's entropy rose
# from 1.0 to 1.33 (the bonus outweighing the small advantages of a policy that wins most
# points); 0.0003 reached 18 at 2.33M and 19.81; 0.0001 collapsed the entropy to 0.24 and
# climbed slower. With both, the no-flag run reached 20 at 3.39M frames, 10.7 minutes from
# launch on a 2-core Xeon (docs/benchmarks.md, "The learning rate's decay on Pong").
# APPO on Pong runs 5M frames, its learning rate decaying over them: the schedule of the
# measured seeds (docs/benchmarks.md, "APPO on Pong").
GAME_PROFILES: dict[tuple[str, str], dict[str, Any]] = {
    ("impala", "PongNoFrameskip-v4"): dict(environment_max_steps=2_000_000, entropy_loss_weight=0.0003),
    ("appo", "PongNoFrameskip-v4"): dict(environment_max_steps=1_250_000),
}


def game_profile(algorithm: str, env_id: str) -> dict[str, Any]:
    return GAME_PROFILES.get((algorithm, env_id), {})


# What an option left unset takes when no profile above names it.
FALLBACKS: dict[str, Any] = dict(
    passes_per_batch=1, minibatches_per_pass=1, vtrace_lambda=1.0, clip_param=0.4, gradient_clip_by_norm_threshold=40.0,
    normalize_advantages=False, value_clip=0.0, normalize_returns=False, entropy_loss_weight=0.01, entropy_decay=False)

ALGORITHM_PROFILES: dict[str, dict[str, dict[str, Any]]] = {
    "impact": {kind: dict(IMPACT_PROFILE) for kind in ("atari", "vector", "continuous", "minatar")},
    "appo": {kind: dict(APPO_PROFILE, **extra) for kind, extra in APPO_KINDS.items()},
    "apex": {
        # Horgan et al.: Adam-like small steps (the paper: RMSprop 0.00025/4), n=3, target sync
        # every 2500 updates, a replay ratio near 1; batch 128 instead of 512 on a CPU.
        "atari": dict(
            lr=0.0001, optimizer="adam", batch_size=128, r_f_steps=20, target_update_period=2500, replay_ratio=1.0,
            normalize_observations=False,     # its target network would normalise with older statistics
            replay_parameters='[{"type": "prioritized", "capacity": 5000, "sample_ratio": 1, "alpha": 0.6, '
                              '"beta": 0.4}]',
        ),
        # CartPole-sized tasks: many cheap updates per environment step and a fast target.
        "vector": dict(
            lr=0.001, optimizer="adam", batch_size=128, r_f_steps=16, envs_per_worker=8, target_update_period=250,
            replay_ratio=8.0, environment_max_steps=170_000, reward_scale=1.0,     # measured with raw rewards
            replay_parameters='[{"type": "prioritized", "capacity": 3000, "sample_ratio": 1, "alpha": 0.6, '
                              '"beta": 0.4}]',
        ),
    },
}


# The most inference servers a run adds by their measured load (--inference_servers unset:
# herd/backends/inference_servers.py): on an H100 with 16 cores one server at 80-86 % of a
# core served 16 actors x 8 envs (issue 27), two at 0.45 on the H200 box.
MAX_INFERENCE_SERVERS = 4


def machine_profile(kind: str, device: str) -> dict[str, Any]:
    """MACHINE_PROFILES' defaults for this kind of environment on the learner device that
    --device gives here."""
    return MACHINE_PROFILES.get(kind, {}).get(learner_device(device).type, {})
