"""The learner side of a training run, independent of how actors are run: it ingests
finished rollouts into the replays, trains on every batch that is ready, keeps the
counters and statistics, writes metrics and checkpoints. A backend feeds it rollouts."""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from herd.checkpoint import save_checkpoint
from herd.errors import TrainingDiverged
from herd.files import write_json
from herd.learner.learner import LEARNER_METRICS, Learner
from herd.monitor.metrics import EPISODE_COLUMNS, RunMetrics
from herd.monitor.progress import ProgressLine, format_score
from herd.monitor.stats import EpisodeStats
from herd.trajectory import TrajectoryLayout

log = logging.getLogger("herd")

# What the session adds to the algorithm's and the learner's metrics in train.csv.
SESSION_METRICS = ("policy_lag", "fps", "average_score")


@dataclass
class Counters:
    env_steps: int = 0
    updates: int = 0
    rollouts: int = 0
    skipped_updates: int = 0
    stale_rollouts: int = 0       # fresh rollouts dropped for a policy lag above max_policy_lag
    wall_time: float = 0.0        # training seconds over all resumed parts of the run

    def state_dict(self) -> dict:
        return dict(self.__dict__)

    def load_state_dict(self, state: dict) -> None:
        for key, value in state.items():
            setattr(self, key, type(getattr(self, key))(value))


@dataclass
class SessionOptions:
    max_env_steps: int
    save_model_period: int
    log_interval: int
    device: torch.device
    checkpoint_extra: dict = field(default_factory=dict)   # config, env spec, model signature
    save_replay: bool = True
    max_bad_updates: int = 10
    max_policy_lag: int | None = None                      # drop rollouts older than this many updates
    metric_names: tuple = ()                               # the algorithm's loss metrics (train.csv, TensorBoard)
    description: dict = field(default_factory=dict)        # algorithm, optimizer, schedule (summary.json)
    primary: bool = True                                   # writes checkpoints, metrics and the summary
    # The actor whose games are marked in episodes.csv and averaged on their own (Ape-X: the
    # least exploring one, whose play is closest to the greedy policy); None: no marks.
    least_exploring_actor: int | None = None

    def train_columns(self) -> list[str]:
        marked = ["least_exploring_average"] if self.least_exploring_actor is not None else []
        return ["update", "env_step", "wall_time", *self.metric_names, *LEARNER_METRICS, *SESSION_METRICS, *marked]

    def episode_columns(self) -> list[str]:
        marked = ["actor", "least_exploring"] if self.least_exploring_actor is not None else []
        return [*EPISODE_COLUMNS, *marked]


class TrainingSession:
    def __init__(self, layout: TrajectoryLayout, learner: Learner, batches, stats: EpisodeStats,
                 metrics: RunMetrics | None, progress: ProgressLine, run_dir: Path, options: SessionOptions):
        self.layout = layout        # what one trajectory holds; backends size their slots by it
        self.learner = learner
        self.batches = batches      # herd.learner.batches: DirectBatches or PrefetchedBatches
        self.stats = stats
        self.metrics = metrics      # None in a process that is not the primary one
        self.progress = progress
        self.run_dir = run_dir
        self.options = options
        self.counters = Counters()
        self.start_time = time.monotonic()
        self.start_steps = 0
        self.start_wall = 0.0
        self.fps = 0.0
        self.fps_mark = (time.monotonic(), 0)
        self.recent_lag: list[float] = []
        self.last_metrics: dict[str, float] = {}
        self.bad_in_a_row = 0
        # The least exploring actor's games alone (None: the algorithm marks no actor).
        self.marked_stats = EpisodeStats(stats.scores.maxlen) if options.least_exploring_actor is not None else None

    # ------------------------------------------------------------------ progress
    @property
    def elapsed(self) -> float:
        return self.start_wall + time.monotonic() - self.start_time

    @property
    def done(self) -> bool:
        return self.counters.env_steps >= self.options.max_env_steps

    def ingest(self, views: dict[str, np.ndarray], version: int, steps: int, episodes: list,
               actor_id: int | None = None) -> None:
        """One finished rollout: views field -> [time, E, ...] (copied out, the slot may be
        reused), from actor `actor_id` (None: unknown)."""
        envs = views["action"].shape[1]
        lag = self.counters.updates - version
        if self.options.max_policy_lag is not None and lag > self.options.max_policy_lag:
            self.counters.stale_rollouts += 1  # too far off-policy to train on; its steps and games still count
        else:
            # Views into the slot: the batch source copies what it keeps before this returns.
            self.batches.put([{name: view[:, e] for name, view in views.items()} for e in range(envs)], version)
        self.counters.env_steps += steps
        self.counters.rollouts += 1
        marked = self.marked_stats is not None and actor_id == self.options.least_exploring_actor
        extra = {"actor": "" if actor_id is None else actor_id, "least_exploring": int(marked)} \
            if self.marked_stats is not None else {}
        for score, length in episodes:
            self.stats.add(score)
            if marked:
                self.marked_stats.add(score)
            if self.metrics is not None:
                self.metrics.episode(self.counters.env_steps, episode=self.stats.episodes, score=score, length=length,
                                     update=self.counters.updates, wall_time=round(self.elapsed, 3), **extra)

    def train_ready_batches(self, on_update) -> int:
        """Trains on every batch the replays can give; calls on_update(version) after each."""
        trained = 0
        while (ready := self.batches.next_ready()) is not None:
            batch, mixed = ready                                # tensors, herd.replay.mixer.MixedBatch
            metrics = self.learner.step(batch)
            priorities = metrics.pop("priorities", None)        # [B], from algorithms with prioritized replay
            if priorities is not None:
                self.batches.update(mixed.keys, priorities)
            if metrics["skipped"]:
                self.counters.skipped_updates += 1
                self.bad_in_a_row += 1
                log.warning("non-finite loss at update %d: update skipped", self.counters.updates)
                if self.bad_in_a_row >= self.options.max_bad_updates:
                    raise TrainingDiverged(f"{self.bad_in_a_row} non-finite losses in a row: training diverged; "
                                           "the checkpoint keeps the last good weights (try a lower --lr)")
                continue
            self.bad_in_a_row = 0
            self.counters.updates += 1
            self.recent_lag.append(float(np.mean(self.counters.updates - 1 - mixed.versions)))
            self.last_metrics = metrics
            on_update(self.counters.updates)
            trained += 1
            if self.counters.updates % self.options.log_interval == 0:
                self.write_train_metrics()
            if self.counters.updates % self.options.save_model_period == 0:
                self.save()
        self.show_progress()
        return trained

    def write_train_metrics(self) -> None:
        if self.metrics is None:
            return
        now = time.monotonic()
        mark_time, mark_steps = self.fps_mark
        if now > mark_time:
            self.fps = (self.counters.env_steps - mark_steps) / (now - mark_time)
        self.fps_mark = (now, self.counters.env_steps)
        lag = float(np.mean(self.recent_lag)) if self.recent_lag else float("nan")
        self.recent_lag.clear()
        wanted = (*self.options.metric_names, *LEARNER_METRICS)
        values = {k: round(v, 6) for k, v in self.last_metrics.items() if k in wanted}
        values.update(update=self.counters.updates, wall_time=round(self.elapsed, 3), policy_lag=round(lag, 3),
                      fps=round(self.fps, 1), average_score=round(self.stats.average, 3))
        if self.marked_stats is not None:
            values["least_exploring_average"] = round(self.marked_stats.average, 3)
        self.metrics.training(self.counters.env_steps, values)

    def show_progress(self, force: bool = False) -> None:
        run_time = time.monotonic() - self.start_time
        steps = self.counters.env_steps - self.start_steps
        fps = steps / run_time if run_time > 0 else 0.0
        self.progress.update(self.counters.env_steps, fps, self.stats.average, self.elapsed,
                             force=force)

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict:
        state = {
            **self.options.checkpoint_extra,
            "model": self.learner.model.state_dict(),
            "optimizer": self.learner.optimizer.state_dict(),
            "scheduler": self.learner.scheduler.state_dict(),
            "counters": {**self.counters.state_dict(), "wall_time": self.elapsed},
            "stats": self.stats.state_dict(),
            "rng": {"torch": torch.get_rng_state()},
        }
        if self.marked_stats is not None:
            state["least_exploring_stats"] = self.marked_stats.state_dict()
        if hasattr(self.learner.loss_fn, "state_dict"):
            state["loss_state"] = self.learner.loss_fn.state_dict()      # Ape-X: the target network
        if self.options.save_replay:
            state["replay"] = self.batches.replay_state()
        return state

    def save(self) -> Path | None:
        """Writes a checkpoint (the primary process only); returns its path."""
        if not self.options.primary:
            return None
        path = save_checkpoint(self.state_dict(), self.run_dir, self.counters.updates)
        log.debug("checkpoint %s", path)
        return path

    def load_state_dict(self, state: dict, load_optimizer: bool) -> None:
        self.learner.model.load_state_dict(state["model"])  # copies onto the model's device
        if load_optimizer:
            self.learner.optimizer.load_state_dict(state["optimizer"])
            self.learner.scheduler.load_state_dict(state["scheduler"])
        self.counters.load_state_dict(state["counters"])
        self.stats.load_state_dict(state["stats"])
        if self.marked_stats is not None and "least_exploring_stats" in state:
            self.marked_stats.load_state_dict(state["least_exploring_stats"])
        if "loss_state" in state and hasattr(self.learner.loss_fn, "load_state_dict"):
            self.learner.loss_fn.load_state_dict(state["loss_state"])
        torch.set_rng_state(state["rng"]["torch"])
        if "replay" in state:
            self.batches.load_replay_state(state["replay"])
        self.start_steps = self.counters.env_steps
        self.start_wall = self.counters.wall_time
        self.fps_mark = (time.monotonic(), self.counters.env_steps)

    def summary(self) -> dict:
        return {
            "max_reward": self.stats.max_score if self.stats.episodes else None,
            "max_average_score": self.stats.max_average if self.stats.max_average > float("-inf") else None,
            "last_average_score": self.stats.average if self.stats.episodes else None,
            "episodes": self.stats.episodes,
            "training_steps": self.counters.updates,
            "environment_steps": self.counters.env_steps,
            "skipped_updates": self.counters.skipped_updates,
            "stale_rollouts_dropped": self.counters.stale_rollouts,
            "last_lr": self.learner.optimizer.param_groups[0]["lr"],
            **({"least_exploring_actor": self.options.least_exploring_actor,
                "least_exploring_average_score": self.marked_stats.average if self.marked_stats.episodes else None}
               if self.marked_stats is not None else {}),
            "total_time_s": round(self.elapsed, 2),
            **self.options.description,
        }

    def finish(self, reason: str) -> Path | None:
        """However the run ended: the last progress line and metrics row, the final
        checkpoint and summary.json (primary only), then everything closed."""
        try:
            self.show_progress(force=True)
            self.progress.finish()
            if self.counters.updates:
                self.write_train_metrics()  # the last row, whatever the log interval
            path = self.save()
            if self.options.primary:
                write_json(self.run_dir / "summary.json", {**self.summary(), "ended": reason, "checkpoint": str(path)})
        finally:
            if self.metrics is not None:
                self.metrics.close()
            self.batches.close()
        log.info("%s after %d environment steps and %d updates; average score %s; checkpoint %s",
                 reason, self.counters.env_steps, self.counters.updates,
                 format_score(self.stats.average if self.stats.episodes else None), path)
        if self.marked_stats is not None:
            log.info("least exploring actor (%d): average score %s over its last %d games",
                     self.options.least_exploring_actor,
                     format_score(self.marked_stats.average if self.marked_stats.episodes else None),
                     len(self.marked_stats.scores))
        return path
