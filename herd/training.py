"""Training (new or resumed): builds the learner side from a checked Plan and the
algorithm's builder, hands it to the backend that --multiprocessing_backend names, and
writes the final checkpoint and the summary however the run ends.

With --learner_count N > 1, `train` starts N-1 more learner processes (or torchrun
started them all) that join one process group (herd/learner/distributed.py); each runs
the backend with its share of the actors and 1/N of every batch, and learner 0 (the
primary, in the first process) writes checkpoints, metrics and the summary."""
from __future__ import annotations

import copy
import json
import logging
import os
import random
import sys
from dataclasses import replace
from functools import partial
from pathlib import Path

import numpy as np
import torch
import torch.multiprocessing as mp

from herd import stopping
from herd.actors.actor import ActorSpec
from herd.backends import SERVED_INFERENCE, backend_options, get_backend
from herd.backends.inference_servers import GROW_AT
from herd.backends.local import InferenceSetup
from herd.backends.signals import install_stop_signals
from herd.config import parse_eval_interval
from herd.device_copies import DeviceCopies
from herd.devices import fast_bf16, learner_device, use_deterministic_algorithms
from herd.errors import ActorFailure, LearnerFailure, PublishFailed, ReplayLost, SaveFailed, TrainingDiverged
from herd.eval_worker import EvalSpec, Evaluator
from herd.inference import ServerOptions
from herd.learner.batches import DirectBatches, PrefetchedBatches, ReplayElsewhere
from herd.learner.distributed import (GroupSync, LearnerGroup, broadcast_state, join_group, leave_group,
                                      private_rendezvous, share_of, short_reason)
from herd.learner.autotune import (ChoiceCache, Measure, StepConfig, cache_key, candidates, choose, default_cache,
                                   synthetic_batch, timed_updates)
from herd.learner.learner import Learner, build_optimizer, build_scheduler
from herd.learner.session import SessionOptions, TrainingSession
from herd.models import build_model, model_signature, observation_normalizer
from herd.models.base import TrainingLayout
from herd.monitor.hardware import HardwareMonitor
from herd.monitor.tracking import tracked
from herd.monitor.metrics import RunMetrics
from herd.monitor.progress import ProgressLine
from herd.monitor.stats import EpisodeStats
from herd.plan import Plan, env_kwargs, env_spec_dict, plays_greedily, test_policy_of
from herd.profiles import MAX_INFERENCE_SERVERS
from herd.replay.mixer import ReplayMixer
from herd.replay.registry import build_replay
from herd.replay.spec import batch_shares

log = logging.getLogger("herd")

# The algorithms whose CPU learner times its configurations at start-up: those of
# trajectory batches (herd/learner/autotune.py builds one). Ape-X's are transitions.
TIMED_ALGORITHMS = ("impala", "impact", "appo")


def build_mixer(plan: Plan, model: torch.nn.Module | None, device: torch.device, rank: int = 0,
                local: bool = False, copies: DeviceCopies | None = None) -> ReplayMixer:
    """The replays of --replay_parameters and their mixer; with several learners, learner
    `rank`'s own, drawing its 1/N of every batch. model: what elite/attentive replays
    score with (None where no replay needs it: a replay server's prioritized replay).
    local: the batches go to a learner in this process (build_batches), not over a wire.
    copies: a GPU learner's copy stream, which its replays copy rollouts on."""
    cfg, r = plan.cfg, plan.cfg.replay
    specs = cfg.replays
    shares = batch_shares(specs, cfg.train.batch_size // cfg.parallel.learner_count)
    seed = cfg.general.seed + 1000 * rank       # each learner samples its replays its own way
    # A GPU learner keeps every replay kind (queue, standard, custom elite/attentive, prioritized,
    # circular) in its memory and gathers batches there; prioritized keeps its priorities there too.
    storage_device = device if device.type == "cuda" else None
    if storage_device is not None and specs:
        log.info("replays: %s keep their trajectories in %s memory (uncompressed uint8 frames; "
                 "--use_replay_compression applies to host replays)", ", ".join(sorted({s.type for s in specs})), device)
    # A learner in this process is lent the queue's batches when the queue is the only replay
    # (herd/replay/mixer.py `lends`: a CPU learner trains them in place, a GPU learner gathers
    # them straight into its step's inputs); the queue makes room for the batches lent at
    # once: the one in training, those kept ready and those a worker is preparing.
    lends = local and len(specs) == 1 and specs[0].type == "queue"
    lent = 0
    if lends:
        lent = r.cache_output_buffer_size + r.caching_threads * r.cache_sample_size + 1 if r.caching else 1
    replays = [build_replay(spec, plan.layout, share, cfg.parallel.envs_per_worker, compress=r.use_replay_compression,
                            compression_level=r.lz4_compression_level, anneal_rounds_base=cfg.train.lr_scheduler_steps,
                            seed=seed + index, n_step=cfg.train.n_step, storage_device=storage_device,
                            device_copies=copies, lent_batches=lent)
               for index, (spec, share) in enumerate(zip(specs, shares))]
    if model is not None:
        for replay in replays:
            # Elite/attentive replays score with the learner's model, in the learner's precision.
            replay.attach_model(model, device, bf16=cfg.train.learner_precision == "bf16")
    return ReplayMixer(replays, shares, r.training_fill_in_factor, seed=seed, replay_ratio=cfg.train.replay_ratio,
                       lends=lends)


def build_batches(plan: Plan, model: torch.nn.Module, device: torch.device, rank: int = 0,
                  copies: DeviceCopies | None = None):
    """The batch source over the replays (build_mixer): in this process, or, with the Ray
    backend's --replay_server, a stand-in until the backend starts the replay server,
    which builds the same mixer itself (validate() allows it for Ape-X only, whose
    prioritized replay needs no model)."""
    r = plan.cfg.replay
    if plan.cfg.parallel.replay_server:
        # Pickled to the server: the plan without the checkpoint (its replay goes there once, on its own).
        light = Plan(**{**plan.__dict__, "checkpoint": None})
        return ReplayElsewhere(partial(build_mixer, light, None, torch.device("cpu")),
                               requests_ahead=r.cache_output_buffer_size, writes_waiting=r.replay_writer_queue_size)
    mixer = build_mixer(plan, model, device, rank, local=True, copies=copies)
    if r.caching:
        return PrefetchedBatches(DirectBatches(mixer, device), r.caching_threads, r.cache_sample_size,
                                 r.cache_output_buffer_size, r.replay_writer_queue_size, r.discarding_strategy)
    return DirectBatches(mixer, device)


def make_learner(plan: Plan, model: torch.nn.Module, step: StepConfig, grad_sync=None, capture: bool = False
                 ) -> Learner:
    """The run's learner over `model` (its optimizer, schedule and loss), running as `step` says."""
    cfg, algorithm = plan.cfg, plan.algorithm
    if step.channels_last is not None and isinstance(model, TrainingLayout):
        model.channels_last_when_training = step.channels_last
    optimizer = build_optimizer(cfg.train.optimizer, model.parameters(), cfg.train.lr, cfg.train.rmsprop_eps)
    scheduler = build_scheduler(optimizer, cfg.train.lr, cfg.train.lr_end_value, cfg.train.lr_scheduler_steps,
                                cfg.train.lr_decay_power)
    # --entropy_decay (IMPALA's, validation.py): the bonus's weight follows the rate's schedule.
    loss = (algorithm.build_loss(cfg, model, entropy=scheduler.follow(cfg.loss.entropy_loss_weight))
            if cfg.loss.entropy_decay else algorithm.build_loss(cfg, model))
    return Learner(model, optimizer, scheduler, loss,
                   cfg.train.gradient_clip_by_norm_threshold, precision=step.precision, compile_model=step.compiled,
                   grad_sync=grad_sync, capture=capture, reuse=algorithm.reuse(cfg),
                   metric_names=algorithm.metric_names)


def step_config(plan: Plan, model: torch.nn.Module, device: torch.device, several_learners: bool,
                cache: ChoiceCache | None = None, measure: Measure | None = None) -> StepConfig:
    """How the learner update runs: the options as given, and on a CPU learner of one of
    TIMED_ALGORITHMS, for those left to herd (precision and compiling left to the machine,
    --learner_layout=auto), the fastest configuration of this run's own update
    (herd/learner/autotune.py), logged with its times. cache: default_cache() when None;
    measure: timed_updates of copies of `model` on a synthetic batch when None."""
    cfg = plan.cfg
    left = (plan.machine_picks or {}).get("options", {})
    has_layout = isinstance(model, TrainingLayout)
    given = StepConfig(cfg.train.learner_precision, cfg.train.learner_layout != "nchw" if has_layout else None,
                       bool(cfg.train.learner_compile))
    if device.type != "cpu" or several_learners or cfg.general.algorithm not in TIMED_ALGORITHMS:
        return given
    precision = "auto" if "learner_precision" in left else cfg.train.learner_precision
    configs = candidates(precision, cfg.train.learner_layout, fast_bf16(device), has_layout)
    try_compile = "learner_compile" in left and bool(cfg.train.learner_compile)
    batch = synthetic_batch(plan.layout, cfg.train.batch_size)
    if measure is None:
        measure = timed_updates(lambda config: make_learner(plan, copy.deepcopy(model), config), batch)
    network = json.dumps(plan.model_kwargs, sort_keys=True, default=str)
    choice = choose(configs, measure, try_compile, cache or default_cache(),
                    cache_key(network, batch, cfg.general.algorithm, configs, try_compile))
    log.info("%s", choice.log_line())
    if cfg.train.learner_compile and not try_compile:
        return replace(choice.picked, compiled=True)       # --learner_compile=True: the pick, compiled
    return choice.picked


def build_session(plan: Plan, run_dir: Path, primary: bool = True, group: LearnerGroup | None = None
                  ) -> TrainingSession:
    """primary: this process writes checkpoints, metrics and the summary (with several
    learners, only one does). group: this learner's place among several."""
    cfg, algorithm = plan.cfg, plan.algorithm
    primary = primary if group is None else group.primary
    torch.set_num_threads(cfg.train.learner_thread_count)
    device = learner_device(cfg.general.device)
    if device.type == "cuda" and group is not None:
        device = torch.device("cuda", group.local_rank % torch.cuda.device_count())  # one GPU per learner
        torch.cuda.set_device(device)
    if device.type == "cuda":
        # Fixed input shapes every update: let cudnn time its algorithms once and keep the fastest.
        torch.backends.cudnn.benchmark = True
    model = build_model(**plan.model_kwargs).to(device)
    step = step_config(plan, model, device, several_learners=group is not None)
    cfg.train.learner_precision, cfg.train.learner_compile = step.precision, step.compiled
    if step.channels_last is not None:
        cfg.train.learner_layout = "channels_last" if step.channels_last else "nchw"
    sync = GroupSync(group, [p for p in model.parameters() if p.requires_grad]) if group is not None else None
    learner = make_learner(plan, model, step, grad_sync=sync.exchange if sync is not None else None,
                           capture=cfg.train.learner_capture)
    reuse = learner.reuse
    log.info("learner: %s on %s, %s, %d intra-op thread(s), %s%s", algorithm.name, device.type,
             replace(step, compiled=False).label, cfg.train.learner_thread_count,
             "compiled" if cfg.train.learner_compile
             else "one captured CUDA graph per update after a short eager warm-up" if learner.capture
             else "eager",
             "" if reuse is None else f"; each stored batch trained in {reuse.passes} passes of {reuse.minibatches} "
                                      f"minibatches ({reuse.steps} gradient steps)")
    options = SessionOptions(
        max_env_steps=cfg.train.environment_max_steps, save_model_period=cfg.general.save_model_period,
        save_model_seconds=cfg.general.save_model_seconds,
        log_interval=cfg.stats.verbose_learner_out_int, device=device,
        checkpoint_extra={"config": cfg.to_flat(), "env_spec": env_spec_dict(cfg, plan.env_spec),
                          "model_signature": model_signature(model), "run_dir": str(run_dir)},
        max_bad_updates=cfg.train.max_bad_updates, save_replay=cfg.general.save_replay,
        max_policy_lag=cfg.train.max_policy_lag, metric_names=algorithm.metric_names,
        description={"algorithm": algorithm.name, **algorithm.describe_optimization(cfg),
                     "provenance": plan.provenance}, primary=primary,
        least_exploring_actor=algorithm.least_exploring_actor(cfg.parallel.worker_count))
    metrics = RunMetrics(run_dir, cfg.stats.tensorboard, options.train_columns(), background=cfg.stats.background_save,
                         episode_columns=options.episode_columns()) if primary else None
    metrics = tracked(metrics, cfg.to_flat(), run_dir, cfg.stats.wandb_project)   # wandb, TensorBoard HParams
    progress = ProgressLine(cfg.train.environment_max_steps, enabled=cfg.stats.basic_verbose and primary)
    # A GPU learner's replays copy rollouts on a stream of their own; their slots go back
    # once the copies are done (herd/device_copies.py). A CPU learner's copies are done
    # when they return.
    copies = DeviceCopies(device) if device.type == "cuda" else None
    session = TrainingSession(plan.layout, learner, build_batches(plan, model, device, group.rank if group else 0,
                                                                  copies),
                              EpisodeStats(cfg.stats.avg_buff_size), metrics, progress, run_dir, options)
    session.device_copies = copies
    session.sync = sync
    session.observation_stats = observation_normalizer(model)    # None without --normalize_observations
    if plan.checkpoint is not None:
        state = plan.checkpoint
        saved_count = int(state["config"].get("learner_count") or 1)
        if not primary:
            state = {k: v for k, v in state.items() if k != "replay"}   # only the primary's replay was saved
        session.load_state_dict(state, load_optimizer=cfg.general.load_optimizer_save,
                                fresh_replay=saved_count == cfg.parallel.learner_count)
        log.info("resumed from %s at %d environment steps, %d updates", plan.checkpoint_path,
                 session.counters.env_steps, session.counters.updates)
    if group is not None:
        broadcast_state(model)      # identical weights on every learner from the start
    return session


def actor_spec(plan: Plan, first_actor: int = 0) -> ActorSpec:
    """first_actor: with several learners, the global index of this learner's first actor,
    so that no two actors of the run share environment seeds (ActorPool seeds actor i
    with seed + 10,000 i)."""
    cfg = plan.cfg
    p = cfg.parallel
    return ActorSpec(env_id=cfg.env.env, env_kwargs=env_kwargs(cfg), model_kwargs=plan.model_kwargs,
                     envs_per_worker=p.envs_per_worker, unroll_length=cfg.train.r_f_steps,
                     seed=cfg.general.seed + 10_000 * first_actor,
                     env_backend=p.env_backend, env_threads=p.env_threads, env_batch_size=p.env_batch_size,
                     algorithm=plan.algorithm.name, verbose_interval=cfg.stats.verbose_worker_out_int
                     if cfg.stats.worker_verbose else 0, worker_count=p.worker_count,
                     act_options=plan.algorithm.actor_options(cfg),
                     record_fields=tuple(name for name, _ in plan.layout.step_fields),
                     double_buffer=p.actor_double_buffer, one_slot=p.shared_queue_size == 1)


def inference_device(cfg, device: torch.device, serves_algorithm: bool = True) -> str | None:
    """Where the batched inference server runs, or None when every actor acts on its own
    CPU (--actor_inference: auto means a server exactly when the learner is on a GPU and
    the server can act for the algorithm; an explicit `server` it cannot serve is refused
    in herd/plan.py)."""
    mode = cfg.general.actor_inference
    if cfg.parallel.multiprocessing_backend != "python_native":
        return None                     # the server shares memory with its actors: on this machine only
    if mode in SERVED_INFERENCE or (mode == "auto" and device.type == "cuda" and serves_algorithm):
        return str(device)              # "cuda:1": each learner's server beside it
    return None


def inference_setup(cfg, device: str, worker_count: int) -> InferenceSetup:
    """How many inference servers serve this learner's `worker_count` actors on `device`,
    and how they batch and compute (the --inference_* options)."""
    p = cfg.parallel
    cuda = torch.device(device).type == "cuda"
    bf16 = p.inference_precision == "bf16" or (p.inference_precision == "auto" and cuda
                                               and fast_bf16(torch.device(device)))
    options = ServerOptions(batch_wait_us=p.inference_batch_wait_us, min_clients=p.inference_min_clients,
                            weights_interval=p.inference_weights_interval, bf16=bf16, channels_last=cuda,
                            cuda_graphs=p.inference_cuda_graphs is not False and cuda,
                            graphs_measured=p.inference_cuda_graphs is None)
    records = p.inference_records == "on" or (p.inference_records == "auto" and cuda)
    # With several learners each has its share of the actors: never more servers than those.
    if p.inference_servers is None:         # from their measured load: one, then more as it asks
        servers, most, grow_at = 1, min(MAX_INFERENCE_SERVERS, worker_count), GROW_AT
    else:
        servers = most = max(1, min(p.inference_servers, worker_count))
        grow_at = None
    return InferenceSetup(servers, most, grow_at, options, records, p.inference_doorbell,
                          in_actor=cfg.general.actor_inference == "in_actor")


def start_hardware_monitor(plan: Plan, session: TrainingSession, run_dir: Path) -> HardwareMonitor | None:
    interval = plan.cfg.stats.hardware_interval
    if not interval or not session.options.primary:
        return None
    # Read through the session each time: the Ray backend's replay server replaces the batch source.
    monitor = HardwareMonitor(run_dir, lambda: dict(session.processes), lambda: session.batches.replay_nbytes(),
                              interval, writer=session.metrics.writer)
    monitor.start()
    return monitor


def start_evaluator(plan: Plan, session: TrainingSession, run_dir: Path) -> Evaluator | None:
    """The evaluation worker (--eval_interval), fed from the session's updates."""
    cfg = plan.cfg
    if cfg.test.eval_interval is None or not session.options.primary:
        return None
    every_updates, every_seconds = parse_eval_interval(cfg.test.eval_interval)
    test_env = {**env_kwargs(cfg), "episodic_life": False, "clip_rewards": False}
    greedy = plays_greedily(plan, cfg.test.eval_greedy)       # eval.csv says how the games were played
    spec = EvalSpec(cfg.env.env, test_env, plan.model_kwargs, cfg.test.eval_episodes, greedy,
                    cfg.test.eval_video_every, cfg.general.seed + 7_000_000, tensorboard=cfg.stats.tensorboard,
                    policy=test_policy_of(plan))
    model = session.learner.model

    def registered(pid: int) -> None:
        session.processes["evaluator"] = pid

    evaluator = Evaluator(spec, model, run_dir, every_updates, every_seconds, mp.get_context("spawn"),
                          on_restart=registered)
    registered(evaluator.process.pid)
    session.evaluator = evaluator
    return evaluator


def train(plan: Plan, run_dir: Path, group: LearnerGroup | None = None) -> int:
    """Trains; returns the exit code. group: set when torchrun started the learners."""
    if plan.cfg.parallel.learner_count > 1 and group is None:
        return launch_learners(plan, run_dir)
    return train_learner(plan, run_dir, group)


def train_learner(plan: Plan, run_dir: Path, group: LearnerGroup | None) -> int:
    """One learner (the only one, or one of a group) with its actors, until the end."""
    cfg = plan.cfg
    first_actor, worker_count = (share_of(cfg.parallel.worker_count, group.size, group.rank) if group is not None
                                 else (0, cfg.parallel.worker_count))
    # The process-wide stop event: a stop that came while the session was being built
    # (the CLI's handlers were already set) ends the run here, saved at its first step.
    stop = stopping.STOP
    restore_signals = install_stop_signals(stop)
    session = failed_save = monitor = evaluator = None
    reason, code = "failed", 1
    try:
        session = build_session(plan, run_dir, group=group)
        monitor = start_hardware_monitor(plan, session, run_dir)
        evaluator = start_evaluator(plan, session, run_dir)
        if stop.is_set():
            reason, code = "stopped", 0
        else:
            backend = get_backend(cfg.parallel.multiprocessing_backend)
            serve_on = inference_device(cfg, session.options.device, plan.algorithm.inference_server
                                        and plan.env_spec.action_kind == "discrete")
            servers = {} if serve_on is None else {"inference": inference_setup(cfg, serve_on, worker_count)}
            reason = backend(session, actor_spec(plan, first_actor), worker_count, cfg.parallel.shared_queue_size,
                             stop, cfg.parallel.actor_timeout, cfg.parallel.max_actor_restarts,
                             inference_device=serve_on, **servers,
                             **backend_options(cfg.parallel.multiprocessing_backend, cfg.parallel))
            code = 0
    except (TrainingDiverged, ActorFailure, SaveFailed, ReplayLost, PublishFailed) as err:
        reason = {TrainingDiverged: "diverged", ActorFailure: "actors failed", ReplayLost: "replay server died",
                  PublishFailed: "publisher failed"}.get(type(err), "save failed")
        # No final checkpoint after a failed save, nor without the replay: the last one is kept.
        failed_save = err if isinstance(err, (SaveFailed, ReplayLost)) else None
        log.error("%s", err)
    except LearnerFailure as err:
        reason = "learner failed"
        dead = group.dead_ranks()
        saver = group.saver()                     # the primary, or the first survivor when it died
        log.error("%s%s: the run stops%s", f"learner {', '.join(map(str, dead))} died; " if dead else "", err,
                  " and this learner writes the checkpoint" if saver and not group.primary else "")
        if session is not None:
            session.options.primary = saver
    except OSError as err:  # the disk filled up or went away under the metric files or the log
        reason = "file system error"
        log.error("file system error: %s", one_line(err))
    finally:
        if evaluator is not None:
            evaluator.close(finished=reason == "finished", interrupted=stop)
        if monitor is not None:
            monitor.close()
        if session is not None and not session.finish(reason, failed_save):
            code = code or 1
        restore_signals()
    return code


def one_line(err: BaseException) -> str:
    return " ".join(str(err).split()) or type(err).__name__


def launch_learners(plan: Plan, run_dir: Path) -> int:
    """Learner 0 runs here; learners 1..N-1 in spawned processes; they meet through a file in
    a private folder and talk over the loopback interface. Returns 1 when any learner failed."""
    with private_rendezvous() as rendezvous:
        return run_learners(plan, run_dir, rendezvous)


def run_learners(plan: Plan, run_dir: Path, rendezvous: str) -> int:
    cfg = plan.cfg
    count = cfg.parallel.learner_count
    context = mp.get_context("spawn")
    # The others never load the replay (only the primary's is saved): don't pickle it to them.
    light = Plan(**{**plan.__dict__, "checkpoint": None if plan.checkpoint is None else
                    {k: v for k, v in plan.checkpoint.items() if k != "replay"}})
    # Not daemonic: a learner starts actor processes of its own.
    others = [context.Process(target=learner_process, name=f"herd-learner-{rank}",
                              args=(rank, count, rendezvous, light, run_dir)) for rank in range(1, count)]
    for process in others:
        process.start()
    log.info("%d learners (pids %s); each trains on %d of every %d trajectories", count,
             ", ".join(str(p) for p in [os.getpid(), *(q.pid for q in others)]),
             cfg.train.batch_size // count, cfg.train.batch_size)
    code = 1
    try:
        try:
            group = join_group(0, count, learner_device(cfg.general.device).type, cfg.parallel.learner_timeout,
                               rendezvous)
        except Exception as err:  # the store or gloo: a learner that never came
            log.error("the %d learners did not all start within --learner_timeout=%g s (%s): nothing was trained",
                      count, cfg.parallel.learner_timeout, short_reason(err))
            return 1
        code = train_learner(plan, run_dir, group)
    finally:
        leave_group()
        for rank, process in enumerate(others, start=1):
            process.join(30.0)
            if process.is_alive():
                log.warning("learner %d did not stop in time: terminating it", rank)
                process.terminate()
                process.join(5.0)
            if process.exitcode:
                code = 1
    return code


def learner_process(rank: int, count: int, rendezvous: str, plan: Plan, run_dir: Path) -> None:
    """A learner other than the primary, in its own process (launch_learners)."""
    learner_logging(rank, plan.cfg.general.debug)
    seed = plan.cfg.general.seed + rank
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
    use_deterministic_algorithms(plan.cfg.general.reproducible)
    try:
        group = join_group(rank, count, learner_device(plan.cfg.general.device).type,
                           plan.cfg.parallel.learner_timeout, rendezvous)
        code = train_learner(plan, run_dir, group)
    finally:
        leave_group()
    sys.exit(code)


def learner_logging(rank: int, debug: bool) -> None:
    """A learner other than the primary logs to stderr only, its lines marked with its rank
    (log.txt is the primary's)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(f"[herd learner {rank}] %(message)s"))
    log.handlers[:] = [handler]
    log.propagate = False
    log.setLevel(logging.DEBUG if debug else logging.INFO)
