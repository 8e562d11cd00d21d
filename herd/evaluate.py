"""Test mode: play `test_episode_count` episodes with a saved policy and report the
whole-game scores (mean, std, min, max). With --render, show a window where a display
exists, otherwise record an MP4 of the first episodes into the run folder."""
from __future__ import annotations

import logging
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch

from herd.envs import make_env
from herd.models import build_model

log = logging.getLogger("herd")

VIDEO_EPISODES = 3
VIDEO_MAX_FRAMES = 5000


class ProgressBar:
    """`episodes done/total` on stderr: redrawn on a terminal, a line every 5 s otherwise."""

    def __init__(self, total: int):
        self.total = total
        self.tty = sys.stderr.isatty()
        self.last = 0.0

    def update(self, done: int, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self.last < (0.2 if self.tty else 5.0):
            return
        self.last = now
        filled = int(30 * done / self.total)
        line = f"test [{'#' * filled}{'.' * (30 - filled)}] {done}/{self.total} episodes"
        sys.stderr.write(("\r" + line) if self.tty else line + "\n")
        if self.tty and force:
            sys.stderr.write("\n")
        sys.stderr.flush()


def act(model, obs: np.ndarray) -> np.ndarray:
    """Samples actions for a batch of observations [E, ...] from the stochastic policy."""
    with torch.no_grad():
        logits = model(torch.from_numpy(obs).unsqueeze(0)).logits[0]       # [E, A]
        return torch.multinomial(torch.softmax(logits, -1), 1).squeeze(1).numpy()


def play_episodes(model, env_id: str, env_kwargs: dict, episodes: int, num_envs: int, seed: int,
                  progress: ProgressBar | None = None) -> list[float]:
    """Whole-game scores of `episodes` episodes, played by `num_envs` envs in lockstep."""
    envs = [make_env(env_id, seed=seed + i, **env_kwargs) for i in range(num_envs)]
    obs = np.stack([env.reset()[0] for env in envs])
    scores: list[float] = []
    while len(scores) < episodes:
        actions = act(model, obs)
        for e, env in enumerate(envs):
            o, _, terminated, truncated, info = env.step(int(actions[e]))
            if "episode_score" in info and len(scores) < episodes:
                scores.append(float(info["episode_score"]))
                if progress:
                    progress.update(len(scores))
            if terminated or truncated:
                o, _ = env.reset()
            obs[e] = o
    for env in envs:
        env.close()
    return scores


def has_display() -> bool:
    return bool(os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY"))


def render_episodes(model, env_id: str, env_kwargs: dict, seed: int, video_path: Path) -> Path | None:
    """Shows the first episodes in a window, or records them to an MP4 without a display.
    Returns the video's path, or None when nothing was recorded."""
    mode = "human" if has_display() else "rgb_array"
    try:
        env = make_env(env_id, seed=seed, render_mode=mode, **env_kwargs)
        obs, _ = env.reset()
        first = env.render()
    except Exception as err:  # e.g. a renderer whose optional dependency is not installed
        log.warning("cannot render %s (%s): playing without video", env_id, str(err).splitlines()[0])
        return None
    writer = None
    if mode == "rgb_array":
        import imageio.v2 as imageio
        writer = imageio.get_writer(video_path, fps=30, macro_block_size=1)
        writer.append_data(np.asarray(first))
    episodes = frames = 0
    try:
        while episodes < VIDEO_EPISODES and frames < VIDEO_MAX_FRAMES:
            obs, _, terminated, truncated, info = env.step(int(act(model, obs[None])[0]))
            frame = env.render()
            frames += 1
            if writer is not None:
                writer.append_data(np.asarray(frame))
            episodes += "episode_score" in info
            if terminated or truncated:
                obs, _ = env.reset()
    finally:
        if writer is not None:
            writer.close()
        env.close()
    return video_path if writer is not None else None


def test_policy(plan, run_dir: Path) -> int:
    from herd.run import env_kwargs, write_json
    cfg = plan.cfg
    model = build_model(**plan.model_kwargs)
    model.load_state_dict(plan.checkpoint["model"])
    model.eval()
    torch.set_num_threads(max(1, cfg.train.learner_thread_count or 1))
    count = cfg.test.test_episode_count
    kwargs = env_kwargs(cfg)
    video = render_episodes(model, cfg.env.env, kwargs, cfg.general.seed, run_dir / "test_video.mp4") \
        if cfg.test.render else None
    progress = ProgressBar(count)
    scores = play_episodes(model, cfg.env.env, kwargs, count, min(8, count), cfg.general.seed, progress)
    progress.update(len(scores), force=True)
    result = {"episodes": len(scores), "mean": float(np.mean(scores)), "std": float(np.std(scores)),
              "min": float(np.min(scores)), "max": float(np.max(scores)), "checkpoint": str(plan.checkpoint_path),
              "video": str(video) if video else None, "scores": scores}
    write_json(run_dir / "test_results.json", result)
    print(f"test: {result['episodes']} episodes, mean {result['mean']:.2f} ± {result['std']:.2f}, "
          f"min {result['min']:.2f}, max {result['max']:.2f}" + (f"; video {video}" if video else ""))
    return 0
