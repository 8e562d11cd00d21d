"""The checks of a resolved config that span fields: one function, `validate(cfg)`, raising
ConfigError with one line. Apart from herd/config.py (which defines the options and
imports this module) so that both stay short; this module reads a config by its
attributes and never imports herd.config."""
from __future__ import annotations

import dataclasses
import math
import os
from typing import TYPE_CHECKING, Any

import torch

from herd.algos import ALGORITHMS
from herd.backends import SERVED_INFERENCE, check_backend
from herd.devices import learner_device
from herd.errors import ConfigError
from herd.inputs import excerpt
from herd.learner.distributed import torchrun_world_size
from herd.replay.spec import batch_shares

if TYPE_CHECKING:  # names for the annotations only: herd.config imports this module
    from herd.config import Config
    from herd.replay.spec import ReplaySpec


def parse_eval_interval(text: str) -> tuple[int | None, float | None]:
    """--eval_interval: "500" -> (500 updates, None); "60s" -> (None, 60.0 seconds)."""
    cleaned = str(text).strip().lower()
    try:
        value = float(cleaned[:-1] if cleaned.endswith("s") else cleaned)
    except ValueError:
        value = float("nan")
    seconds = cleaned.endswith("s")
    if not 0 < value < float("inf") or (not seconds and not value.is_integer()):
        raise ConfigError(f"--eval_interval must be a whole number of updates (500) or of seconds (60s), got '{excerpt(text)}'")
    return (None, value) if seconds else (int(value), None)



def transition_items(specs: list[ReplaySpec]) -> bool:
    """The replays sample transitions (Ape-X's prioritized replay), not trajectories."""
    return any(spec.type == "prioritized" for spec in specs)


def _positive(cfg: Config) -> dict[str, Any]:
    return {
        "batch_size": cfg.train.batch_size, "r_f_steps": cfg.train.r_f_steps,
        "worker_count": cfg.parallel.worker_count, "envs_per_worker": cfg.parallel.envs_per_worker,
        "environment_max_steps": cfg.train.environment_max_steps, "lr_scheduler_steps": cfg.train.lr_scheduler_steps,
        "save_model_period": cfg.general.save_model_period, "test_episode_count": cfg.test.test_episode_count,
        "feature_out_layer_size": cfg.network.feature_out_layer_size, "avg_buff_size": cfg.stats.avg_buff_size,
        "shared_queue_size": cfg.parallel.shared_queue_size, "learner_thread_count": cfg.train.learner_thread_count,
        "skipped_frames": cfg.env.skipped_frames, "frames_stacked": cfg.env.frames_stacked,
        "caching_threads": cfg.replay.caching_threads, "cache_output_buffer_size": cfg.replay.cache_output_buffer_size,
        "verbose_learner_out_int": cfg.stats.verbose_learner_out_int,
        "replay_writer_queue_size": cfg.replay.replay_writer_queue_size, "cache_sample_size": cfg.replay.cache_sample_size,
        "env_threads": cfg.parallel.env_threads, "verbose_worker_out_int": cfg.stats.verbose_worker_out_int,
        "learner_count": cfg.parallel.learner_count,
        "n_step": cfg.train.n_step,
        **({"target_update_period": cfg.train.target_update_period}
           if cfg.general.algorithm in ("apex", "impact") else {}),
    }


# A Ray node id: 28 bytes, written as hex (`ray list nodes`, summary.json's actor_nodes).
NODE_ID_HEX = 56
# Seeds go to numpy's legacy RNG (32-bit) and to every RNG herd uses; one range for all.
MAX_SEED = 2**32 - 1
FLOAT32_MAX = 3.4028234663852886e38
# The fewest seconds --actor_timeout may be: its clock starts when an actor is launched,
# and starting one (a spawned Python importing torch, then making its environments) takes
# about a second even on an idle machine, so a shorter timeout restarts healthy actors
# until --max_actor_restarts ends the run (measured: 0 s, 21 restarts, no step taken).
MIN_ACTOR_TIMEOUT = 2.0
# Each actor is a Python process with torch loaded (about 300 MB resident, several
# threads). Past 8 per core they only time-share the cores, and far past that the machine
# runs out of memory or threads mid-start; the bound is the smaller of the two.
ACTORS_PER_CORE = 8
ACTOR_MEMORY_BYTES = 300 * 2**20


def max_worker_count() -> int:
    import psutil
    by_cores = ACTORS_PER_CORE * max(1, os.cpu_count() or 1)
    by_memory = max(1, psutil.virtual_memory().total // ACTOR_MEMORY_BYTES)
    return int(min(by_cores, by_memory))


def check_finite(cfg: Config) -> None:
    """nan and inf pass every comparison-based check below (nan <= 0 is False)."""
    for section in dataclasses.fields(cfg):
        for f in dataclasses.fields(getattr(cfg, section.name)):
            value = getattr(getattr(cfg, section.name), f.name)
            if isinstance(value, float) and not math.isfinite(value):
                raise ConfigError(f"--{f.name} must be a finite number, got {value}")


def validate_general(cfg: Config) -> None:
    g, p = cfg.general, cfg.parallel
    if not str(g.results_dir).strip():
        raise ConfigError("--results_dir is empty: give the folder for run folders (default: results)")
    if g.seed is not None and not 0 <= g.seed <= MAX_SEED:
        raise ConfigError(f"--seed must be an integer from 0 to {MAX_SEED}, got {g.seed}")
    if p.actor_timeout < MIN_ACTOR_TIMEOUT:
        raise ConfigError(f"--actor_timeout must be >= {MIN_ACTOR_TIMEOUT:g} seconds (starting an actor takes "
                          f"seconds), got {p.actor_timeout:g}")
    if p.max_actor_restarts < 0:
        raise ConfigError(f"--max_actor_restarts must be >= 0, got {p.max_actor_restarts}")
    bound = max_worker_count()
    elsewhere = p.multiprocessing_backend == "ray" and p.ray_address != "local"   # actors on a cluster's nodes
    if p.worker_count is not None and p.worker_count > bound and not elsewhere:
        raise ConfigError(f"--worker_count={p.worker_count} is more actor processes than this machine can run "
                          f"(at most {bound}: {ACTORS_PER_CORE} per core, about "
                          f"{ACTOR_MEMORY_BYTES // 2**20} MB of memory each)")


def validate(cfg: Config) -> None:
    """Checks the rules that span fields, after the profile is applied. Raises ConfigError."""
    check_finite(cfg)
    for name, value in _positive(cfg).items():
        if value is None or value < 1:
            raise ConfigError(f"--{name} must be >= 1, got {value}")
    validate_general(cfg)
    t, lo = cfg.train, cfg.loss
    if not t.lr or t.lr <= 0:
        raise ConfigError(f"--lr must be > 0, got {t.lr}")
    seconds = cfg.general.save_model_seconds
    if seconds is not None and not 0 < seconds < float("inf"):
        raise ConfigError(f"--save_model_seconds must be a number of seconds > 0, got {seconds}")
    if t.lr > FLOAT32_MAX:   # the optimizers compute in float32: such an lr is infinite there
        raise ConfigError(f"--lr={t.lr:g} is beyond float32's range (the weights' type): use a learning rate < 1")
    if not t.lr_decay_power > 0:   # 0 would hold lr_end_value from the first update on
        raise ConfigError(f"--lr_decay_power must be > 0 (1 linear, 2 the seed's), got {t.lr_decay_power}")
    if t.rmsprop_eps is None or not t.rmsprop_eps > 0:
        raise ConfigError(f"--rmsprop_eps must be > 0, got {t.rmsprop_eps}")
    if not 0 <= t.gamma <= 1:
        raise ConfigError(f"--gamma must be in [0, 1], got {t.gamma}")
    if t.gradient_clip_by_norm_threshold < 0:
        raise ConfigError("--gradient_clip_by_norm_threshold must be >= 0 (0 disables clipping)")
    if not 0 <= cfg.replay.training_fill_in_factor <= 1:
        raise ConfigError(f"--training_fill_in_factor must be in [0, 1], got {cfg.replay.training_fill_in_factor}")
    if not cfg.stats.hardware_interval >= 0 or math.isinf(cfg.stats.hardware_interval):
        raise ConfigError(f"--hardware_interval must be a number of seconds >= 0 (0: off), got {cfg.stats.hardware_interval}")
    if cfg.test.eval_interval is not None:
        parse_eval_interval(cfg.test.eval_interval)
    if cfg.test.eval_episodes < 1 or cfg.test.eval_video_every < 0:
        raise ConfigError(f"--eval_episodes must be >= 1 and --eval_video_every >= 0, got {cfg.test.eval_episodes} "
                          f"and {cfg.test.eval_video_every}")
    if cfg.env.noop_threshold < 0:
        raise ConfigError(f"--noop_threshold must be >= 0, got {cfg.env.noop_threshold}")
    if len(cfg.env.frame_scale_resolution) != 2 or min(cfg.env.frame_scale_resolution) < 1:
        raise ConfigError(f"--frame_scale_resolution must be two positive integers height,width, got {cfg.env.frame_scale_resolution}")
    if lo.rho_const <= 0 or lo.c_const <= 0 or lo.kl_div_threshold < 0:
        raise ConfigError("--rho_const and --c_const must be > 0 and --kl_div_threshold >= 0")
    p = cfg.parallel
    if not 0 <= p.env_batch_size <= p.envs_per_worker:
        raise ConfigError(f"--env_batch_size must be between 0 (all, synchronous) and --envs_per_worker="
                          f"{p.envs_per_worker}, got {p.env_batch_size}")
    if 0 < p.env_batch_size < p.envs_per_worker and p.shared_queue_size < 2:
        # An environment that runs ahead opens the next trajectory slot while the current
        # one still fills: with one slot it would wait for itself.
        raise ConfigError(f"--env_batch_size={p.env_batch_size} (asynchronous environments) needs at least 2 "
                          f"trajectory slots per actor, got --shared_queue_size={p.shared_queue_size}")
    if t.max_policy_lag is not None and t.max_policy_lag < 0:
        raise ConfigError(f"--max_policy_lag must be >= 0 (updates), got {t.max_policy_lag}")
    if cfg.env.max_episode_steps is not None and cfg.env.max_episode_steps < 1:
        raise ConfigError(f"--max_episode_steps must be >= 1, got {cfg.env.max_episode_steps}")
    if cfg.general.device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("--device=cuda but no CUDA GPU is visible: use --device=cpu or auto")
    if t.learner_capture and learner_device(cfg.general.device).type != "cuda":
        raise ConfigError("--learner_capture=True captures the update as a CUDA graph: it needs a CUDA learner "
                          "(--device=cuda or auto on a GPU machine); give --learner_capture=False on a CPU")
    if cfg.general.op_mode in ("train_w_load", "test") and not cfg.general.load_model_url:
        raise ConfigError(f"--op_mode={cfg.general.op_mode} needs --load_model_url=<run folder or checkpoint file>")
    check_backend(p.multiprocessing_backend)
    if cfg.env.actions_count is not None and cfg.env.actions_count < 1:
        raise ConfigError(f"--actions_count must be >= 1, got {cfg.env.actions_count}")
    if cfg.env.observation_shape is not None and (not cfg.env.observation_shape or min(cfg.env.observation_shape) < 1):
        raise ConfigError(f"--observation_shape must be positive integers (e.g. 4,84,84), got {cfg.env.observation_shape}")
    validate_apex(cfg)
    validate_ray(cfg)
    validate_lstm(cfg)
    specs = cfg.replays
    algorithm = ALGORITHMS[cfg.general.algorithm]
    for spec in specs:
        if spec.type not in algorithm.replay_types:
            raise ConfigError(f"--replay_parameters: {algorithm.name} does not train from a '{spec.type}' replay "
                              f"(use {', '.join(algorithm.replay_types)})")
    shares = batch_shares(specs, t.batch_size)
    for spec, share in zip(specs, shares):
        if spec.sample_ratio > 0 and share == 0:
            raise ConfigError(f"--batch_size={t.batch_size} is too small: the {spec.type} replay's sample_ratio "
                              f"{spec.sample_ratio:g} gives it no trajectory per batch")
    items = t.r_f_steps if transition_items(specs) else 1      # a trajectory's items
    if not any(spec.on_policy for spec in specs) and t.batch_size > max(spec.capacity * items for spec in specs):
        raise ConfigError(f"--batch_size={t.batch_size} exceeds every replay's capacity")
    if t.replay_ratio is not None and any(spec.on_policy for spec in specs):
        raise ConfigError("--replay_ratio paces training without a queue replay; with a queue, each fresh "
                          "trajectory is used once: drop --replay_ratio or the queue")
    if cfg.general.actor_inference in SERVED_INFERENCE and not algorithm.inference_server:
        raise ConfigError(f"--actor_inference={cfg.general.actor_inference}: {algorithm.name} actors need their own "
                          "model (use --actor_inference=local)")
    validate_impact(cfg, specs, shares)
    validate_learners(cfg, specs)
    validate_reuse(cfg)
    validate_inference(cfg)
    validate_records(cfg, algorithm)
    validate_synchronous(cfg, specs, shares)


def validate_inference(cfg: Config) -> None:
    """The inference servers' options (docs/inference.md)."""
    p = cfg.parallel
    if p.inference_servers is not None and not 1 <= p.inference_servers <= p.worker_count:
        raise ConfigError(f"--inference_servers must be from 1 to --worker_count={p.worker_count} (each server "
                          f"serves at least one actor), got {p.inference_servers}")
    if not 0 <= p.inference_batch_wait_us <= 1e6:
        raise ConfigError(f"--inference_batch_wait_us must be from 0 to 1,000,000 (one second), got "
                          f"{p.inference_batch_wait_us:g}")
    if p.inference_min_clients < 0:
        raise ConfigError(f"--inference_min_clients must be >= 0 (0: all of a server's actors), got "
                          f"{p.inference_min_clients}")
    if p.inference_weights_interval < 1:
        raise ConfigError(f"--inference_weights_interval must be >= 1, got {p.inference_weights_interval}")
    if cfg.general.actor_inference == "in_actor":
        given = [name for name, set_ in (("--inference_servers", p.inference_servers is not None),
                                         ("--inference_doorbell", p.inference_doorbell != "semaphore"),
                                         ("--inference_batch_wait_us", p.inference_batch_wait_us != 0),
                                         ("--inference_min_clients", p.inference_min_clients != 0)) if set_]
        if given:
            raise ConfigError(f"--actor_inference=in_actor runs no server process, so {', '.join(given)} would do "
                              "nothing: drop it or use --actor_inference=server")
    cuda = learner_device(cfg.general.device).type == "cuda"
    if p.inference_cuda_graphs and not cuda:
        raise ConfigError("--inference_cuda_graphs captures CUDA graphs: it needs --device=cuda (or auto with a GPU)")
    if not p.actor_double_buffer:
        return
    serves = cfg.general.actor_inference in SERVED_INFERENCE or (cfg.general.actor_inference == "auto" and cuda)
    if not serves or p.multiprocessing_backend != "python_native":
        raise ConfigError("--actor_double_buffer overlaps stepping with an inference server's work: it needs "
                          "--actor_inference=server or in_actor (or auto on a GPU) and "
                          "--multiprocessing_backend=python_native")
    if p.envs_per_worker < 2 or p.env_batch_size != 0:
        raise ConfigError(f"--actor_double_buffer splits each actor's environments in two halves: it needs "
                          f"--envs_per_worker >= 2 (got {p.envs_per_worker}) and --env_batch_size=0 (got "
                          f"{p.env_batch_size})")


def validate_records(cfg: Config, algorithm) -> None:
    """--inference_records=on needs a server that acts for the algorithm on this machine."""
    p = cfg.parallel
    if p.inference_records != "on":
        return
    cuda = learner_device(cfg.general.device).type == "cuda"
    serves = cfg.general.actor_inference in SERVED_INFERENCE or (cfg.general.actor_inference == "auto" and cuda)
    if not serves or not algorithm.inference_server or p.multiprocessing_backend != "python_native":
        raise ConfigError("--inference_records=on: the inference server records the steps it acts on; it needs one "
                          "(--actor_inference=server or in_actor, or auto on a GPU, an algorithm whose actors it "
                          "serves, and --multiprocessing_backend=python_native)")


def validate_synchronous(cfg: Config, specs: list, shares: list) -> None:
    """--synchronous_sampling: the actors' slots are held until an update trained on them,
    so a batch's fresh trajectories must fit in them all at once."""
    p = cfg.parallel
    if not p.synchronous_sampling:
        return
    if p.multiprocessing_backend != "python_native":
        raise ConfigError("--synchronous_sampling holds the actors' slots until the learner has trained on them: "
                          "it needs --multiprocessing_backend=python_native")
    if p.shared_queue_size != 1:
        raise ConfigError(f"--synchronous_sampling keeps an actor's slot until its rollout is trained on: with "
                          f"--shared_queue_size={p.shared_queue_size} the actor would go on filling its other slots "
                          "(leave it unset, or 1)")
    fresh = sum(share for spec, share in zip(specs, shares) if spec.on_policy)
    held = p.worker_count * p.envs_per_worker
    if fresh == 0:
        raise ConfigError("--synchronous_sampling waits for updates on fresh rollouts: it needs a queue replay "
                          "in --replay_parameters")
    if fresh > held:
        raise ConfigError(f"--synchronous_sampling: a batch takes {fresh} fresh trajectories, more than the actors' "
                          f"slots hold at once ({held} = worker_count x envs_per_worker), so no "
                          "update could come")


def validate_impact(cfg: Config, specs: list, shares: list) -> None:
    """IMPACT's options and the circular buffer (checked whatever the algorithm where a
    value is bad anyway); what makes no sense together is refused in one line."""
    lo = cfg.loss
    if not 0 < lo.clip_param < 1:
        raise ConfigError(f"--clip_param must be in (0, 1) (the surrogate keeps the ratio within 1 +- it), "
                          f"got {lo.clip_param}")
    if not 0 < lo.importance_weight_clip < float("inf"):
        raise ConfigError(f"--importance_weight_clip must be a number > 0, got {lo.importance_weight_clip}")
    if not 0 <= lo.kl_coeff < float("inf") or not 0 < lo.kl_target < float("inf"):
        raise ConfigError(f"--kl_coeff must be >= 0 and --kl_target > 0, got {lo.kl_coeff} and {lo.kl_target}")
    for spec, share in zip(specs, shares):
        if spec.type != "circular":
            continue
        if len(specs) > 1:
            raise ConfigError("--replay_parameters: a circular buffer serves whole batches, so it is the only "
                              "replay (sample_ratio 1); mixing it with other replays makes no batch of its own")
        if spec.capacity * share < cfg.parallel.envs_per_worker:
            raise ConfigError(f"--replay_parameters: the circular buffer's {spec.capacity} batches of {share} "
                              f"trajectories hold less than one actor's rollout ({cfg.parallel.envs_per_worker} "
                              "trajectories, --envs_per_worker): raise its capacity (batches) or --batch_size")
    if cfg.general.algorithm not in ("impact", "appo"):
        if lo.use_kl_loss:
            raise ConfigError(f"--use_kl_loss is IMPACT's penalty (and APPO's): use --algorithm=impact or appo, "
                              f"not {cfg.general.algorithm}")
        return
    if lo.use_kl_mask or lo.use_policy_cloning_loss or lo.use_value_cloning_loss:
        raise ConfigError(f"--algorithm={cfg.general.algorithm} has no LASER mask or CLEAR cloning terms (its "
                          "surrogate is clipped against a target network instead): drop --use_kl_mask and the "
                          "cloning losses")


def validate_reuse(cfg: Config) -> None:
    """APPO's passes and minibatches (herd/learner/reuse.py) and the V-trace and value
    options that come with them; sizes are checked here, before anything is allocated."""
    t, lo = cfg.train, cfg.loss
    if not 0 <= lo.vtrace_lambda <= 1:
        raise ConfigError(f"--vtrace_lambda must be in [0, 1], got {lo.vtrace_lambda}")
    if not 0 <= lo.value_clip < float("inf"):
        raise ConfigError(f"--value_clip must be a number >= 0 (0: off), got {lo.value_clip}")
    for name, value in (("passes_per_batch", t.passes_per_batch), ("minibatches_per_pass", t.minibatches_per_pass)):
        if not 1 <= value <= 1000:
            raise ConfigError(f"--{name} must be from 1 to 1000, got {value}")
    if lo.entropy_decay and cfg.general.algorithm != "impala":
        raise ConfigError(f"--entropy_decay is IMPALA's (its bonus decayed with the learning rate), not "
                          f"{cfg.general.algorithm}'s: drop it")
    if cfg.general.algorithm != "appo":
        given = [name for name, on in (("passes_per_batch", t.passes_per_batch > 1),
                                       ("minibatches_per_pass", t.minibatches_per_pass > 1),
                                       ("normalize_advantages", lo.normalize_advantages),
                                       ("value_clip", lo.value_clip > 0),
                                       ("normalize_returns", lo.normalize_returns)) if on]
        if given:
            raise ConfigError(f"--{given[0]} is APPO's (passes of minibatches over each stored batch): use "
                              f"--algorithm=appo, not {cfg.general.algorithm}")
        return
    per_learner = t.batch_size // cfg.parallel.learner_count
    if per_learner % t.minibatches_per_pass:
        raise ConfigError(f"--batch_size={t.batch_size} gives each learner {per_learner} trajectories, which do not "
                          f"split into --minibatches_per_pass={t.minibatches_per_pass} equal minibatches: use a "
                          f"multiple of {t.minibatches_per_pass * cfg.parallel.learner_count}")


def validate_learners(cfg: Config, specs: list) -> None:
    """--learner_count N splits the actors and every batch across N learners."""
    n, batch = cfg.parallel.learner_count, cfg.train.batch_size
    if not 0 < cfg.parallel.learner_timeout < float("inf"):
        raise ConfigError(f"--learner_timeout must be a positive number of seconds, got {cfg.parallel.learner_timeout}")
    world = torchrun_world_size()
    if world is not None and n != world:
        raise ConfigError(f"--learner_count={n} but torchrun started {world} processes (WORLD_SIZE): "
                          "drop --learner_count or make them equal")
    if n == 1:
        return
    if cfg.general.algorithm not in ("impala", "impact", "appo"):
        raise ConfigError(f"--learner_count={n}: several learners train IMPALA, IMPACT and APPO only so far; "
                          f"use --learner_count=1 with --algorithm={cfg.general.algorithm}")
    here = int(os.environ.get("LOCAL_WORLD_SIZE", n))      # learners on this machine (torchrun: per node)
    if learner_device(cfg.general.device).type == "cuda" and torch.cuda.device_count() < here:
        raise ConfigError(f"{here} learners on this machine need {here} GPUs (one each) but it has "
                          f"{torch.cuda.device_count()}: lower --learner_count or use --device=cpu")
    if cfg.parallel.worker_count < n:
        raise ConfigError(f"--worker_count={cfg.parallel.worker_count} is less than --learner_count={n}: "
                          "every learner needs at least one actor")
    if batch % n:
        raise ConfigError(f"--batch_size={batch} does not split evenly across --learner_count={n} learners: "
                          f"use a multiple of {n} (the batch size is the total over all learners)")
    for spec, share in zip(specs, batch_shares(specs, batch // n)):
        if spec.sample_ratio > 0 and share == 0:
            raise ConfigError(f"--batch_size={batch} split across {n} learners gives each {batch // n} trajectories, "
                              f"and the {spec.type} replay's sample_ratio {spec.sample_ratio:g} then no trajectory: "
                              "raise --batch_size or lower --learner_count")


def validate_lstm(cfg: Config) -> None:
    """--use_lstm: IMPALA's recurrent core."""
    if cfg.network.lstm_size < 1:
        raise ConfigError(f"--lstm_size must be >= 1, got {cfg.network.lstm_size}")
    if cfg.network.use_lstm and cfg.general.algorithm not in ("impala", "impact", "appo"):
        raise ConfigError(f"--use_lstm: the LSTM core trains with --algorithm=impala, impact or appo only, not "
                          f"{cfg.general.algorithm} (its transition replay has no recurrent state)")


def validate_apex(cfg: Config) -> None:
    """Ape-X's options (checked whatever the algorithm: a bad value is bad input anyway)."""
    t = cfg.train
    if not 0 <= t.apex_epsilon <= 1:
        raise ConfigError(f"--apex_epsilon must be in [0, 1], got {t.apex_epsilon}")
    if not (t.apex_alpha >= 0 and math.isfinite(t.apex_alpha)):
        raise ConfigError(f"--apex_alpha must be a finite number >= 0, got {t.apex_alpha}")
    if not 0 <= cfg.test.apex_test_epsilon <= 1:
        raise ConfigError(f"--apex_test_epsilon must be in [0, 1], got {cfg.test.apex_test_epsilon}")
    if t.replay_ratio is not None and not (t.replay_ratio > 0 and math.isfinite(t.replay_ratio)):
        raise ConfigError(f"--replay_ratio must be a number > 0, got {t.replay_ratio}")
    if t.target_update_period is not None and t.target_update_period < 1:
        raise ConfigError(f"--target_update_period must be >= 1, got {t.target_update_period}")
    if cfg.general.algorithm == "apex" and t.n_step > t.r_f_steps:
        raise ConfigError(f"--n_step={t.n_step} is longer than a trajectory (--r_f_steps={t.r_f_steps})")


def validate_ray(cfg: Config) -> None:
    """The Ray backend's options (checked whatever the backend: a bad value is bad input
    anyway), and what the Ray backend cannot run yet."""
    p = cfg.parallel
    if not p.actor_cpus > 0 or (p.actor_cpus > 1 and not float(p.actor_cpus).is_integer()):
        # Ray itself refuses fractional quantities above 1 (when the actor is created, mid-run).
        raise ConfigError(f"--actor_cpus must be > 0, and a whole number above 1, got {p.actor_cpus:g}")
    address = str(p.ray_address).strip()
    if address not in ("local", "auto"):
        host, _, port = address.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ConfigError(f"--ray_address must be local, auto or host:port (e.g. 10.0.0.5:6379), got '{excerpt(address)}'")
    check_replay_server(cfg)
    if p.ray_compress_obs and p.multiprocessing_backend != "ray":
        raise ConfigError("--ray_compress_obs=True compresses what Ray actors send between nodes: it needs "
                          "--multiprocessing_backend=ray (local actors share memory with the learner: drop it)")
    if p.multiprocessing_backend != "ray":
        return
    if (p.learner_count or 1) > 1:
        raise ConfigError(f"--learner_count={p.learner_count} with --multiprocessing_backend=ray is not built yet: "
                          "use one learner with Ray, or several with python_native")
    if cfg.general.actor_inference in SERVED_INFERENCE:
        raise ConfigError(f"--actor_inference={cfg.general.actor_inference} shares memory with the learner on this "
                          "machine: with --multiprocessing_backend=ray actors act with their own model (use "
                          "--actor_inference=local)")


def check_replay_server(cfg: Config) -> None:
    """--replay_server and --replay_server_node: what they can run with (one line each)."""
    p = cfg.parallel
    node = str(p.replay_server_node).strip()
    if node != "learner" and not (len(node) == NODE_ID_HEX and all(c in "0123456789abcdef" for c in node.lower())):
        raise ConfigError(f"--replay_server_node must be learner or a Ray node id ({NODE_ID_HEX} hex digits, as "
                          f"`ray list nodes` shows), got '{excerpt(node)}'")
    if not p.replay_server:
        if node != "learner":
            raise ConfigError(f"--replay_server_node={node} places a replay server, but --replay_server is off: "
                              "add --replay_server=True or drop --replay_server_node")
        return
    if p.multiprocessing_backend != "ray":
        raise ConfigError("--replay_server=True runs the replay in a Ray actor: it needs --multiprocessing_backend=ray "
                          "(the local backend keeps the replay in the learner: drop --replay_server or give "
                          "--replay_server=False)")
    if cfg.general.algorithm != "apex":
        raise ConfigError(f"--replay_server=True is built for --algorithm=apex only, not {cfg.general.algorithm} "
                          "(an on-policy queue would send every fresh trajectory to the server and back, and elite "
                          "replays score with the learner's model): drop --replay_server")
