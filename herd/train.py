"""Training (new or resumed): builds the learner side from a checked Plan and the
algorithm's builder, hands it to the backend that --multiprocessing_backend names, and
writes the final checkpoint and the summary however the run ends."""
from __future__ import annotations

import logging
from pathlib import Path

import torch
import torch.multiprocessing as mp

from herd import stopping
from herd.actors.actor import ActorSpec
from herd.backends import get_backend
from herd.backends.signals import install_stop_signals
from herd.config import parse_eval_interval
from herd.devices import learner_device
from herd.errors import ActorFailure, SaveFailed, TrainingDiverged
from herd.eval_worker import EvalSpec, Evaluator
from herd.learner.batches import DirectBatches, PrefetchedBatches
from herd.learner.learner import Learner, build_optimizer, build_scheduler
from herd.learner.session import SessionOptions, TrainingSession
from herd.models import build_model, model_signature
from herd.monitor.hardware import HardwareMonitor
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
                            seed=cfg.general.seed + index)
               for index, (spec, share) in enumerate(zip(specs, shares))]
    for replay in replays:
        # Elite/attentive replays score with the learner's model, in the learner's precision.
        replay.attach_model(model, device, bf16=cfg.train.learner_precision == "bf16")
    mixer = ReplayMixer(replays, shares, r.training_fill_in_factor, seed=cfg.general.seed)
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
    learner = Learner(model, optimizer, scheduler, algorithm.build_loss(cfg), cfg.train.gradient_clip_by_norm_threshold,
                      precision=cfg.train.learner_precision, compile_model=cfg.train.learner_compile)
    options = SessionOptions(
        max_env_steps=cfg.train.environment_max_steps, save_model_period=cfg.general.save_model_period,
        log_interval=cfg.stats.verbose_learner_out_int, device=device,
        checkpoint_extra={"config": cfg.to_flat(), "env_spec": env_spec_dict(cfg, plan.env_spec),
                          "model_signature": model_signature(model), "run_dir": str(run_dir)},
        max_bad_updates=cfg.train.max_bad_updates, save_replay=cfg.general.save_replay,
        max_policy_lag=cfg.train.max_policy_lag, metric_names=algorithm.metric_names,
        description={"algorithm": algorithm.name, **algorithm.describe_optimization(cfg)}, primary=primary)
    metrics = RunMetrics(run_dir, cfg.stats.tensorboard, options.train_columns(),
                         background=cfg.stats.background_save) if primary else None
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
                     if cfg.stats.worker_verbose else 0)


def inference_device(cfg, device: torch.device, serves_algorithm: bool = True) -> str | None:
    """Where the batched inference server runs, or None when every actor acts on its own
    CPU (--actor_inference: auto means a server exactly when the learner is on a GPU and
    the server can act for the algorithm; an explicit `server` it cannot serve is refused
    in herd/plan.py)."""
    mode = cfg.general.actor_inference
    if mode == "server" or (mode == "auto" and device.type == "cuda" and serves_algorithm):
        return device.type
    return None


def start_hardware_monitor(plan: Plan, session: TrainingSession, run_dir: Path) -> HardwareMonitor | None:
    interval = plan.cfg.stats.hardware_interval
    if not interval or not session.options.primary:
        return None
    monitor = HardwareMonitor(run_dir, lambda: dict(session.processes), session.batches.replay_nbytes, interval,
                              writer=session.metrics.writer)
    monitor.start()
    return monitor


def start_evaluator(plan: Plan, session: TrainingSession, run_dir: Path) -> Evaluator | None:
    """The evaluation worker (--eval_interval), fed from the session's updates."""
    cfg = plan.cfg
    if cfg.test.eval_interval is None or not session.options.primary:
        return None
    every_updates, every_seconds = parse_eval_interval(cfg.test.eval_interval)
    test_env = {**env_kwargs(cfg), "episodic_life": False, "clip_rewards": False}
    spec = EvalSpec(cfg.env.env, test_env, plan.model_kwargs, cfg.test.eval_episodes, cfg.test.eval_greedy,
                    cfg.test.eval_video_every, cfg.general.seed + 7_000_000, tensorboard=cfg.stats.tensorboard)
    model = session.learner.model

    def registered(pid: int) -> None:
        session.processes["evaluator"] = pid

    evaluator = Evaluator(spec, model, run_dir, every_updates, every_seconds, mp.get_context("spawn"),
                          on_restart=registered)
    registered(evaluator.process.pid)
    session.summary_extra["evaluator_restarts"] = lambda: evaluator.restarts
    session.update_hooks.append(lambda updates: evaluator.on_update(model, updates, session.counters.env_steps))
    return evaluator


def train(plan: Plan, run_dir: Path) -> int:
    cfg = plan.cfg
    # The process-wide stop event: a stop that came while the session was being built
    # (the CLI's handlers were already set) ends the run here, saved at its first step.
    stop = stopping.STOP
    restore_signals = install_stop_signals(stop)
    session = failed_save = monitor = evaluator = None
    reason, code = "failed", 1
    try:
        session = build_session(plan, run_dir)
        monitor = start_hardware_monitor(plan, session, run_dir)
        evaluator = start_evaluator(plan, session, run_dir)
        if stop.is_set():
            reason, code = "stopped", 0
        else:
            backend = get_backend(cfg.parallel.multiprocessing_backend)
            reason = backend(session, actor_spec(plan), cfg.parallel.worker_count, cfg.parallel.shared_queue_size,
                             stop, cfg.parallel.actor_timeout, cfg.parallel.max_actor_restarts,
                             inference_device=inference_device(cfg, session.options.device,
                                                               plan.algorithm.inference_server))
            code = 0
    except (TrainingDiverged, ActorFailure, SaveFailed) as err:
        reason = {TrainingDiverged: "diverged", ActorFailure: "actors failed"}.get(type(err), "save failed")
        failed_save = err if isinstance(err, SaveFailed) else None
        log.error("%s", err)
    except OSError as err:  # the disk filled up or went away under the metric files or the log
        reason = "file system error"
        log.error("file system error: %s", one_line(err))
    finally:
        if evaluator is not None:
            evaluator.close()
        if monitor is not None:
            monitor.close()
        if session is not None and not session.finish(reason, failed_save):
            code = code or 1
        restore_signals()
    return code


def one_line(err: BaseException) -> str:
    return " ".join(str(err).split()) or type(err).__name__
