"""Training (new or resumed): builds the learner side from a checked Plan and hands it
to the backend; writes the final checkpoint and the summary however the run ends."""
from __future__ import annotations

import logging
import threading
from pathlib import Path

import torch

from herd.actors.actor import ActorSpec
from herd.backends.local import install_stop_signals, train_local
from herd.config import batch_shares
from herd.devices import learner_device
from herd.learner.batches import DirectBatches, PrefetchedBatches
from herd.learner.learner import Learner, build_optimizer, build_scheduler
from herd.learner.session import SessionOptions, TrainingDiverged, TrainingSession
from herd.backends.local import ActorFailure
from herd.losses.impala import ImpalaLossWeights
from herd.models import build_model, model_signature
from herd.monitor.metrics import RunMetrics
from herd.monitor.progress import ProgressLine
from herd.monitor.stats import EpisodeStats
from herd.replay.mixer import ReplayMixer
from herd.replay.replay import build_replay

log = logging.getLogger("herd")


def loss_weights(cfg) -> ImpalaLossWeights:
    lo = cfg.loss
    return ImpalaLossWeights(
        gamma=cfg.train.gamma, policy_gradient=lo.policy_gradient_loss_weight, value=lo.value_loss_weight,
        entropy=lo.entropy_loss_weight, rho_const=lo.rho_const, c_const=lo.c_const,
        use_policy_cloning=lo.use_policy_cloning_loss, policy_cloning=lo.policy_cloning_loss_weight,
        use_value_cloning=lo.use_value_cloning_loss, value_cloning=lo.value_cloning_loss_weight,
        use_kl_mask=lo.use_kl_mask, kl_div_threshold=lo.kl_div_threshold)


def build_session(plan, run_dir: Path) -> TrainingSession:
    cfg = plan.cfg
    torch.set_num_threads(cfg.train.learner_thread_count)
    device = learner_device(cfg.general.device)
    model = build_model(**plan.model_kwargs).to(device)
    optimizer = build_optimizer(cfg.train.optimizer, model.parameters(), cfg.train.lr, cfg.train.rmsprop_eps)
    scheduler = build_scheduler(optimizer, cfg.train.lr, cfg.train.lr_end_value, cfg.train.lr_scheduler_steps)
    learner = Learner(model, optimizer, scheduler, loss_weights(cfg), cfg.train.gradient_clip_by_norm_threshold,
                      precision=cfg.train.learner_precision, compile_model=cfg.train.learner_compile)
    specs = cfg.replays
    shares = batch_shares(specs, cfg.train.batch_size)
    r = cfg.replay
    replays = [build_replay(spec, plan.layout, share, cfg.parallel.envs_per_worker, compress=r.use_replay_compression,
                            compression_level=r.lz4_compression_level, anneal_rounds_base=cfg.train.lr_scheduler_steps,
                            seed=cfg.general.seed + index)
               for index, (spec, share) in enumerate(zip(specs, shares))]
    for replay in replays:
        # Elite/attentive replays score with the learner's model, in the learner's precision.
        replay.attach_model(model, device, bf16=cfg.train.learner_precision == "bf16")
    mixer = ReplayMixer(replays, shares, cfg.replay.training_fill_in_factor, seed=cfg.general.seed)
    if r.caching:
        batches = PrefetchedBatches(mixer, device, r.caching_threads, r.cache_sample_size, r.cache_output_buffer_size,
                                    r.replay_writer_queue_size, r.discarding_strategy)
    else:
        batches = DirectBatches(mixer, device)
    from herd.run import env_spec_dict
    options = SessionOptions(
        max_env_steps=cfg.train.environment_max_steps, save_model_period=cfg.general.save_model_period,
        log_interval=max(1, min(cfg.stats.verbose_learner_out_int, 50)), device=device,
        checkpoint_extra={"config": cfg.to_flat(), "env_spec": env_spec_dict(cfg, plan.env_spec),
                          "model_signature": model_signature(model), "run_dir": str(run_dir)},
        max_bad_updates=cfg.train.max_bad_updates, save_replay=cfg.general.save_replay,
        max_policy_lag=cfg.train.max_policy_lag)
    progress = ProgressLine(cfg.train.environment_max_steps, enabled=cfg.stats.basic_verbose)
    session = TrainingSession(plan.layout, learner, batches, EpisodeStats(cfg.stats.avg_buff_size),
                              RunMetrics(run_dir, cfg.stats.tensorboard), progress, run_dir, options)
    if plan.checkpoint is not None:
        session.load_state_dict(plan.checkpoint, load_optimizer=cfg.general.load_optimizer_save)
        log.info("resumed from %s at %d environment steps, %d updates", plan.checkpoint_path,
                 session.counters.env_steps, session.counters.updates)
    return session


def actor_spec(plan) -> ActorSpec:
    from herd.run import env_kwargs
    cfg = plan.cfg
    p = cfg.parallel
    return ActorSpec(env_id=cfg.env.env, env_kwargs=env_kwargs(cfg), model_kwargs=plan.model_kwargs,
                     envs_per_worker=p.envs_per_worker, unroll_length=cfg.train.r_f_steps, seed=cfg.general.seed,
                     env_backend=p.env_backend, env_threads=p.env_threads, env_batch_size=p.env_batch_size)


def inference_device(cfg, device: torch.device) -> str | None:
    """Where the batched inference server runs, or None when every actor acts on its own
    CPU (--actor_inference: auto means a server exactly when the learner is on a GPU)."""
    mode = cfg.general.actor_inference
    if mode == "server" or (mode == "auto" and device.type == "cuda"):
        return device.type
    return None


def train(plan, run_dir: Path) -> int:
    from herd.run import write_json
    cfg = plan.cfg
    session = build_session(plan, run_dir)
    stop = threading.Event()
    restore_signals = install_stop_signals(stop)
    reason, code = "failed", 1
    try:
        reason = train_local(session, actor_spec(plan), cfg.parallel.worker_count, cfg.parallel.shared_queue_size, stop,
                             cfg.parallel.actor_timeout, cfg.parallel.max_actor_restarts,
                             inference_device=inference_device(cfg, session.options.device))
        code = 0
    except (TrainingDiverged, ActorFailure) as err:
        reason = "diverged" if isinstance(err, TrainingDiverged) else "actors failed"
        log.error("%s", err)
    finally:
        session.show_progress(force=True)
        session.progress.finish()
        if session.counters.updates:
            session.write_train_metrics()  # the last row, whatever the log interval
        path = session.save()
        summary = {**session.summary(), "ended": reason, "checkpoint": str(path)}
        write_json(run_dir / "summary.json", summary)
        session.metrics.close()
        session.batches.close()
        restore_signals()
        log.info("%s after %d environment steps and %d updates; average score %.2f; checkpoint %s",
                 reason, session.counters.env_steps, session.counters.updates, session.stats.average, path)
    return code
