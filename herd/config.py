"""Every option of herd as typed dataclasses; `validate()` (herd/validation.py) checks them.

The seed's flags keep their names and meanings (see `seed-reference.md`). Options are
grouped in sections for readability (`cfg.train.lr`, `cfg.env.skipped_frames`), but every
field name is unique across sections, so the command line, saved configs and
`multi_train.py` overrides all use one flat namespace (`{"lr": 1e-3}`).

A field whose default is `None` and which appears in herd/profiles.py takes its default
from the algorithm, the machine and the kind of environment (Atari frames, a vector
observation task...): the seed's Atari-minded defaults do not fit CartPole. The command
line still overrides them.
"""
from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass, field
from typing import Any, Optional

from herd.algos import ALGORITHMS
from herd.backends import BACKEND_CHOICES, SERVED_INFERENCE
from herd.devices import bf16_choice, fast_bf16, learner_device
from herd.envs.actor_envs import ENV_BACKENDS
from herd.envs.wrappers import REWARD_CLIPPING_METHODS
from herd.learner.distributed import torchrun_world_size
from herd.errors import ConfigError
from herd.inputs import FromFile, check_option_value, excerpt
from herd.models import NETWORKS
from herd.placement import refuse_placement, split_placement
from herd.profiles import (ALGORITHM_PROFILES, COMPILE_FROM_STEPS, DEFAULT_ALGORITHM, FALLBACKS, MACHINE_ALGORITHMS,
                           MACHINE_PROFILES, PROFILES, game_profile, machine_algorithm,
                           machine_profile, samples_synchronously, slots_for_bounded_lag)
from herd.replay.spec import ReplaySpec, batch_shares, parse_replay_parameters, passes_per_batch
from herd.replay.writer import DISCARDING_STRATEGIES
from herd.validation import parse_eval_interval, transition_items, validate

__all__ = ["ALGORITHM_PROFILES", "Config", "ConfigError", "MACHINE_PROFILES", "PROFILES", "ReplaySpec", "apply_profile", "batch_shares",
           "parse_eval_interval", "parse_replay_parameters", "resolve", "validate"]


def opt(default: Any, help: str, choices: tuple | None = None):
    """A dataclass field carrying its help text (shown by `--help`) and allowed values."""
    return field(default=default, metadata={"help": help, "choices": choices})


OP_MODES = ("train", "train_w_load", "test")


@dataclass
class GeneralConfig:
    op_mode: str = opt("train", "train, test, or train_w_load (continue from a checkpoint)", OP_MODES)
    load_model_url: Optional[str] = opt(None, "the saved run folder or checkpoint file to load")
    load_optimizer_save: bool = opt(True, "restore optimizer and LR-scheduler state on train_w_load")
    save_model_period: int = opt(1000, "save a checkpoint every N learner updates")
    save_model_seconds: Optional[float] = opt(None, "also save a checkpoint once this many seconds have passed "
                                                    "since the last one (unset: by updates only)")
    debug: bool = opt(False, "debug mode: verbose logging")
    seed: Optional[int] = opt(None, "random seed (random when unset; the chosen seed is saved with the run)")
    reproducible: bool = opt(False, "deterministic mode: seeded everything and deterministic torch kernels")
    results_dir: str = opt("results", "folder that holds one sub-folder per run")
    save_replay: bool = opt(True, "save the replays' contents (LZ4-packed) with every checkpoint; turn off for very large buffers")
    device: str = opt("auto", "learner device: auto (cuda when a GPU is present), cpu or cuda", ("cpu", "auto", "cuda"))
    algorithm: Optional[str] = opt(None, "the algorithm (unset: by the learner device, herd/profiles.py MACHINE_ALGORITHMS; a run that names an option only IMPALA has, such as a replay mix or LASER's mask, runs impala): impala (V-trace actor-critic with CLEAR and LASER), apex (Ape-X: prioritized replay, n-step double dueling DQN; its own defaults, see README), impact (IMPACT: a target network, a clipped surrogate and a circular buffer that trains on each batch several times; docs/impact.md) or appo (PPO's epochs and minibatches over each stored batch with a clipped surrogate on V-trace targets; docs/appo.md)", tuple(ALGORITHMS))
    # -- run names --
    name: Optional[str] = opt(None, "a name for the run: its folder is <results_dir>/<name>_<env>_<algorithm>_<date-time>")
    tag: Optional[str] = opt(None, "labels for the run, comma-separated (kept in config.json; the folder name carries them after the name; herd plot ignores both when grouping)")
    # -- end run names
    actor_inference: str = opt("auto", "who chooses the actors' actions: local (each actor runs the model on its CPU), server (batched inference servers on --device for all actors), in_actor (each actor runs the servers' batched path on --device in its own process: no server process and no round trip; with few actors of many games and --env_threads, Sebulba's shape: docs/inference.md), auto (server when the device is cuda)", ("auto", "local", "server", "in_actor"))


@dataclass
class TrainingConfig:
    lr: Optional[float] = opt(None, "learning rate")
    batch_size: Optional[int] = opt(None, "trajectories per learner batch")
    r_f_steps: Optional[int] = opt(None, "rollout fragment length, the unroll length T")
    gradient_clip_by_norm_threshold: Optional[float] = opt(None, "global gradient-norm clip; 0 disables (unset: 40, APPO 0.5: its gradients of normalised advantages are clipped as PPO's are)")
    gamma: float = opt(0.99, "discount factor")
    optimizer: Optional[str] = opt(None, "rmsprop or adam", ("rmsprop", "adam"))
    rmsprop_eps: Optional[float] = opt(None, "RMSprop epsilon, added to the root of the squared-gradient average (herd's losses are means over the batch, and the seed's 0.01 would swamp their small gradients on Atari, see README)")
    lr_scheduler_steps: Optional[int] = opt(None, "polynomial (linear) LR decay horizon in learner updates (unset: the whole run)")
    lr_end_value: float = opt(0.00001, "learning rate at the end of the decay")
    environment_max_steps: Optional[int] = opt(None, "stop after this many environment (agent) steps in total")
    learner_thread_count: Optional[int] = opt(None, "torch threads of the learner (unset on Atari: one per CPU core in fp32 or with synchronous sampling, one per two cores in bf16; one on a GPU)")
    max_bad_updates: int = opt(10, "non-finite losses in a row after which the run stops (each one skips its update)")
    max_policy_lag: Optional[int] = opt(None, "drop fresh rollouts made by a policy more than N updates older than the learner's (default: no bound; train.csv logs the lag)")
    learner_compile: Optional[bool] = opt(None, "compile the learner's forward and backward with torch.compile (the first update then takes 20-40 s longer; unset: tried for Atari IMPALA, IMPACT and APPO runs of 1M steps or more, where a CPU learner keeps it only if its start-up timing finds it faster, and off otherwise)")
    learner_capture: Optional[bool] = opt(None, "capture the whole learner update (forward, losses, backward, clipping, optimizer) as one CUDA graph on a GPU learner, replayed every update; a capture that fails falls back to eager updates, with a log line (unset: on for a CUDA learner whose loss allows it, one learner, not compiled)")
    learner_precision: Optional[str] = opt(None, "learner arithmetic: fp32, bf16 (autocast), or auto (on a GPU, bf16 where it has bf16; on a CPU with bf16 units (AMX, AVX512-BF16), the faster of the two for this network and batch, timed at start-up or cached for this machine; else fp32)", ("auto", "fp32", "bf16"))
    learner_layout: str = opt("auto", "a CPU learner's convolution activations: channels_last, nchw, or auto (on a CPU learner, the faster of the two for this network and batch as timed at start-up, or as cached for this machine in ~/.cache/herd; channels-last on a GPU)", ("auto", "channels_last", "nchw"))
    replay_ratio: Optional[float] = opt(None, "without a queue replay: items the learner samples per item added (trajectories, or transitions for Ape-X), held both ways (actors wait while the learner lags); unset: 1")
    n_step: int = opt(3, "Ape-X: steps of the n-step return (the last steps of a trajectory bootstrap from its final observation with fewer)")
    target_update_period: Optional[int] = opt(None, "Ape-X, IMPACT and APPO: learner updates between syncs (hard copies) of the target network (APPO: 1, the learner as each stored batch arrives, PPO's old policy)")
    # --- sample reuse (APPO) ---
    passes_per_batch: Optional[int] = opt(None, "APPO: passes (PPO's epochs) over each stored batch (unset: 4 for APPO; 1, the only value other algorithms take)")
    minibatches_per_pass: Optional[int] = opt(None, "APPO: minibatches per pass, each batch_size / N shuffled trajectories and one gradient step (unset: 4 for APPO; 1 otherwise)")
    # --- end sample reuse ---
    apex_epsilon: float = opt(0.4, "Ape-X: actor i of N explores with epsilon^(1 + apex_alpha * i / (N - 1))")
    apex_alpha: float = opt(7.0, "Ape-X: the exponent spread of the actors' epsilons")
    # --- learning-rate schedule ---
    lr_decay_power: float = opt(1.0, "power of the polynomial LR decay from lr to lr_end_value over lr_scheduler_steps: 1 linear (herd's default), 2 the seed's (faster at first, flatter at the end)")
    # --- end learning-rate schedule ---


@dataclass
class EnvConfig:
    env: str = opt("AtlantisNoFrameskip-v4", "environment id: any gymnasium id; *NoFrameskip-v4 for ALE Atari")
    clip_rewards: Optional[bool] = opt(None, "clip rewards")
    reward_clipping_method: str = opt("abs_one_sign", "how rewards are clipped", REWARD_CLIPPING_METHODS)
    skipped_frames: int = opt(4, "Atari action repeat with max-pool over the last two frames")
    frames_stacked: int = opt(4, "Atari frame stack")
    noop_threshold: int = opt(30, "Atari: up to N random no-ops at reset")
    grayscaling_frames: bool = opt(True, "Atari: grayscale frames")
    episodic_life: bool = opt(True, "Atari: a lost life ends the training episode (scores count all lives)")
    frame_scale_resolution: tuple = opt((84, 84), "Atari: resize frames to height,width")
    max_episode_steps: Optional[int] = opt(None, "truncate episodes after N agent steps (default: the env's own limit)")
    actions_count: Optional[int] = opt(None, "the seed's: number of actions, checked against the environment (unset: taken from it)")
    observation_shape: Optional[tuple] = opt(None, "the seed's: observation shape after preprocessing (e.g. 4,84,84), checked against the environment (unset: taken from it)")
    # -- memory tasks (LSTM) --
    hide_velocity: bool = opt(False, "remove the velocity components from a classic-control observation (CartPole: cart and pole velocities), making it a memory task; refused for envs whose velocities herd does not know (herd/envs/masking.py)")


@dataclass
class ParallelConfig:
    worker_count: Optional[int] = opt(None, "actor processes (default: one per CPU core)")
    envs_per_worker: Optional[int] = opt(None, "environments per actor, stepped together")
    multiprocessing_backend: str = opt("python_native", "python_native (actor processes on this machine, trajectories in shared memory) or ray (actors as Ray actors, on this machine or across a Ray cluster's machines; needs pip install -e '.[ray]')", BACKEND_CHOICES)
    shared_queue_size: Optional[int] = opt(None, "trajectory slots per actor in shared memory, bounding how far actors run ahead")
    env_backend: str = opt("auto", "how actors step environments: gymnasium (per-process, any env), ale_vector (ale-py's C++ vector env, Atari), numpy (gymnasium's CartPole batched in numpy: the same task, one array operation per step), auto (ale_vector for Atari, numpy for CartPole-v0/v1, else gymnasium)", ("auto", *ENV_BACKENDS))
    env_threads: int = opt(1, "ale_vector: threads stepping each actor's environments")
    env_batch_size: int = opt(0, "ale_vector: environments per batch; 0 = all (synchronous), fewer = asynchronous (envs step while the policy acts on the previous batch; refused with other backends)")
    actor_timeout: float = opt(60.0, "seconds without a rollout after which an actor counts as hung and is restarted (its first rollout may take up to 60 s: start-up)")
    max_actor_restarts: int = opt(20, "actor restarts allowed in one run before it stops with an error")
    learner_count: Optional[int] = opt(None, "data-parallel learner processes (torch.distributed), each with its share of the actors and of every batch, gradients averaged every update (default 1; under torchrun: WORLD_SIZE)")
    learner_timeout: float = opt(600.0, "seconds a learner waits for the others in one update before the run stops as failed (a learner process that dies is noticed at once)")
    # The Ray backend's options (herd/backends/ray_backend.py), read by --multiprocessing_backend=ray only.
    ray_address: str = opt("local", "Ray backend: where the actors run. local: a private Ray started on this machine (loopback only, no dashboard, token auth, shut down at the end); auto: the cluster started on this machine with `ray start --head`; host:port: the head of a Ray cluster (its GCS port, 6379 unless changed)")
    actor_cpus: float = opt(1.0, "Ray backend: CPUs each actor reserves on its node (below 1: several actors share a core; above 1: a whole number); actors spread over the nodes that have room")
    replay_server: bool = opt(False, "Ray backend, Ape-X: keep the replay in its own Ray actor (a replay server) instead of in the learner process: actors' rollouts go to it without passing through the learner, which only receives sampled batches and sends priorities back; checkpoints still hold the replay")
    ray_compress_obs: bool = opt(False, "Ray backend: actors LZ4-compress observations before they leave their node, the learner (or replay server) decompresses: on Pong 12x fewer bytes on the network per step at no measured cost in actor frames/s; pays where the learner's network link limits throughput (docs/netns-cluster.md)")
    replay_server_node: str = opt("learner", "Ray backend, --replay_server: the node it runs on. learner: the learner's node (it reserves no Ray CPU there, as the learner does not); or a node id (hex, as `ray list nodes` and summary.json show): it then reserves 1 CPU there, which no actor gets")
    # --- the inference servers (herd/inference, docs/inference.md) ---
    inference_servers: Optional[int] = opt(None, "with --actor_inference=server: batched inference servers on --device, actor i served by server i mod N; unset: from their measured load: one at first, and another beside any server busier than 0.6 of a core over 5 s while the machine has a core idle, which takes half of its actors, up to 4 (docs/inference.md)")
    inference_batch_wait_us: float = opt(0.0, "inference server: after a first request, wait up to this many microseconds for a fuller batch (0: answer at once)")
    inference_min_clients: int = opt(0, "inference server: stop waiting (--inference_batch_wait_us) once this many of its actors have asked (0: all of them)")
    inference_doorbell: str = opt("semaphore", "inference server: how a request wakes the server and an answer its actor. semaphore: each side sleeps on a POSIX semaphore; spin: each side polls the shared header, yielding its core between polls (no wake-up latency, at the cost of the waiting processes' cores: for a machine with idle cores)", ("semaphore", "spin"))
    inference_weights_interval: int = opt(1, "inference server: take published weights once they are this many learner updates newer (1: every update)")
    inference_precision: str = opt("auto", "inference server arithmetic: fp32, bf16 (autocast), or auto (bf16 on a GPU with bf16 units, else fp32)", ("auto", "fp32", "bf16"))
    inference_cuda_graphs: Optional[bool] = opt(None, "inference server on CUDA: replay CUDA graphs captured for padded batch sizes (8, 16, ... rows) instead of launching every kernel (not with an LSTM core); True on a CPU is refused. unset: on a GPU, each size's graph is kept where replaying it measured faster than the eager pass at the server's start (the log says which); True: every size; False: none")
    inference_records: str = opt("auto", "inference server: it writes the observations it acts on and its actions, logits and values into the trajectories itself, and the actors write only rewards, dones and each rollout's last observation (herd/inference/records.py): on a GPU each frame then crosses to the GPU once (the learner copies the rest device to device); on a CPU the server writes into the actors' slots. on, off, or auto (on where the servers run on the learner's GPU)", ("auto", "on", "off"))
    synchronous_sampling: Optional[bool] = opt(None, "local backend: an actor starts its next rollout only after the learner has trained on its last one and published the weights that update made (PPO's synchronous sampling, Sample Factory's async_rl=False): the policy lag stays near 0 at the cost of actors idle during updates; one slot per actor (--shared_queue_size=1, its default then), and a batch's fresh trajectories must fit in the actors' slots (unset: on for APPO on Atari with the local backend, one learner and one slot's worth of actors (no --env_batch_size; a double-buffered actor's halves share its slot), where every rollout is then trained by the weights that acted in it, as PPO's; off otherwise)")
    actor_double_buffer: Optional[bool] = opt(None, "with an inference server (or its path in each actor: --actor_inference=in_actor): each actor keeps two half-batches of its environments in flight, stepping one half while the server acts on the other (Sample Factory's double buffering; with one slot per actor the halves end each rollout together); needs --envs_per_worker >= 2 and --env_batch_size=0 (unset: on where the actors are served by a server on a GPU and those hold, off otherwise)")
    # --- end inference servers ---


@dataclass
class ReplayConfig:
    replay_parameters: Optional[str] = opt(None, "the replays as a JSON list of {type, capacity, sample_ratio, ...}")
    training_fill_in_factor: float = opt(0.2, "a replay must be this full (fraction of capacity) before training starts")
    replay_writer_queue_size: int = opt(4, "rollouts waiting to be written into the replays before the discarding strategy applies")
    discarding_strategy: str = opt("wait", "on a full writer queue: wait (discard nothing; actors back off), keep_latest, keep_oldest or alternating", DISCARDING_STRATEGIES)
    use_replay_compression: Optional[bool] = opt(None, "store replayed observations LZ4-compressed (on Atari 12x less memory per stored trajectory and no slower, see benchmarks/replay_sampling.py)")
    lz4_compression_level: int = opt(0, "LZ4 compression level")
    caching: Optional[bool] = opt(None, "prepare batches ahead in background threads (on vector tasks sampling is cheap and the extra policy lag costs more)")
    caching_threads: int = opt(1, "threads preparing batches")
    cache_sample_size: int = opt(1, "batches prepared per round")
    cache_output_buffer_size: int = opt(3, "prepared batches kept ready (with --replay_server: sample requests the learner keeps in flight to the server)")


@dataclass
class StatsConfig:
    avg_buff_size: int = opt(100, "episodes in the moving-average score")
    verbose_worker_out_int: int = opt(50, "with --worker_verbose, each actor prints a progress line every N rollouts")
    verbose_learner_out_int: int = opt(50, "learner-side log interval: a train.csv row and TensorBoard scalars every N updates")
    basic_verbose: bool = opt(True, "print a live progress line")
    worker_verbose: bool = opt(False, "print per-actor progress (rollouts, steps, recent score) on stderr")
    background_save: bool = opt(False, "write the metric files (episodes.csv, train.csv) from a background thread instead of the learner's")
    tensorboard: bool = opt(True, "write TensorBoard scalars into the run folder")
    hardware_interval: float = opt(5.0, "seconds between hardware figures (CPU and memory per process, replay memory, NVIDIA GPUs) in hardware.csv and TensorBoard; 0 turns them off")
    wandb_project: Optional[str] = opt(None, "also log the training metrics and the config to this Weights & Biases project (needs pip install -e '.[wandb]'; WANDB_MODE=offline keeps it in RUN/wandb/ without a network); unset: no wandb")


@dataclass
class TestConfig:
    test_episode_count: int = opt(1000, "episodes to play in test mode")
    render: bool = opt(True, "render during test mode")
    eval_interval: Optional[str] = opt(None, "evaluate during training every N updates (\"500\") or N seconds (\"60s\") in a worker process, with the test wrappers; unset: no evaluation")
    eval_episodes: int = opt(10, "games per evaluation")
    eval_greedy: bool = opt(False, "evaluations play the most probable action instead of sampling")
    eval_video_every: int = opt(5, "a short video (eval_videos/ and TensorBoard) every Kth evaluation; 0: never")
    test_greedy: bool = opt(False, "test mode plays the policy's most probable action instead of sampling from it (the policy herd trained is the sampled one; see README)")
    apex_test_epsilon: float = opt(0.0, "Ape-X: epsilon of the epsilon-greedy policy in test mode (0: greedy)")


@dataclass
class NetworkConfig:
    network: str = opt("auto", "auto (mlp for vectors, nature_cnn for frames, minatar_cnn for frames under 36x36), mlp, nature_cnn, resnet, minatar_cnn, or constant (one learnt policy and value for every observation: no network to compute)", NETWORKS)
    feature_out_layer_size: Optional[int] = opt(None, "size of the per-step feature vector")
    use_additional_scaling_FC_layer: bool = opt(True, "a separate linear layer produces the feature vector")
    hidden_sizes: tuple = opt((64, 64), "MLP hidden layer sizes")
    # -- LSTM core --
    use_lstm: bool = opt(False, "an LSTM core between the torso (any network) and the policy/value heads; actors carry its state across trajectories, the learner unrolls it over T with resets at episode ends (IMPALA only)")
    lstm_size: Optional[int] = opt(None, "hidden units of the LSTM core (--use_lstm; default 64 on vector tasks, the MLP's width, 256 on frames)")


@dataclass
class LossConfig:
    policy_gradient_loss_weight: float = opt(1.0, "weight of the policy-gradient loss")
    value_loss_weight: float = opt(0.5, "weight of the value loss")
    entropy_loss_weight: Optional[float] = opt(None, "weight of the entropy bonus (unset: 0.01; IMPALA and IMPACT on Atari 0.001, IMPALA on Pong 0.0003)")
    entropy_decay: Optional[bool] = opt(None, "IMPALA: the entropy bonus decays with the learning rate, --entropy_loss_weight x the rate now / the starting rate, so a run explores early and sharpens late (unset: off)")
    c_const: float = opt(1.0, "V-trace c-bar")
    vtrace_lambda: Optional[float] = opt(None, "V-trace's lambda, c_t = lambda min(c-bar, rho_t) (GAE's lambda on on-policy data; unset: 1, the IMPALA paper's; 0.95 for APPO)")
    rho_const: float = opt(1.0, "V-trace rho-bar (and policy-gradient rho-bar)")
    use_policy_cloning_loss: Optional[bool] = opt(None, "CLEAR policy cloning on replayed data (default: on when a replay other than the queue is used)")
    use_value_cloning_loss: Optional[bool] = opt(None, "CLEAR value cloning on replayed data (default: as policy cloning)")
    policy_cloning_loss_weight: float = opt(0.05, "weight of the policy cloning loss")
    value_cloning_loss_weight: float = opt(0.005, "weight of the value cloning loss")
    use_kl_mask: bool = opt(False, "LASER: mask transitions whose KL(target||behaviour) exceeds the threshold")
    kl_div_threshold: float = opt(0.3, "LASER KL threshold")
    # --- IMPACT ---
    clip_param: Optional[float] = opt(None, "IMPACT and APPO: epsilon of the clipped surrogate, which keeps the learner's policy within 1 +- epsilon of the target network's (unset: 0.4 IMPACT, 0.1 APPO)")
    importance_weight_clip: float = opt(2.0, "IMPACT: truncation (rho-bar) of the target-to-behaviour importance weights in the surrogate")
    use_kl_loss: bool = opt(False, "IMPACT: add a KL(target || learner) penalty with an adaptive coefficient")
    kl_coeff: float = opt(1.0, "IMPACT: the KL penalty's initial coefficient (x1.5 when the KL exceeds 2 x kl_target, x0.5 below half of it)")
    kl_target: float = opt(0.01, "IMPACT: the KL the adaptive coefficient aims at")
    # --- end IMPACT ---
    # --- APPO ---
    normalize_advantages: Optional[bool] = opt(None, "APPO: normalise each stored batch's advantages to mean 0 and std 1 (unset: on for APPO)")
    value_clip: Optional[float] = opt(None, "APPO: PPO's value clipping, the value moves at most this far from the target network's per update (0: off, the unset default)")
    normalize_returns: Optional[bool] = opt(None, "APPO: the value head learns returns divided by their running root-mean-square (rewards scaled for learning, scores raw; unset: off)")
    # --- end APPO ---


# -- continuous control ------------------------------------------------------
@dataclass
class ContinuousConfig:
    normalize_observations: Optional[bool] = opt(None, "normalise observations by a running mean and std: per feature for vector observations, per pixel for Atari frames (nature_cnn, resnet); updated by the learner from fresh rollouts, carried with the weights, saved in checkpoints (default: on for continuous-action tasks and for Atari frames (not Ape-X), with one learner; off otherwise)")
    reward_scale: Optional[float] = opt(None, "multiply a vector task's rewards by this for learning (scores stay raw; default: 0.1 for IMPALA on vector tasks, discrete or continuous; 1 for Ape-X)")
    initial_log_std: float = opt(-1.0, "continuous actions: initial log standard deviation of the Gaussian policy, in the [-1, 1] action space the Box bounds are rescaled to")
# -- end continuous control


SECTIONS = {
    "general": GeneralConfig, "train": TrainingConfig, "env": EnvConfig,
    "parallel": ParallelConfig, "replay": ReplayConfig, "stats": StatsConfig,
    "test": TestConfig, "network": NetworkConfig, "loss": LossConfig,
    "continuous": ContinuousConfig,
}

@dataclass
class Config:
    general: GeneralConfig = field(default_factory=GeneralConfig)
    train: TrainingConfig = field(default_factory=TrainingConfig)
    env: EnvConfig = field(default_factory=EnvConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    replay: ReplayConfig = field(default_factory=ReplayConfig)
    stats: StatsConfig = field(default_factory=StatsConfig)
    test: TestConfig = field(default_factory=TestConfig)
    network: NetworkConfig = field(default_factory=NetworkConfig)
    loss: LossConfig = field(default_factory=LossConfig)
    continuous: ContinuousConfig = field(default_factory=ContinuousConfig)

    def to_flat(self) -> dict[str, Any]:
        """{field name: value} over all sections; tuples become lists (JSON)."""
        flat = {}
        for section in SECTIONS:
            for f in dataclasses.fields(getattr(self, section)):
                value = getattr(getattr(self, section), f.name)
                flat[f.name] = list(value) if isinstance(value, tuple) else value
        return flat

    @classmethod
    def from_flat(cls, values: dict[str, Any]) -> "Config":
        cfg = cls()
        for name, value in values.items():
            section = FIELD_SECTION.get(name)
            if section is None:
                raise ConfigError(f"unknown option '{excerpt(name)}'")
            setattr(getattr(cfg, section), name, coerce(name, value))
        return cfg

    @property
    def replays(self) -> list["ReplaySpec"]:
        return parse_replay_parameters(self.replay.replay_parameters)

    def validate(self) -> None:
        validate(self)


FIELD_SECTION: dict[str, str] = {
    f.name: section for section, cls in SECTIONS.items() for f in dataclasses.fields(cls)
}
FIELD_INFO: dict[str, dataclasses.Field] = {
    f.name: f for cls in SECTIONS.values() for f in dataclasses.fields(cls)
}


def parse_bool(text: Any) -> bool:
    if isinstance(text, bool):
        return text
    lowered = str(text).strip().lower()
    if lowered in ("true", "1", "yes"):
        return True
    if lowered in ("false", "0", "no"):
        return False
    raise ConfigError(f"'{excerpt(text)}' is not a boolean: use True/False/true/false/1/0")


def parse_int_tuple(text: Any) -> tuple:
    if isinstance(text, (list, tuple)):
        return tuple(int(v) for v in text)
    try:
        # "84,84", "84x84", and the seed's Python-style "(4, 84, 84)" or "[4, 84, 84]"
        cleaned = str(text).strip().strip("()[]").replace("x", ",")
        return tuple(int(v) for v in cleaned.split(",") if v.strip())
    except ValueError:
        raise ConfigError(f"'{excerpt(text)}' is not a comma-separated list of integers (e.g. 84,84)") from None


def base_type(name: str):
    """The annotated type of a field with Optional[...] removed."""
    annotation = FIELD_INFO[name].type
    text = annotation if isinstance(annotation, str) else getattr(annotation, "__name__", str(annotation))
    for candidate, kind in (("bool", bool), ("int", int), ("float", float), ("tuple", tuple), ("str", str)):
        if candidate in text:
            return kind
    return str


def coerce(name: str, value: Any) -> Any:
    """Turns a command-line string or JSON value into the field's type, with a clear error."""
    check_option_value(name, value, base_type(name) is tuple)     # before anything reads it
    if value is None or (isinstance(value, str) and value.strip().lower() in ("none", "auto", "")
                         and FIELD_INFO[name].default is None):
        return None
    kind = base_type(name)
    try:
        if kind is bool:
            result = parse_bool(value)
        elif kind is tuple:
            result = parse_int_tuple(value)
        elif kind is int:
            as_float = float(value)
            if not as_float.is_integer():
                raise ValueError
            result = int(as_float)
        elif kind is float:
            result = float(value)
        else:
            result = str(value)
    except ConfigError as err:
        raise ConfigError(f"--{name}: {err}") from None
    except (TypeError, ValueError):
        raise ConfigError(f"--{name}: '{excerpt(value)}' is not a valid {kind.__name__}") from None
    choices = FIELD_INFO[name].metadata.get("choices")
    if choices and result not in choices:
        raise ConfigError(f"--{name}: '{excerpt(result)}' is not one of {', '.join(choices)}")
    return result


def check_option(name: Any, value: Any) -> None:
    """One option of an experiment (herd multi, multi_train.py): a known name and a value
    of its type, or a one-line ConfigError quoting at most an excerpt."""
    if name not in FIELD_INFO:
        raise ConfigError(f"unknown option '{excerpt(name)}'")
    coerce(name, value)


# ---------------------------------------------------------------------------- validation

def apply_profile(cfg: Config, kind: str) -> Config:
    """Fills the fields left at None with the defaults of the algorithm on this game
    (GAME_PROFILES), of the algorithm (for this kind of environment, ALGORITHM_PROFILES),
    then of the environment's kind (PROFILES); an unset algorithm first, by the machine
    (MACHINE_ALGORITHMS)."""
    if cfg.general.algorithm is None:
        cfg.general.algorithm = machine_algorithm(kind, cfg.general.device, names_impala_options(cfg))
    algorithm_profile = ALGORITHM_PROFILES.get(cfg.general.algorithm, {}).get(kind, {})
    queue_unset = cfg.parallel.shared_queue_size is None
    # Unset and no profile of the algorithm names it (APPO's on Atari does: PPO's 1,024 steps).
    batch_unset = cfg.train.batch_size is None and "batch_size" not in algorithm_profile
    learners = cfg.parallel.learner_count or torchrun_world_size() or 1
    if cfg.continuous.normalize_observations is None and (learners > 1 or cfg.network.network in ("minatar_cnn",
                                                                                                   "constant")):
        # Each learner would gather statistics of its own; MinAtar's network has no
        # normaliser, and the constant policy reads no observation.
        cfg.continuous.normalize_observations = False
    for name, value in [*game_profile(cfg.general.algorithm, cfg.env.env).items(), *algorithm_profile.items(),
                        *machine_profile(kind, cfg.general.device).items(), *PROFILES[kind].items(),
                        *FALLBACKS.items()]:
        section = getattr(cfg, FIELD_SECTION[name])
        if getattr(section, name) is None:
            setattr(section, name, value)
    if cfg.parallel.worker_count is None:
        cfg.parallel.worker_count = max(1, os.cpu_count() or 1)
    if cfg.parallel.learner_count is None:
        cfg.parallel.learner_count = torchrun_world_size() or 1
    if cfg.parallel.actor_double_buffer is None:
        cfg.parallel.actor_double_buffer = double_buffers_by_default(cfg, kind)
    if cfg.parallel.synchronous_sampling is None:
        p = cfg.parallel
        needs_two_slots = 0 < p.env_batch_size < p.envs_per_worker    # a double-buffered actor can do with one
        p.synchronous_sampling = (samples_synchronously(cfg.general.algorithm, kind, p.multiprocessing_backend)
                                  and p.learner_count == 1 and not needs_two_slots)
    if batch_unset and cfg.parallel.synchronous_sampling and cfg.train.passes_per_batch * cfg.train.minibatches_per_pass > 1:
        # Reuse with synchronous sampling and no batch from a profile: a stored batch is one
        # rollout of every environment, as PPO's (docs/appo.md, Defaults).
        cfg.train.batch_size = cfg.parallel.worker_count * cfg.parallel.envs_per_worker
    if queue_unset and cfg.parallel.synchronous_sampling:
        cfg.parallel.shared_queue_size = 1      # an actor with a second slot would go on filling it
    elif queue_unset and cfg.train.passes_per_batch * cfg.train.minibatches_per_pass > 1:
        # Reuse trains on a policy's data many times: keep what waits for the learner near one batch.
        p = cfg.parallel
        two_needed = 0 < p.env_batch_size < p.envs_per_worker or p.actor_double_buffer
        p.shared_queue_size = slots_for_bounded_lag(cfg.train.batch_size, p.worker_count, p.envs_per_worker,
                                                    fewest=2 if two_needed else 1)
    if cfg.train.learner_precision == "auto":
        cfg.train.learner_precision = "bf16" if fast_bf16(learner_device(cfg.general.device)) else "fp32"
    on_gpu = learner_device(cfg.general.device).type == "cuda"
    if cfg.train.learner_thread_count is None:
        # Measured on 2 cores (benchmarks/throughput.py): a bf16 learner is fast enough that
        # a second thread gains less than it takes from the actors; an fp32 one needs them all.
        # With synchronous sampling the actors wait while the learner trains, so it takes
        # every core (docs/appo.md, "The policy lag").
        # A GPU learner's host work is launching kernels: on an H100 with 16 cores, 8
        # threads took 4 cores for the throughput of 1 (shared/gpu/README.md).
        cores = max(1, os.cpu_count() or 1)
        shares_cores = cfg.train.learner_precision == "bf16" and not cfg.parallel.synchronous_sampling
        cfg.train.learner_thread_count = 1 if on_gpu else max(1, cores // 2) if shares_cores else cores
    if cfg.train.learner_compile is None:
        # On a CPU compiling measured 1.0-1.1x faster for long Atari runs; on an H100 it was
        # slower than eager (13.2 against 9.4 ms at batch 32), where the captured graph wins.
        cfg.train.learner_compile = (not on_gpu and kind == "atari"
                                     and cfg.general.algorithm in ("impala", "impact", "appo")
                                     and cfg.train.environment_max_steps >= COMPILE_FROM_STEPS)
    if cfg.train.learner_capture is None:
        cfg.train.learner_capture = (on_gpu and ALGORITHMS[cfg.general.algorithm].capturable_loss
                                     and cfg.parallel.learner_count == 1 and not cfg.train.learner_compile)
    specs = cfg.replays
    off_policy = any(not spec.on_policy for spec in specs)
    if cfg.train.lr_scheduler_steps is None:
        # Decay over the whole run: updates = fresh steps / fresh steps per update.
        shares = batch_shares(specs, cfg.train.batch_size)
        fresh = sum(s for spec, s in zip(specs, shares) if spec.on_policy) or cfg.train.batch_size / (
            cfg.train.replay_ratio or 1.0)
        # A transition replay's items are steps; every other replay's are trajectories.
        per_update = max(1, round(fresh * (1 if transition_items(specs) else cfg.train.r_f_steps)
                                  / passes_per_batch(specs)))     # a circular buffer trains each batch K times
        cfg.train.lr_scheduler_steps = max(1, math.ceil(cfg.train.environment_max_steps / per_update))
    if cfg.loss.use_policy_cloning_loss is None:
        cfg.loss.use_policy_cloning_loss = off_policy
    if cfg.loss.use_value_cloning_loss is None:
        cfg.loss.use_value_cloning_loss = off_policy
    return cfg


def double_buffers_by_default(cfg: Config, kind: str) -> bool:
    """--actor_double_buffer's default: on where a server on a GPU acts for the actors (the
    round trip to it is what the actors wait on: docs/inference.md) and each actor's
    environments split into two halves that step together. `kind`: the environment's
    profile kind (continuous-action runs act with their own models)."""
    p = cfg.parallel
    cuda = learner_device(cfg.general.device).type == "cuda"
    served = kind != "continuous" and (cfg.general.actor_inference in SERVED_INFERENCE or (
        cfg.general.actor_inference == "auto" and ALGORITHMS[cfg.general.algorithm].inference_server))
    return (cuda and served and p.multiprocessing_backend == "python_native" and p.envs_per_worker >= 2
            and p.env_batch_size == 0)


def names_impala_options(cfg: Config) -> bool:
    """The config names an option only IMPALA has: a replay other than the queue, LASER's
    mask, CLEAR's cloning terms or the entropy decay (APPO refuses them)."""
    lo = cfg.loss
    given = cfg.replay.replay_parameters
    other_replay = given is not None and any(spec.type != "queue" for spec in parse_replay_parameters(given))
    return bool(other_replay or lo.use_kl_mask or lo.use_policy_cloning_loss or lo.use_value_cloning_loss
                or lo.entropy_decay)


def machine_picks(cfg: Config, kind: str, given: set[str]) -> dict[str, Any]:
    """What herd picked for the hardware in this run's config, with the hardware: the
    options of machine_profile, the actor count, and where the kind's profile leaves them to
    the machine the learner's precision, threads and compiling; only those not given
    (command line, multi_train, a resumed checkpoint)."""
    flat, profile = cfg.to_flat(), PROFILES[kind]
    device = learner_device(cfg.general.device)
    names = [*machine_profile(kind, cfg.general.device), "worker_count"]     # one actor per core
    if kind in MACHINE_ALGORITHMS:
        names.insert(0, "algorithm")                # by the learner device (MACHINE_ALGORITHMS)
    if device.type == "cuda":
        names.append("actor_double_buffer")         # on where a GPU's server acts (double_buffers_by_default)
    if profile.get("learner_precision") == "auto":
        names.append("learner_precision")           # bf16 where the hardware has bf16 units
    if "learner_thread_count" not in profile:
        names.append("learner_thread_count")        # from the cores and the precision
    if cfg.train.passes_per_batch * cfg.train.minibatches_per_pass > 1:
        names.append("shared_queue_size")           # from the actors and envs: a bounded policy lag
        names.append("synchronous_sampling")        # from the backend, the learners and the actors' slots
    if kind == "atari":
        names.append("learner_compile")             # long Atari runs (apply_profile)
    if device.type == "cuda":
        names.append("learner_capture")             # one CUDA graph per update (apply_profile)
    bf16, why = bf16_choice(device)
    return {"hardware": {"device": device.type, "cpu_cores": os.cpu_count() or 1, "bf16_units": bf16,
                         "bf16_because": why},
            "options": {name: flat[name] for name in names if name not in given}}


def check_env_source(env: Any, source: str | None) -> None:
    """The one rule for custom environments read from files: a `pkg.module:EnvId` id makes
    herd import `pkg.module` (herd.envs.registry.import_env_module), which runs its code, so
    only the command line or the Python call of this invocation may name one. A
    checkpoint's saved config or an experiments file naming it is refused in one line,
    before anything is imported (docs/security.md). Given the same id again (--env, or
    env= in Python), it is the command line's, which wins the merge."""
    if source is None or not isinstance(env, str) or ":" not in env:
        return
    raise ConfigError(f"environment '{excerpt(env)}' comes from {source}, and herd imports a custom environment's "
                      f"module only when the command names it: add --env={excerpt(env)} (Python: env=...) if you "
                      "trust that module")


def resolve(command_line: dict[str, Any], overrides: dict[str, Any] | None = None,
            saved: dict[str, Any] | None = None, env_kind=None) -> Config:
    """Builds the run's config. Precedence, highest first: the command line, overrides
    from multi_train.py or an experiments file (herd.inputs.FromFile), the config saved in
    the checkpoint being resumed, the environment kind's profile, the defaults. Two rules
    for what files hand in: an env id that imports a module may come from the command line
    only (check_env_source), and so may where the run connects, writes or reports
    (herd.placement: a checkpoint's placement values are not applied, an experiments file
    naming one is refused).
    `env_kind(env_id) -> "atari" | "minatar" | "vector" | "continuous"`
    (herd.envs.registry.profile_kind)."""
    from_file = isinstance(overrides, FromFile)
    if from_file:
        refuse_placement(overrides, "the experiments file")
    layers = [("the checkpoint's saved config", split_placement(saved or {})[0]),
              ("the experiments file" if from_file else None, overrides or {}),
              (None, command_line)]
    merged: dict[str, Any] = {}
    env_from = None                       # the file the env id came from; None: this invocation's own
    for source, layer in layers:
        for name, value in layer.items():
            if name not in FIELD_SECTION:
                raise ConfigError(f"unknown option '{excerpt(name)}'")
            merged[name] = value
        env_from = source if "env" in layer else env_from
    check_env_source(merged.get("env"), env_from)
    cfg = Config.from_flat(merged)
    if env_kind is not None:
        apply_profile(cfg, env_kind(cfg.env.env))
    elif cfg.general.algorithm is None:
        cfg.general.algorithm = DEFAULT_ALGORITHM       # no kind of environment: no machine's pick
    return cfg
