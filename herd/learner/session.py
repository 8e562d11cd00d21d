"""The learner side of a training run, independent of how actors are run: it ingests
finished rollouts into the replays, trains on every batch that is ready, keeps the
counters and statistics, writes metrics and checkpoints. A backend feeds it rollouts."""
from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Callable

import numpy as np
import torch

from herd.checkpoint import CHECKPOINT_DIR, list_checkpoints
from herd.device_copies import DeviceCopies
from herd.errors import LearnerFailure, ReplayLost, SaveFailed, TrainingDiverged
from herd.files import write_json
from herd.learner.distributed import GroupSync, Tally
from herd.learner.learner import LEARNER_METRICS, Learner
from herd.learner.saver import BackgroundSaver, host_snapshot, write_checkpoint
from herd.monitor.metrics import EPISODE_COLUMNS, RunMetrics
from herd.monitor.progress import ProgressLine, format_score
from herd.monitor.stats import EpisodeStats
from herd.trajectory import TrajectoryLayout

if TYPE_CHECKING:
    from herd.eval_worker import Evaluator
    from herd.learner.loop import RolloutSource
    from herd.models.normalize import ObservationNormalizer

log = logging.getLogger("herd")

# What the session adds to the algorithm's and the learner's metrics in train.csv.
SESSION_METRICS = ("policy_lag", "policy_lag_max", "fps", "average_score")


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
        """Only the fields: herd.checkpoint_state checked the names, and a name such as
        `__dict__` must never become an attribute set here."""
        for item in fields(self):
            if item.name in state:
                setattr(self, item.name, type(getattr(self, item.name))(state[item.name]))


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
    save_model_seconds: float | None = None                # also a checkpoint when this long since the last

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
        self.publishes = 0          # weights handed to the actors this session (once per batch)
        self.batches = batches      # herd.learner.batches' protocol (DirectBatches, PrefetchedBatches, ...)
        self.stats = stats
        self.metrics = metrics      # None in a process that is not the primary one
        self.progress = progress
        self.run_dir = run_dir
        self.saver = BackgroundSaver(run_dir)       # the periodic checkpoints' writer thread
        self.last_save = time.monotonic()           # the last periodic checkpoint (or the start)
        self.options = options
        self.counters = Counters()
        self.start_time = time.monotonic()
        self.start_steps = 0
        self.start_wall = 0.0
        self.fps = 0.0
        self.fps_mark = (time.monotonic(), 0)
        self.recent_lag: list[float] = []       # each batch's mean policy lag (updates), this interval
        self.recent_lag_max = float("nan")      # the oldest rollout's lag this interval
        self.lag_sum, self.lag_batches, self.lag_max = 0.0, 0, float("nan")    # over the session
        # The updates' metrics, summed on the device by the update itself and read once per
        # log interval.
        self.metric_sums = learner.metric_sums
        self.last_metrics: dict[str, float] = {}    # the last interval's means
        self.trained = False        # the first update of this session is logged: warm-up is over
        # The run's processes by role (learner, actor-<i>, inference), kept by the backend
        # as it starts and restarts them: what the hardware monitor measures.
        self.processes: dict[str, int] = {"learner": os.getpid()}
        # Collaborators, each optional and named. The statistics of observation
        # normalisation (herd/models/normalize.py), updated from every fresh rollout's raw
        # observations; they reach the actors with the next weights.
        self.observation_stats: ObservationNormalizer | None = None
        # A GPU learner's copies of rollouts into its replays (herd/device_copies.py): a
        # slot copied from goes back once its copy is done.
        self.device_copies: DeviceCopies | None = None
        self.evaluator: Evaluator | None = None     # herd/eval_worker.py: told of every update
        self.source: RolloutSource | None = None    # herd/learner/loop.py: its summary goes into summary.json
        # With several learners (herd.learner.distributed): what this one counts waits in
        # sync.pending for the next round, and every learner counts every learner's tally
        # from the round, so counters and statistics are the group's totals everywhere.
        self.sync: GroupSync | None = None
        # The least exploring actor's games alone (None: the algorithm marks no actor).
        self.marked_stats = EpisodeStats(stats.scores.maxlen) if options.least_exploring_actor is not None else None

    # ------------------------------------------------------------------ progress
    @property
    def elapsed(self) -> float:
        return self.start_wall + time.monotonic() - self.start_time

    @property
    def done(self) -> bool:
        """The step budget is spent, or (several learners) the group stopped."""
        return self.counters.env_steps >= self.options.max_env_steps or (self.sync is not None and self.sync.stopped)

    def ingest(self, views, version: int, steps: int, episodes: list, actor_id: int | None = None,
               start: int | None = None, on_free: Callable[[], None] | None = None) -> bool:
        """One finished rollout from actor `actor_id` (None: unknown): views field ->
        [time, E, ...]; or, where the replay lives in another process (the Ray backend's
        replay server), the reference to the rollout that its batch source forwards there:
        this process never reads it (validate() refuses the options whose rollout hooks
        would). Returns True if the batch source keeps the views where they are, positions
        start .. start + E - 1 of the slots it reads (herd/replay/slot_queue.py), and calls
        on_free() once it has trained on them, or the copy of them to the device is still
        in flight (on_free() once it is done); False: it copied what it keeps, and the
        caller may reuse the storage now."""
        if self.observation_stats is not None:
            # The statistics are frozen parameters of the learner's model: where readers in
            # other processes share them (a CPU learner's, herd/weights.py adopt), written
            # under the same guard as the optimizer's steps.
            with self.learner.weight_writes():
                self.observation_stats.update_from_rollout(views["obs"])     # obs [T+1, E, ...]
        lag = self.counters.updates - version
        # Too far off-policy to train on; its steps and games still count.
        stale = self.options.max_policy_lag is not None and lag > self.options.max_policy_lag
        kept = False
        if not stale:
            kept = start is not None and self.batches.keep(start, views["action"].shape[1], version, on_free)
            if not kept:
                self.batches.put_rollout(views, version)        # copied, or its copy queued on the device
        if not kept:
            # A copy still in flight reads the slot (the rollout's, or, where an inference
            # server recorded it, its bootstrap frame's): it goes back when that is done.
            kept = on_free is not None and self.device_copies is not None and self.device_copies.release_after(on_free)
        if self.marked_stats is not None:
            # Ape-X marks its least exploring actor's games (one learner: validate() refuses
            # it with several, whose rounds carry (score, length) pairs only).
            marked = actor_id == self.options.least_exploring_actor
            extra = {"actor": "" if actor_id is None else actor_id, "least_exploring": int(marked)}
            for score, _ in episodes if marked else ():
                self.marked_stats.add(score)
            episodes = [(score, length, extra) for score, length in episodes]
        if self.sync is not None:
            self.sync.pending.add(steps, stale, episodes)
        else:
            self.count(Tally(steps, 1, int(stale), list(episodes)))
        return kept

    def count(self, tally: Tally) -> None:
        """Adds one learner's steps, rollouts and finished games to the counters and statistics.
        A game is (score, length) or, marked by the algorithm, (score, length, extra columns)."""
        self.counters.env_steps += tally.env_steps
        self.counters.rollouts += tally.rollouts
        self.counters.stale_rollouts += tally.stale
        for score, length, *extra in tally.episodes:
            self.stats.add(score)
            if self.metrics is not None:
                self.metrics.episode(self.counters.env_steps, episode=self.stats.episodes, score=score, length=length,
                                     update=self.counters.updates, wall_time=round(self.elapsed, 3),
                                     **(extra[0] if extra else {}))

    def train_ready_batches(self, on_update) -> int:
        """Trains on every batch the replays can give; calls on_update(version) after each."""
        if self.device_copies is not None:
            self.device_copies.release_done()       # the slots whose copies to the device are done
        trained = 0
        while (ready := self.batches.next_ready()) is not None:
            if self.sync is not None and self.done:
                # Every learner knows the budget is spent after the same round and stops
                # there; one more step would wait for learners that have left.
                self.batches.give_back(ready[1])
                break
            batch, mixed = ready                                # tensors, herd.replay.mixer.MixedBatch
            self.learner.loss_fn.expect_batch(mixed.reuse_key)  # IMPACT: target outputs once per stored batch
            result = self.learner.step(batch)                   # device tensors: nothing read here
            # A lent batch (a CPU learner's, read in place: herd/learner/batches.py) goes back
            # to the queue; the CPU step is done with it when step() returns.
            self.batches.give_back(mixed)
            if self.sync is not None:
                self.count_received()
                if result.stopped:
                    break                                       # the group stopped: this batch is not used
            if result.priorities is not None:                   # [B], from algorithms with prioritized replay
                # Handed over as a tensor: a replay in device memory takes it there, a host
                # replay (or the replay server) reads it back (herd/replay/prioritized.py).
                self.batches.update(mixed.keys, result.priorities.detach())
            # A skipped update (non-finite loss, gradient or weights) changed nothing; they
            # are counted on the device, and the run of them read from an asynchronous copy.
            if self.metric_sums.latest_skip_run() >= self.options.max_bad_updates:
                self.read_metric_sums()
                raise TrainingDiverged(f"{self.options.max_bad_updates} non-finite losses in a row: training "
                                       "diverged; the checkpoint keeps the last good weights (try a lower --lr)")
            self.counters.updates += 1
            if not self.trained:
                # When the replays' warm-up ended; a run that waits for it (tests, a user
                # tailing log.txt) sees it at once, not at the next metrics flush.
                self.trained = True
                log.info("first update (update %d) after %d environment steps", self.counters.updates,
                         self.counters.env_steps)
            lags = self.counters.updates - 1 - np.asarray(mixed.versions)         # [B] updates behind
            self.recent_lag.append(float(lags.mean()))
            self.recent_lag_max = float(np.nanmax([self.recent_lag_max, lags.max()]))
            self.lag_sum, self.lag_batches = self.lag_sum + self.recent_lag[-1], self.lag_batches + 1
            self.lag_max = float(np.nanmax([self.lag_max, lags.max()]))
            if mixed.last_pass:
                # Once per batch: a batch served K times (IMPACT's circular buffer) publishes
                # after its last pass only.
                on_update(self.counters.updates)
                self.publishes += 1
            if self.evaluator is not None:
                self.evaluator.on_update(self.learner.model, self.counters.updates, self.counters.env_steps)
            trained += 1
            if self.counters.updates % self.options.log_interval == 0:
                self.write_train_metrics()
            if self.checkpoint_due():
                self.save_in_background()
            self.saver.check()                                  # a background write that failed ends the run
        self.show_progress()
        return trained

    def read_metric_sums(self) -> None:
        """The one host read of a log interval: the interval's metric means, and the
        skipped updates added to the counters."""
        if self.metric_sums.updates == 0:
            return
        means, skipped, _ = self.metric_sums.read()
        self.last_metrics = means
        if skipped:
            self.counters.skipped_updates += skipped
            log.warning("%d of the last updates skipped (non-finite loss, gradient or weights) up to update %d",
                        skipped, self.counters.updates)

    def write_train_metrics(self) -> None:
        self.read_metric_sums()
        if self.metrics is None:
            return
        now = time.monotonic()
        mark_time, mark_steps = self.fps_mark
        if now > mark_time:
            self.fps = (self.counters.env_steps - mark_steps) / (now - mark_time)
        self.fps_mark = (now, self.counters.env_steps)
        lag = float(np.mean(self.recent_lag)) if self.recent_lag else float("nan")
        lag_max, self.recent_lag_max = self.recent_lag_max, float("nan")
        self.recent_lag.clear()
        wanted = (*self.options.metric_names, *LEARNER_METRICS)
        values = {k: round(v, 6) for k, v in self.last_metrics.items() if k in wanted}   # the interval's means
        values.update(update=self.counters.updates, wall_time=round(self.elapsed, 3), policy_lag=round(lag, 3),
                      policy_lag_max=lag_max,
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
        loss_state = self.learner.loss_fn.state_dict()                  # a target network, or None
        if loss_state is not None:
            state["loss_state"] = loss_state
        if self.options.save_replay:
            replay = self.batches.replay_state()
            if replay is not None:      # None: a replay server that never started (herd/learner/batches.py)
                state["replay"] = replay
        return state

    def save(self) -> Path | None:
        """Writes a checkpoint now, on this thread, after any still being written in the
        background (the primary process only); returns its path. Raises SaveFailed (one
        line, naming the checkpoint that is kept) when a write fails."""
        if not self.options.primary:
            return None
        self.saver.wait()
        # Copied as the periodic checkpoints are: each tensor in a storage of its own (a CPU
        # learner's parameters are views of the actors' shared vector, herd/weights.py adopt).
        return write_checkpoint(host_snapshot(self.state_dict()), self.run_dir, self.counters.updates)

    def checkpoint_due(self) -> bool:
        """Every save_model_period updates, and (--save_model_seconds) once that long has
        passed since the last checkpoint of this session."""
        seconds = self.options.save_model_seconds
        return (self.counters.updates % self.options.save_model_period == 0
                or (seconds is not None and time.monotonic() - self.last_save >= seconds))

    def save_in_background(self) -> None:
        """The periodic checkpoint: the state as of this update, snapshotted here and
        written by the saver's thread (herd/learner/saver.py) while training goes on."""
        self.last_save = time.monotonic()
        if self.options.primary:
            self.saver.offer(host_snapshot(self.state_dict()), self.counters.updates)

    def load_state_dict(self, state: dict, load_optimizer: bool, fresh_replay: bool = True) -> None:
        """fresh_replay=False: the saved queue (fresh trajectories) is not loaded (see
        ReplayMixer.load_state_dict)."""
        self.learner.model.load_state_dict(state["model"])  # copies onto the model's device
        if load_optimizer:
            self.learner.optimizer.load_state_dict(state["optimizer"])
            self.learner.scheduler.load_state_dict(state["scheduler"])
        self.counters.load_state_dict(state["counters"])
        self.stats.load_state_dict(state["stats"])
        if self.marked_stats is not None and "least_exploring_stats" in state:
            self.marked_stats.load_state_dict(state["least_exploring_stats"])
        if "loss_state" in state:
            self.learner.loss_fn.load_state_dict(state["loss_state"])
        torch.set_rng_state(state["rng"]["torch"])
        if "replay" in state:
            self.batches.load_replay_state(state["replay"], fresh_replay)
        self.start_steps = self.counters.env_steps
        self.start_wall = self.counters.wall_time
        self.fps_mark = (time.monotonic(), self.counters.env_steps)

    def end_rounds(self) -> None:
        """Several learners: a learner that stops before the group knows (Ctrl+C, a failure)
        votes stop in one last round, and every learner drains the episodes still held
        (the same rounds on every learner: each decides from the same rows)."""
        sync = self.sync
        if sync is None or sync.broken:
            return
        try:
            if not sync.stopped and not self.counters.env_steps >= self.options.max_env_steps:
                sync.exchange(with_gradients=False, stop=True)
                self.count_received()
            while sync.more:
                sync.exchange(with_gradients=False, stop=True)
                self.count_received()
        except LearnerFailure as err:
            log.error("%s", err)

    def count_received(self) -> None:
        for tally in self.sync.take_received():
            self.count(tally)

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
            "weights_published": self.publishes,
            # Updates between the weights that made a trained rollout and the update training it.
            "policy_lag_mean": round(self.lag_sum / self.lag_batches, 3) if self.lag_batches else None,
            "policy_lag_max": None if self.lag_max != self.lag_max else self.lag_max,
            "last_lr": float(self.learner.scheduler.lr),
            **({"least_exploring_actor": self.options.least_exploring_actor,
                "least_exploring_average_score": self.marked_stats.average if self.marked_stats.episodes else None}
               if self.marked_stats is not None else {}),
            "total_time_s": round(self.elapsed, 2),
            **self.options.description,
            **({"evaluator_restarts": self.evaluator.restarts} if self.evaluator is not None else {}),
            **(self.source.summary() if self.source is not None else {}),
        }

    def use_batches(self, batches) -> None:
        """Another batch source from now on (the Ray backend's replay server takes over
        from the stand-in that held the checkpoint's replay, and hands back its last state
        at the end); the previous one is closed."""
        previous, self.batches = self.batches, batches
        previous.close()

    def finish(self, reason: str, failed_save: Exception | None = None) -> bool:
        """However the run ended: the last progress line and metrics row, the final
        checkpoint and summary.json (primary only), then everything closed. Writes what
        it can: a failed write (a full disk) is one logged line, not an exception, and
        the summary says what was saved. failed_save: the save that ended the run (it was
        logged; trying again would only write another doomed temporary file), or what made
        a final checkpoint impossible (ReplayLost: the replay server died with the replay).
        Returns whether everything was written."""
        self.end_rounds()   # several learners: the group's last round, so the totals below agree
        self.show_progress(force=True)
        self.progress.finish()
        failures: list[str] = [str(failed_save)] if failed_save else []
        path = None
        if self.counters.updates and self.metrics is not None:
            self.attempt(failures, "train.csv", self.write_train_metrics)  # the last row, whatever the log interval
        self.read_metric_sums()                       # the skipped updates, also without metric files
        try:
            path = self.save() if failed_save is None else None     # after the periodic one in flight
        except (SaveFailed, ReplayLost) as err:      # ReplayLost: the replay server died with the replay
            failures.append(str(err))
            log.error("%s", err)
        self.saver.close()
        if path is None and self.options.primary:
            kept = list_checkpoints(self.run_dir / CHECKPOINT_DIR)
            path = kept[0] if kept else None
        if self.metrics is not None:
            self.attempt(failures, "the metric files", self.metrics.close)
        self.batches.close()
        if self.options.primary:
            summary = {**self.summary(), "ended": reason, "checkpoint": str(path) if path else None}
            if failures:
                summary["write_failures"] = failures
            self.attempt(failures, "summary.json", lambda: write_json(self.run_dir / "summary.json", summary))
        log.info("%s after %d environment steps and %d updates; average score %s; checkpoint %s",
                 reason, self.counters.env_steps, self.counters.updates,
                 format_score(self.stats.average if self.stats.episodes else None), path)
        if self.marked_stats is not None:
            log.info("least exploring actor (%d): average score %s over its last %d games",
                     self.options.least_exploring_actor,
                     format_score(self.marked_stats.average if self.marked_stats.episodes else None),
                     len(self.marked_stats.scores))
        return not failures

    @staticmethod
    def attempt(failures: list, what: str, write) -> None:
        """Runs one write of finish(); an OSError becomes one logged line."""
        try:
            write()
        except OSError as err:
            message = f"cannot write {what}: {' '.join(str(err).split())}"
            failures.append(message)
            log.error("%s", message)
