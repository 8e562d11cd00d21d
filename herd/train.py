"""Training (new or resumed): builds the learner side from a checked Plan and the
algorithm's builder, hands it to the backend that --multiprocessing_backend names, and
writes the final checkpoint and the summary however the run ends."""
from __future__ import annotations

import logging
import threading
from pathlib import Path

import torch

from herd.actors.actor import ActorSpec
from herd.backends import get_backend
from herd.backends.signals import install_stop_signals
from herd.devices import learner_device
from herd.errors import ActorFailure, TrainingDiverged
from herd.files import write_json
from herd.learner.batches import DirectBatches, PrefetchedBatches
from herd.learner.learner import Learner, build_optimizer, build_scheduler
from herd.learner.session import SessionOptions, TrainingSession
from herd.models import build_model, model_signature
from herd.monitor.metrics import RunMetrics
from herd.monitor.progress import ProgressLine
from herd.monitor.stats import EpisodeStats
from herd.plan import Plan, env_kwargs, env_spec_dict
from herd.replay.mixer import ReplayMixer
from herd.replay.registry import build_replay
from herd.replay.spec import batch_shares

log = logging.getLogger("herd")


def build_batches(plan: Plan, model: torch.nn.Module, device: torch.device):
    """The replays of --replay_parameters, their mixer, and the batch source over it."""
    cfg, r = plan.cfg, plan.cfg.replay
    specs = cfg.replays
    shares = batch_shares(specs, cfg.train.batch_size)
    replays = [build_replay(spec, plan.layout, share, cfg.parallel.envs_per_worker, compress=r.use_replay_compression,
                            compression_level=r.lz4_compression_level, anneal_rounds_base=cfg.train.lr_scheduler_steps,
                            seed=cfg.general.seed + index, n_step=cfg.train.n_step)
               for index, (spec, share) in enumerate(zip(specs, shares))]
    for replay in replays:
        # Elite/attentive replays score with the learner's model, in the learner's precision.
        replay.attach_model(model, device, bf16=cfg.train.learner_precision == "bf16")
    mixer = ReplayMixer(replays, shares, r.training_fill_in_factor, seed=cfg.general.seed,
                        replay_ratio=cfg.train.replay_ratio)
    if r.caching:
        return PrefetchedBatches(mixer, device, r.caching_threads, r.cache_sample_size, r.cache_output_buffer_size,
                                 r.replay_writer_queue_size, r.discarding_strategy)
    return DirectBatches(mixer, device)


def build_session(plan: Plan, run_dir: Path, primary: bool = True) -> TrainingSession:
    """primary: this process writes checkpoints, metrics and the summary (with several
    learners, only one does)."""
    cfg, algorithm = plan.cfg, plan.algorithm
    torch.set_num_threads(cfg.train.learner_thread_count)
    device = learner_device(cfg.general.device)
    model = build_model(**plan.model_kwargs).to(device)
    optimizer = build_optimizer(cfg.train.optimizer, model.parameters(), cfg.train.lr, cfg.train.rmsprop_eps)
    scheduler = build_scheduler(optimizer, cfg.train.lr, cfg.train.lr_end_value, cfg.train.lr_scheduler_steps)
    learner = Learner(model, optimizer, scheduler, algorithm.build_loss(cfg, model),
                      cfg.train.gradient_clip_by_norm_threshold,
                      precision=cfg.train.learner_precision, compile_model=cfg.train.learner_compile)
    options = SessionOptions(
        max_env_steps=cfg.train.environment_max_steps, save_model_period=cfg.general.save_model_period,
        log_interval=cfg.stats.verbose_learner_out_int, device=device,
        checkpoint_extra={"config": cfg.to_flat(), "env_spec": env_spec_dict(cfg, plan.env_spec),
                          "model_signature": model_signature(model), "run_dir": str(run_dir)},
        max_bad_updates=cfg.train.max_bad_updates, save_replay=cfg.general.save_replay,
        max_policy_lag=cfg.train.max_policy_lag, metric_names=algorithm.metric_names,
        description={"algorithm": algorithm.name, **algorithm.describe_optimization(cfg)}, primary=primary,
        least_exploring_actor=algorithm.least_exploring_actor(cfg.parallel.worker_count))
    metrics = RunMetrics(run_dir, cfg.stats.tensorboard, options.train_columns(), background=cfg.stats.background_save,
                         episode_columns=options.episode_columns()) if primary else None
    progress = ProgressLine(cfg.train.environment_max_steps, enabled=cfg.stats.basic_verbose and primary)
    session = TrainingSession(plan.layout, learner, build_batches(plan, model, device),
                              EpisodeStats(cfg.stats.avg_buff_size), metrics, progress, run_dir, options)
    if plan.checkpoint is not None:
        session.load_state_dict(plan.checkpoint, load_optimizer=cfg.general.load_optimizer_save)
        log.info("resumed from %s at %d environment steps, %d updates", plan.checkpoint_path,
                 session.counters.env_steps, session.counters.updates)
    return session


def actor_spec(plan: Plan) -> ActorSpec:
    cfg = plan.cfg
    p = cfg.parallel
    return ActorSpec(env_id=cfg.env.env, env_kwargs=env_kwargs(cfg), model_kwargs=plan.model_kwargs,
                     envs_per_worker=p.envs_per_worker, unroll_length=cfg.train.r_f_steps, seed=cfg.general.seed,
                     env_backend=p.env_backend, env_threads=p.env_threads, env_batch_size=p.env_batch_size,
                     algorithm=plan.algorithm.name, verbose_interval=cfg.stats.verbose_worker_out_int
                     if cfg.stats.worker_verbose else 0, worker_count=p.worker_count,
                     act_options=plan.algorithm.actor_options(cfg))


def inference_device(cfg, device: torch.device, algorithm) -> str | None:
    """Where the batched inference server runs, or None when every actor acts on its own
    CPU (--actor_inference: auto means a server exactly when the learner is on a GPU and
    the algorithm's actors can use one)."""
    mode = cfg.general.actor_inference
    if mode == "server" or (mode == "auto" and device.type == "cuda" and algorithm.inference_server):
        return device.type
    return None


def train(plan: Plan, run_dir: Path) -> int:
    cfg = plan.cfg
    session = build_session(plan, run_dir)
    backend = get_backend(cfg.parallel.multiprocessing_backend)
    stop = threading.Event()
    restore_signals = install_stop_signals(stop)
    reason, code = "failed", 1
    try:
        reason = backend(session, actor_spec(plan), cfg.parallel.worker_count, cfg.parallel.shared_queue_size, stop,
                         cfg.parallel.actor_timeout, cfg.parallel.max_actor_restarts,
                         inference_device=inference_device(cfg, session.options.device, plan.algorithm))
        code = 0
    except (TrainingDiverged, ActorFailure) as err:
        reason = "diverged" if isinstance(err, TrainingDiverged) else "actors failed"
        log.error("%s", err)
    finally:
        session.finish(reason)
        restore_signals()
    return code
