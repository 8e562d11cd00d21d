"""Continuous control end to end, on tiny real Pendulum runs: training with a Gaussian
policy, observation normalisation and elite replay (kl_div between Gaussians, CLEAR's
cloning), resuming it (the statistics continue from the checkpoint), test mode with a
video; and a MuJoCo video rendered headless with the OpenGL platform herd picks."""
import csv
import json
import math
import subprocess
import sys

import numpy as np
import pytest

from herd_testing import ROOT, no_display_env, only_run, read_rows, run_cli
from herd.api import evaluate
from herd.checkpoint import load_checkpoint

ELITE = ('[{"type": "queue", "capacity": 1, "sample_ratio": 0.5}, {"type": "custom", "capacity": 64, '
         '"sample_ratio": 0.5, "dist_function": "kl_div", "sample_strategy": "elite_sampling", '
         '"lambda_batch_multiplier": 4}]')
SMALL = ["--worker_count=1", "--envs_per_worker=4", "--batch_size=4", "--r_f_steps=16", "--save_model_period=25",
         "--tensorboard=False", "--hardware_interval=0", "--basic_verbose=False"]


@pytest.fixture(scope="module")
def pendulum_run(tmp_path_factory):
    results = tmp_path_factory.mktemp("pendulum")
    result = run_cli(["train", "--env=Pendulum-v1", "--environment_max_steps=2048", "--seed=2",
                      f"--replay_parameters={ELITE}", "--training_fill_in_factor=0.1", *SMALL], results)
    assert result.returncode == 0, result.stderr[-3000:]
    return only_run(results)


def normaliser_count(state) -> float:
    return float(state["model"]["obs_normalizer.count"])


def test_training_with_gaussian_actions_normalisation_and_elite_replay(pendulum_run):
    config = json.loads((pendulum_run / "config.json").read_text())
    assert config["normalize_observations"] is True and config["reward_scale"] == 0.1      # the profile
    summary = json.loads((pendulum_run / "summary.json").read_text())
    assert summary["training_steps"] > 0 and summary["environment_steps"] >= 2048
    # The summary's score is the raw game score (not the 0.1-scaled reward the learner sees):
    # the mean of the last avg_buff_size games of episodes.csv, each a 200-step Pendulum game.
    games = read_rows(pendulum_run / "episodes.csv")
    assert games and all(int(g["length"]) == 200 for g in games)
    last = [float(g["score"]) for g in games[-int(config["avg_buff_size"]):]]
    assert summary["last_average_score"] == pytest.approx(sum(last) / len(last), abs=0.01)
    state, _ = load_checkpoint(pendulum_run)
    # The learner counted every observation of every rollout it ingested, exactly once.
    assert normaliser_count(state) == summary["environment_steps"]
    assert state["model"]["heads.policy.log_std"].shape == (1,)
    rows = list(csv.DictReader(open(pendulum_run / "train.csv")))
    cloning = [float(r["policy_cloning_loss"]) for r in rows]
    assert all(math.isfinite(c) for c in cloning) and max(cloning) > 0   # KL between Gaussians on replayed columns
    elite = state["replay"]["replays"][1]                 # the custom replay, saved with the checkpoint
    assert elite["sampler"]["rounds"] > 0                 # it sampled by scoring candidates
    stored = elite["storage"]["arrays"]
    assert stored["action"].dtype == np.float32 and stored["action"].shape[2:] == (1,)   # [T, n, A]
    assert np.isfinite(stored["behaviour_log_std"]).all()


def test_resume_continues_the_observation_statistics(pendulum_run, tmp_path):
    before, _ = load_checkpoint(pendulum_run)
    result = run_cli(["resume", str(pendulum_run), "--environment_max_steps=3072", *SMALL], tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    resumed = only_run(tmp_path)
    summary = json.loads((resumed / "summary.json").read_text())
    after, _ = load_checkpoint(resumed)
    assert summary["environment_steps"] >= 3072
    # Restored from the checkpoint and continued: the count covers both parts of the run.
    assert normaliser_count(after) == summary["environment_steps"] > normaliser_count(before)
    assert not np.array_equal(after["model"]["obs_normalizer.mean"], before["model"]["obs_normalizer.mean"])


def test_test_mode_plays_and_records_a_video(pendulum_run, tmp_path):
    result = subprocess.run([sys.executable, "-m", "herd.cli", "test", str(pendulum_run), "--test_episode_count=2",
                             "--render=True", "--test_greedy=True", f"--results_dir={tmp_path}"], cwd=ROOT,
                            capture_output=True, text=True, timeout=240, env=no_display_env())
    assert result.returncode == 0, result.stderr[-3000:]
    run = only_run(tmp_path)
    scores = json.loads((run / "test_results.json").read_text())
    # The checkpoint's greedy policy on the test seeds, played through the Python API: a test
    # mode that played untrained weights, sampled actions or other seeds would differ.
    seed = json.loads((run / "config.json").read_text())["seed"]
    expected = evaluate(pendulum_run, episodes=2, greedy=True, seed=seed)["episodes"]
    assert scores["episode_count"] == 2 and sorted(scores["episodes"]) == pytest.approx(sorted(expected), abs=1e-3)
    assert (run / "test_video.mp4").stat().st_size > 1000


def test_mujoco_renders_headless_with_the_platform_herd_picks(tmp_path):
    """No display and no MUJOCO_GL: herd picks EGL or OSMesa (herd/envs/render_gl.py) before
    MuJoCo is imported, and HalfCheetah's frames become an MP4."""
    script = f"""
import torch
from pathlib import Path
from herd.envs.render_gl import choose_mujoco_gl
print(choose_mujoco_gl(False))
from herd.evaluation import render_episodes
from herd.models import build_model
torch.manual_seed(0)
model = build_model("auto", (17,), "float32", 6, 64, action_distribution="gaussian", normalize_observations=True)
print(render_episodes(model, "HalfCheetah-v5", dict(clip_rewards=False), 0, Path({str(tmp_path / 'cheetah.mp4')!r}),
                      games=1, max_frames=30, window=False))
"""
    # cwd: MuJoCo 4 writes MUJOCO_LOG.TXT there (HalfCheetah's model uses a deprecated attribute).
    result = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=180,
                            env=no_display_env(PYTHONPATH=str(ROOT)))
    assert result.returncode == 0, result.stderr[-3000:]
    backend, video = result.stdout.split()[-2:]
    assert backend in ("egl", "osmesa") and video.endswith("cheetah.mp4")
    import imageio.v2 as imageio
    frames = imageio.mimread(video)
    assert len(frames) == 31 and np.asarray(frames[0]).std() > 1       # a real picture, not a blank one
