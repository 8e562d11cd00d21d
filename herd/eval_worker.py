"""The evaluation worker: a process beside training that plays whole games with the
newest weights at a fixed interval, with the test wrappers (no episodic life, unclipped
rewards), and writes eval.csv, TensorBoard scalars (`eval/`) and, every Kth evaluation, a
short video (`eval_videos/` in the run folder; in TensorBoard too where moviepy, which its
video encoder needs, is installed).

Scheduling stays in the learner's process (`Evaluator.on_update`, called after every
update): when an evaluation is due and the worker is idle, it publishes the weights once
into the worker's own shared memory; the worker waits for a new version, evaluates it,
and goes back to waiting. So training never waits for an evaluation, a slow evaluation
only skips the ones that came due meanwhile, and the worker runs at a low CPU priority:
on a small machine its games take what training leaves (benchmarks/eval_overhead.py).

So on a busy machine the worker may not get a core until training ends. A run that
finishes (not one that is stopped) therefore waits, up to FINISH_TIMEOUT_S, for the
evaluation that came due last: the run's final report has the weights it asked about."""
from __future__ import annotations

import csv
import logging
import multiprocessing
import os
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from herd.envs.render_gl import choose_mujoco_gl
from herd.evaluation import play_episodes, quiet_sdl, render_episodes
from herd.models import build_model
from herd.stopping import sigint_blocked
from herd.weights import PublisherGone, SharedWeights

log = logging.getLogger("herd")

EVAL_COLUMNS = ["evaluation", "update", "env_step", "wall_time", "mean", "std", "min", "max", "episodes", "greedy"]
VIDEO_GAMES, VIDEO_FRAMES = 1, 2000
POLL_S = 0.2
CRASHED = 3          # the worker's exit code when an evaluation raised
MAX_RESTARTS = 5     # then evaluation stops for the rest of the run (training goes on)
NICENESS = 19        # where SCHED_IDLE is not offered: the lowest priority there is
FINISH_TIMEOUT_S = 300.0   # a finished run waits at most this long for its last due evaluation
# The worker's stop flag: run on, finish what was published then end, or end now.
RUN, FINISH, STOP_NOW = 0, 1, 2


@dataclass(frozen=True)
class EvalSpec:
    """What the worker needs, unpacked from the config by the caller."""
    env_id: str
    env_kwargs: dict            # the test wrappers: episodic_life False, clip_rewards False
    model_kwargs: dict
    episodes: int
    greedy: bool
    video_every: int            # a video every Kth evaluation; 0: never
    seed: int
    tensorboard: bool = True    # eval/ scalars (and videos) in the run's TensorBoard folder
    policy: tuple | None = None  # (algorithm, test-act kwargs) where the algorithm acts its own way (Ape-X)
    num_envs: int = 4


def write_row(path: Path, row: dict) -> None:
    new = not path.exists()
    with open(path, "a", newline="") as f:
        writer = csv.writer(f)
        if new:
            writer.writerow(EVAL_COLUMNS)
        writer.writerow([row.get(c, "") for c in EVAL_COLUMNS])


def tensorboard_video(writer, path: Path, update: int) -> None:
    """The MP4's frames into TensorBoard, where its video encoder (moviepy) is installed."""
    try:
        import imageio.v2 as imageio
        import moviepy  # noqa: F401  (torch's add_video needs it)
    except ImportError:
        return
    frames = np.stack(imageio.mimread(path, memtest=False))[None]            # [1, T, H, W, C]
    writer.add_video("eval/video", torch.from_numpy(frames).permute(0, 1, 4, 2, 3), update, fps=15)


def yield_to_training() -> None:
    """The worker takes only CPU time that training leaves. Linux's SCHED_IDLE runs it only
    on a core that would otherwise idle, and an actor or the learner that wakes up takes
    the core back at once; a merely niced process (nice 10, as before) keeps the core for
    the rest of its time slice: with it, Pong training ran 44% slower on 2 cores
    (benchmarks/eval_overhead.py, README). Elsewhere: the lowest nice value."""
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
        return
    except (AttributeError, OSError):
        pass
    try:
        os.nice(NICENESS)
    except OSError:
        pass


def run_evaluations(spec: EvalSpec, weights: SharedWeights, env_steps, run_dir: Path, stop, evaluated) -> None:
    """The worker process's body. `evaluated`: the version of the last evaluation written."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)     # the learner's process decides when to stop
    yield_to_training()
    quiet_sdl(display=False)
    choose_mujoco_gl(display=False)                # MuJoCo: EGL or OSMesa (herd/envs/render_gl.py)
    torch.set_num_threads(1)
    model = build_model(**spec.model_kwargs)
    model.eval()
    writer = None
    if spec.tensorboard:
        from torch.utils.tensorboard import SummaryWriter
        writer = SummaryWriter(log_dir=str(run_dir / "tensorboard"), filename_suffix=".eval")
    start, seen, evaluation = time.monotonic(), -1, 0
    parent = multiprocessing.parent_process()
    try:
        # A learner killed outright (kill -9, the OOM killer) never sets `stop`: without
        # the parent check this process would poll for new weights forever.
        while stop.value != STOP_NOW and (parent is None or parent.is_alive()):
            if weights.version == seen:
                if stop.value == FINISH:
                    break
                time.sleep(POLL_S)
                continue
            try:
                seen = weights.pull(model, seen)
            except PublisherGone:
                break                       # the learner died inside a publish: the run is gone
            steps = int(env_steps.value)
            evaluation += 1
            try:
                scores = play_episodes(model, spec.env_id, spec.env_kwargs, spec.episodes, spec.num_envs,
                                       spec.seed + 1000 * evaluation, greedy=spec.greedy, policy=spec.policy)
            except Exception as err:  # a crashed env: end this process; the Evaluator starts a new one
                print(f"[herd] evaluation {evaluation} failed ({type(err).__name__}: {err}): the worker ends "
                      "and is restarted", file=sys.stderr, flush=True)
                raise SystemExit(CRASHED) from None
            row = {"evaluation": evaluation, "update": seen, "env_step": steps,
                   "wall_time": round(time.monotonic() - start, 2), "mean": float(np.mean(scores)),
                   "std": float(np.std(scores)), "min": float(np.min(scores)), "max": float(np.max(scores)),
                   "episodes": len(scores), "greedy": spec.greedy}
            write_row(run_dir / "eval.csv", row)
            for name in ("mean", "min", "max") if writer is not None else ():
                writer.add_scalar(f"eval/{name}", row[name], steps)
            if spec.video_every and evaluation % spec.video_every == 0:
                folder = run_dir / "eval_videos"
                folder.mkdir(exist_ok=True)
                video = render_episodes(model, spec.env_id, spec.env_kwargs, spec.seed + evaluation,
                                        folder / f"eval_{seen:08d}.mp4", greedy=spec.greedy, games=VIDEO_GAMES,
                                        max_frames=VIDEO_FRAMES, window=False, policy=spec.policy)
                if video is not None and writer is not None:
                    tensorboard_video(writer, video, steps)
            if writer is not None:
                writer.flush()
            evaluated.value = seen
    finally:
        if writer is not None:
            writer.close()


class Evaluator:
    """The learner-side half: starts the worker, publishes weights when an evaluation is
    due and the worker waits for them, stops it."""

    def __init__(self, spec: EvalSpec, model: torch.nn.Module, run_dir: Path, every_updates: int | None,
                 every_seconds: float | None, context, on_restart=None):
        """on_restart(pid): told the new worker's pid after a restart (process registry)."""
        self.spec, self.run_dir, self.context = spec, run_dir, context
        self.every_updates, self.every_seconds = every_updates, every_seconds
        self.weights = SharedWeights(model, context)
        self.weights.publish(model, version=-1)          # nothing to evaluate until the first is due
        self.env_steps = context.Value("q", 0, lock=False)
        # A plain shared flag, not an Event: a worker killed while waiting on an Event's
        # condition would leave set() waiting forever for it to acknowledge the wake-up.
        self.stop = context.Value("b", RUN, lock=False)
        self.evaluated = context.Value("q", -1, lock=False)   # written by the worker
        self.last_update, self.last_time = 0, time.monotonic()
        self.restarts, self.on_restart = 0, on_restart
        self.process = self.start_worker()

    def start_worker(self):
        process = self.context.Process(target=run_evaluations, name="herd-eval", daemon=True,
                                       args=(self.spec, self.weights, self.env_steps, self.run_dir, self.stop,
                                             self.evaluated))
        with sigint_blocked():           # Ctrl+C is for the learner's process to handle
            process.start()
        return process

    def running(self) -> bool:
        """True while a worker runs; a dead one is restarted (counted) up to MAX_RESTARTS."""
        if self.process.is_alive():
            return True
        if self.restarts >= MAX_RESTARTS:
            return False
        self.restarts += 1
        log.warning("the evaluation worker ended (exit code %s): restart %d of at most %d",
                    self.process.exitcode, self.restarts, MAX_RESTARTS)
        if self.restarts == MAX_RESTARTS:
            log.warning("evaluation stops after this restart if the worker ends again; training goes on")
        self.process = self.start_worker()
        if self.on_restart is not None:
            self.on_restart(self.process.pid)
        return True

    def due(self, updates: int) -> bool:
        if self.every_updates is not None:
            return updates - self.last_update >= self.every_updates
        return time.monotonic() - self.last_time >= self.every_seconds

    def on_update(self, model: torch.nn.Module, updates: int, env_steps: int) -> None:
        """After every update; costs a comparison unless an evaluation is due."""
        if not self.due(updates) or not self.running():
            return
        self.last_update, self.last_time = updates, time.monotonic()
        self.env_steps.value = env_steps
        self.weights.publish(model, version=updates)     # a busy worker takes the newest when done

    def close(self, finished: bool = False, interrupted=None, timeout: float = 5.0) -> None:
        """Ends the worker. finished: the run ended by itself, so the worker first completes
        the evaluation that came due last (up to FINISH_TIMEOUT_S, or until `interrupted`,
        an Event, is set); otherwise (a stop, a failure) it ends now."""
        if finished and self.process.is_alive() and self.evaluated.value < self.weights.version:
            log.info("waiting (at most %.0f s) for the evaluation of update %d", FINISH_TIMEOUT_S,
                     self.weights.version)
            self.stop.value = FINISH
            deadline = time.monotonic() + FINISH_TIMEOUT_S
            while self.process.is_alive() and time.monotonic() < deadline:
                if interrupted is not None and interrupted.is_set():
                    break
                self.process.join(POLL_S)
            if self.process.is_alive():
                log.warning("the last evaluation did not finish: it is not in eval.csv")
        self.stop.value = STOP_NOW
        self.process.join(timeout)
        if self.process.is_alive():                      # in the middle of a long game
            self.process.terminate()
            self.process.join(2.0)
