"""Test mode: play `test_episode_count` episodes with a saved policy and report the
whole-game scores (mean, std, min, max, and every score). With --render, show a window
where a display exists, otherwise record an MP4 of the first episodes into the run folder.

Rendering runs in its own process with its own environment, so a window paced at the
game's speed, or the video encoder, does not hold back the games that make the statistics."""
from __future__ import annotations

import logging
import logging.handlers
import multiprocessing as mp
import os
import signal
import sys
import time
from pathlib import Path

import numpy as np
import torch

from herd.algos import get_algorithm
from herd.envs import env_kind, make_env
from herd.envs.render_gl import choose_mujoco_gl
from herd.envs.wrappers import env_action
from herd.files import write_json
from herd.models import EnvCoreStates, action_distribution_of, build_model
from herd.ops.distributions import Categorical, get_distribution
from herd.plan import Plan, env_kwargs, plays_greedily, test_policy_of
from herd.stopping import sigint_blocked

log = logging.getLogger("herd")

VIDEO_EPISODES = 3
VIDEO_MAX_FRAMES = 5000
MAX_TEST_ENVS = 8
ATARI_FPS = 60          # the emulator's frame rate; one agent step is `skipped_frames` of them


class ProgressBar:
    """`episodes done/total` on stderr: redrawn in place on a terminal, a line every 5 s
    otherwise (a log file or CI output must not fill with carriage returns)."""

    def __init__(self, total: int, stream=None):
        self.total = total
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()
        self.start = self.last = time.monotonic()
        self.done = 0

    def update(self, scores: list[float], force: bool = False) -> None:
        self.done = done = len(scores)
        now = time.monotonic()
        if not force and now - self.last < (0.2 if self.tty else 5.0):
            return
        self.last = now
        filled = int(30 * done / self.total)
        mean = f", mean {np.mean(scores):.1f}" if scores else ""
        line = (f"test [{'#' * filled}{'.' * (30 - filled)}] {done}/{self.total} episodes{mean}, "
                f"{now - self.start:.0f}s")
        self.stream.write(("\r" + line + ("\n" if force else "")) if self.tty else line + "\n")
        self.stream.flush()


def act(model, obs: np.ndarray, greedy: bool = False, policy: tuple[str, dict] | None = None,
        memory: tuple[EnvCoreStates, list[int]] | None = None) -> np.ndarray:
    """Actions [E] for a batch of observations [E, ...]: sampled from the stochastic policy,
    or with `greedy` its most probable action (continuous: [E, A], the Gaussian's mean);
    with policy = (algorithm, its test_act_kwargs), the algorithm's own act (Ape-X:
    epsilon-greedy on the Q values). memory = (states, env ids of the rows): an LSTM
    core's per-game states, carried on."""
    with torch.no_grad():
        x = torch.from_numpy(obs).unsqueeze(0)
        out = model(x) if memory is None else memory[0].step(model, x, np.asarray(memory[1]))[0]
        if policy is not None:
            name, kwargs = policy
            return get_algorithm(name).act(out, None, **kwargs)[0].numpy()
        logits = out.logits[0]                                              # [E, A]
        dist = get_distribution(action_distribution_of(model))
        if dist is not Categorical:     # continuous: the Gaussian's mean, or a sample [E, A]
            return (dist.mode(logits) if greedy else dist.sample(logits, None)).numpy()
        if greedy:
            return logits.argmax(-1).numpy()
        return torch.multinomial(torch.softmax(logits, -1), 1).squeeze(1).numpy()


def split_episodes(episodes: int, num_envs: int) -> list[int]:
    """Each env's fixed share of the episodes. Keeping the first N games to end instead
    would over-count short games (for CartPole, the failures) and bias the mean."""
    num_envs = max(1, min(num_envs, episodes))
    return [episodes // num_envs + (i < episodes % num_envs) for i in range(num_envs)]


def play_episodes(model, env_id: str, env_kwargs: dict, episodes: int, num_envs: int, seed: int,
                  progress: ProgressBar | None = None, greedy: bool = False,
                  policy: tuple[str, dict] | None = None) -> list[float]:
    """Whole-game scores (info["episode_score"]) of `episodes` games, played by up to
    `num_envs` envs in lockstep so that one forward pass serves all of them. An LSTM core's
    state is carried from step to step of each env and zeroed where its episode ends
    (terminated or truncated: as in training, where a lost life with episodic life ends one)."""
    left = split_episodes(episodes, num_envs)
    envs = [make_env(env_id, seed=seed + i, **env_kwargs) for i in range(len(left))]
    states = EnvCoreStates.for_model(model, len(envs))
    scores: list[float] = []
    try:
        obs = [env.reset()[0] for env in envs]
        while active := [i for i, n in enumerate(left) if n > 0]:
            actions = act(model, np.stack([obs[i] for i in active]), greedy, policy,
                          memory=None if states is None else (states, active))
            for i, action in zip(active, actions):
                obs[i], _, terminated, truncated, info = envs[i].step(env_action(action))
                if "episode_score" in info:          # the real game ended (not just a life)
                    scores.append(float(info["episode_score"]))
                    left[i] -= 1
                    if progress:
                        progress.update(scores)
                if terminated or truncated:
                    if states is not None:
                        states.begin([i], [True])   # the next episode starts from a zero state
                    if left[i] > 0:
                        obs[i], _ = envs[i].reset()
    finally:
        for env in envs:
            env.close()
    return scores


def has_display() -> bool:
    return bool(os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY"))


def first_line(err: Exception) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


def open_render_env(env_id: str, env_kwargs: dict, seed: int, window: bool = True):
    """(env, mode, first observation, first frame): a window where a display exists,
    otherwise (or when the window cannot open) frames for a video. None if neither works,
    e.g. CartPole's renderer without pygame; that costs one warning line, not the test."""
    failures = []
    for mode in (["human"] if window and has_display() else []) + ["rgb_array"]:
        env = None
        try:
            env = make_env(env_id, seed=seed, render_mode=mode, **env_kwargs)
            obs, _ = env.reset()
            frame = env.render() if mode == "rgb_array" else None
            if mode == "rgb_array" and frame is None:
                raise RuntimeError("the environment returned no frame")
            if failures:
                log.warning("no window (%s): recording a video instead", failures[0])
            return env, mode, obs, frame
        except Exception as err:  # a missing renderer or display must not stop the test
            failures.append(f"{mode}: {first_line(err)}")
            if env is not None:
                env.close()
    log.warning("cannot render %s (%s): playing without video", env_id, "; ".join(failures))
    return None


def even_sized(frame) -> np.ndarray:
    """H.264 in yuv420p needs even sides: pad by one black row/column where needed."""
    frame = np.asarray(frame, dtype=np.uint8)
    pad = [(0, frame.shape[0] % 2), (0, frame.shape[1] % 2)] + [(0, 0)] * (frame.ndim - 2)
    return np.pad(frame, pad) if any(p[1] for p in pad[:2]) else frame


def render_episodes(model, env_id: str, env_kwargs: dict, seed: int, video_path: Path,
                    scoring_done=None, greedy: bool = False, games: int = VIDEO_EPISODES,
                    max_frames: int = VIDEO_MAX_FRAMES, window: bool = True,
                    policy: tuple[str, dict] | None = None) -> Path | None:
    """Records the first `games` games (at most `max_frames` steps) to `video_path`, or
    shows them in a window (where a display exists and `window`); a window closes once
    `scoring_done` is set and it has shown one whole game, since it plays at the game's
    speed. Returns the video's path, or None."""
    opened = open_render_env(env_id, env_kwargs, seed, window)
    if opened is None:
        return None
    env, mode, obs, frame = opened
    states = EnvCoreStates.for_model(model, 1)       # None: feed-forward
    writer = None
    episodes = frames = 0
    try:
        if mode == "rgb_array":
            import imageio.v2 as imageio
            fps = (ATARI_FPS / env_kwargs.get("skipped_frames", 4) if env_kind(env_id) == "atari"
                   else env.metadata.get("render_fps") or 30)
            writer = imageio.get_writer(video_path, fps=fps, macro_block_size=1)
            writer.append_data(even_sized(frame))
        while episodes < games and frames < max_frames:
            if writer is None and episodes and scoring_done is not None and scoring_done.is_set():
                break
            memory = None if states is None else (states, [0])
            obs, _, terminated, truncated, info = env.step(env_action(act(model, obs[None], greedy, policy, memory)[0]))
            frames += 1
            if writer is not None:
                writer.append_data(even_sized(env.render()))   # human mode draws inside step()
            episodes += "episode_score" in info
            if terminated or truncated:
                obs, _ = env.reset()
                if states is not None:
                    states.begin([0], [True])
    except Exception as err:  # e.g. the encoder failing: the scores still matter more
        log.warning("rendering stopped (%s)", first_line(err))
        if writer is not None:
            writer.close()
            video_path.unlink(missing_ok=True)   # a half-written MP4 is not a video
        return None
    finally:
        env.close()
    if writer is None:
        return None
    writer.close()
    return video_path


def quiet_sdl(display: bool) -> None:
    """Keeps SDL from probing devices this process does not use. Classic-control renderers
    call pygame.init() even for rgb_array frames, which starts every SDL subsystem: with no
    display its video probe tries Wayland ("error: XDG_RUNTIME_DIR is invalid or not set")
    and its audio probe ALSA, each printing to stderr. Frames are drawn on in-memory
    surfaces and nothing plays sound, so the dummy drivers lose nothing. Only in the render
    process (its own environment, spawned) and only where the user chose no driver."""
    os.environ.setdefault("SDL_AUDIODRIVER", "dummy")
    if not display:                                 # a window needs the real video driver
        os.environ.setdefault("SDL_VIDEODRIVER", "dummy")


def render_process(log_queue, result_conn, model_kwargs: dict, weights: dict, env_id: str, env_kwargs: dict,
                   seed: int, video_path: Path, scoring_done, greedy: bool = False,
                   policy: tuple[str, dict] | None = None) -> None:
    """The render process's body; its warnings reach the parent's log through `log_queue`."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)   # Ctrl+C reaches the whole group; the parent ends us
    quiet_sdl(has_display())
    choose_mujoco_gl(has_display())                # MuJoCo: EGL or OSMesa when headless
    log.handlers[:] = [logging.handlers.QueueHandler(log_queue)]
    log.setLevel(logging.INFO)
    log.propagate = False
    torch.set_num_threads(1)
    model = build_model(**model_kwargs)
    model.load_state_dict({k: torch.from_numpy(v) for k, v in weights.items()})
    model.eval()
    try:
        result = render_episodes(model, env_id, env_kwargs, seed, video_path, scoring_done, greedy,
                                 policy=policy)
    except Exception as err:  # never let the window or video take the test down
        log.warning("rendering failed (%s)", first_line(err))
        result = None
    result_conn.send(str(result) if result else None)


class Renderer:
    """render_episodes in its own process, beside the scoring games. A process, not a thread:
    ALE paces its window inside native code that holds the GIL, which stalled the scoring."""

    def __init__(self, model_kwargs: dict, state_dict: dict, env_id: str, env_kwargs: dict, seed: int,
                 video_path: Path, greedy: bool = False, policy: tuple[str, dict] | None = None):
        context = mp.get_context("spawn")   # as herd's actors: no fork of a process running torch threads
        self.video_path = video_path
        self.log_queue = context.Queue()
        self.listener = logging.handlers.QueueListener(self.log_queue, *log.handlers)
        self.result_conn, child_conn = context.Pipe(duplex=False)
        self.scoring_done = context.Event()
        weights = {k: v.detach().cpu().numpy() for k, v in state_dict.items()}
        self.process = context.Process(target=render_process, name="herd-render", daemon=True,
                                       args=(self.log_queue, child_conn, model_kwargs, weights, env_id,
                                             env_kwargs, seed, video_path, self.scoring_done, greedy, policy))
        self.listener.start()
        with sigint_blocked():   # Ctrl+C reaches the group: the child must never see it
            self.process.start()
        child_conn.close()   # so that recv() sees EOF if the child dies without answering

    def finish(self) -> Path | None:
        """Waits for the video (or the window's first game); returns the video's path or None."""
        self.scoring_done.set()
        result = None
        try:
            result = self.result_conn.recv()
        except EOFError:
            log.warning("the render process ended without a result (exit code %s)", self.process.exitcode)
        self.process.join()
        self.listener.stop()
        return Path(result) if result else None

    def abort(self) -> None:
        self.process.terminate()
        self.process.join()
        self.listener.stop()
        self.video_path.unlink(missing_ok=True)


def summarize(scores: list[float]) -> dict:
    return {"episode_count": len(scores), "mean": float(np.mean(scores)), "std": float(np.std(scores)),
            "min": float(np.min(scores)), "max": float(np.max(scores)), "episodes": scores}


def test_policy(plan: Plan, run_dir: Path) -> int:
    cfg = plan.cfg
    model = build_model(**plan.model_kwargs)
    model.load_state_dict(plan.checkpoint["model"])
    model.eval()
    torch.set_num_threads(max(1, cfg.train.learner_thread_count or 1))
    count = cfg.test.test_episode_count
    kwargs = env_kwargs(cfg)
    policy = test_policy_of(plan)
    # Its own seed: the rendered games are extra, not among the scored ones.
    renderer = Renderer(plan.model_kwargs, plan.checkpoint["model"], cfg.env.env, kwargs,
                        cfg.general.seed + MAX_TEST_ENVS, run_dir / "test_video.mp4",
                        greedy=cfg.test.test_greedy, policy=policy) if cfg.test.render else None
    progress = ProgressBar(count)
    try:
        scores = play_episodes(model, cfg.env.env, kwargs, count, MAX_TEST_ENVS, cfg.general.seed, progress,
                               greedy=cfg.test.test_greedy, policy=policy)
    except BaseException as err:
        if renderer is not None:
            renderer.abort()      # failing or interrupted: do not wait for the rendered games
        if isinstance(err, KeyboardInterrupt):
            log.warning("test interrupted after %d of %d games: no results written", progress.done, count)
            return 130
        raise
    progress.update(scores, force=True)
    video = None
    if renderer is not None:
        try:
            video = renderer.finish()
        except KeyboardInterrupt:  # the scores are complete: keep them, drop the unfinished video
            renderer.abort()
            log.warning("rendering interrupted: results saved without a video")
    result = {**summarize(scores), "greedy": plays_greedily(plan, cfg.test.test_greedy),
              "checkpoint": str(plan.checkpoint_path),
              "video": str(video) if video else None,
              **({"policy": f"{policy[0]} {policy[1]}"} if policy else {})}
    write_json(run_dir / "test_results.json", result)
    print(f"test: {len(scores)} episodes, mean {result['mean']:.2f} ± {result['std']:.2f}, "
          f"min {result['min']:.2f}, max {result['max']:.2f}" + (f"; video {video}" if video else ""))
    return 0
