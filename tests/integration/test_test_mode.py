"""Test mode end to end: the scores of fixed policies (built here, not trained, so no
test depends on how well training went) through both command lines, compared with the
same games played without herd; the progress bar, and the MP4 recorded when there is no
display."""
import hashlib
import importlib.util
import json
import subprocess
import sys

import gymnasium as gym
import imageio.v2 as imageio
import numpy as np
import pytest

from herd_testing import ANGLE_ONLY, BALANCER, ROOT, fixed_action, fixed_policy_run, no_display_env, only_run, run_cli
from herd.evaluation import MAX_TEST_ENVS, VIDEO_EPISODES, split_episodes

SOLVED = 475
QUEUE_ONLY = '--replay_parameters=[{"type": "queue", "capacity": 1, "sample_ratio": 1}]'


def folder_hashes(folder):
    return {p.relative_to(folder): hashlib.sha256(p.read_bytes()).hexdigest() for p in folder.rglob("*") if p.is_file()}




@pytest.fixture(scope="module")
def cartpole_run(small_cartpole_run, tmp_path_factory):
    return fixed_policy_run(small_cartpole_run, tmp_path_factory.mktemp("balancer"), BALANCER)


@pytest.fixture(scope="module")
def angle_only_run(small_cartpole_run, tmp_path_factory):
    return fixed_policy_run(small_cartpole_run, tmp_path_factory.mktemp("angle_only"), ANGLE_ONLY)


def independent_scores(w, episodes: int, seed: int) -> list[float]:
    """The same games played without herd: gymnasium's CartPole, env i seeded seed + i at
    its first reset and playing its fixed share of the games, as test mode promises."""
    scores = []
    for i, share in enumerate(split_episodes(episodes, MAX_TEST_ENVS)):
        env = gym.make("CartPole-v1")
        obs, _ = env.reset(seed=seed + i)
        for _ in range(share):
            score, done = 0.0, False
            while not done:
                obs, reward, terminated, truncated, _ = env.step(fixed_action(w, obs))
                score += reward
                done = terminated or truncated
            scores.append(score)
            obs, _ = env.reset()
        env.close()
    return scores


def test_herd_test_reports_what_an_independent_run_of_the_same_games_gives(angle_only_run, tmp_path):
    # Greedy: the fixed policy's most probable action is the sign rule, as when sampling.
    result = run_cli(["test", str(angle_only_run), "--test_episode_count=60", "--render=False", "--seed=77",
                      "--test_greedy=True"], tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    _, scores = read_results(tmp_path)
    expected = independent_scores(ANGLE_ONLY, 60, seed=77)
    assert len(set(expected)) > 5                          # games of many lengths: a real comparison
    assert sorted(scores["episodes"]) == sorted(expected)
    assert scores["mean"] == pytest.approx(np.mean(expected)) and scores["greedy"] is True


@pytest.fixture(scope="module")
def pong_run(tmp_path_factory):
    """A barely trained Pong agent: enough for a checkpoint to render."""
    results = tmp_path_factory.mktemp("pong")
    result = run_cli(["train", "--env=PongNoFrameskip-v4", "--environment_max_steps=600", "--batch_size=4",
                      "--r_f_steps=5", "--worker_count=1", "--envs_per_worker=2", QUEUE_ONLY, "--tensorboard=False",
                      "--learner_thread_count=1"], results)
    assert result.returncode == 0, result.stderr[-2000:]
    return only_run(results)


def read_results(results):
    run = only_run(results)
    return run, json.loads((run / "test_results.json").read_text())


def test_herd_test_reports_500_for_a_policy_that_balances(cartpole_run, tmp_path):
    before = folder_hashes(cartpole_run)
    result = run_cli(["test", str(cartpole_run), "--test_episode_count=100", "--render=False"], tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    run, scores = read_results(tmp_path)
    assert scores["episode_count"] == 100 and len(scores["episodes"]) == 100
    assert scores["mean"] >= SOLVED, scores["mean"]
    episodes = scores["episodes"]
    assert scores["mean"] == pytest.approx(sum(episodes) / 100)
    assert (scores["min"], scores["max"]) == (min(episodes), max(episodes))
    assert all(0 < s <= 500 for s in episodes)            # whole CartPole games, capped at 500 steps
    assert scores["video"] is None and not (run / "test_video.mp4").exists()
    assert "test: 100 episodes, mean" in result.stdout
    assert "100/100 episodes" in result.stderr            # the progress bar's last line
    assert folder_hashes(cartpole_run) == before          # testing writes only into its own folder
    config = json.loads((run / "config.json").read_text())
    assert config["op_mode"] == "test" and config["continues_from"].startswith(str(cartpole_run))


def test_seed_command_line_test_mode(cartpole_run, tmp_path):
    result = run_cli(["--op_mode=test", "--env=CartPole-v1", "--test_episode_count=20",
                      f"--load_model_url={cartpole_run}", "--render=False"], tmp_path, entry="main")
    assert result.returncode == 0, result.stderr[-2000:]
    _, scores = read_results(tmp_path)
    assert scores["episode_count"] == 20 and len(scores["episodes"]) == 20
    assert scores["mean"] >= SOLVED


def test_render_without_a_display_records_a_video_and_prints_nothing_from_sdl(small_cartpole_run, tmp_path):
    """No display, as on a bare server: CartPole's frames are drawn and recorded (or, without
    pygame, one warning and the games are still scored); and nothing from pygame's SDL on
    stderr (it printed "error: XDG_RUNTIME_DIR is invalid or not set", its Wayland probe):
    stderr holds only herd's lines."""
    env = {k: v for k, v in no_display_env().items()
           if k not in ("XDG_RUNTIME_DIR", "SDL_VIDEODRIVER", "SDL_AUDIODRIVER")}
    result = subprocess.run([sys.executable, "-m", "herd.cli", "test", str(small_cartpole_run),
                             "--test_episode_count=5", "--render=True", f"--results_dir={tmp_path}"],
                            cwd=ROOT, capture_output=True, text=True, timeout=120, env=env)
    assert result.returncode == 0, result.stderr[-2000:]
    run, scores = read_results(tmp_path)
    assert scores["episode_count"] == 5
    if importlib.util.find_spec("pygame") is None:        # CartPole's renderer needs pygame
        warnings = [line for line in result.stderr.splitlines() if "without video" in line]
        assert len(warnings) == 1 and "pygame" in warnings[0], result.stderr
        assert scores["video"] is None and not (run / "test_video.mp4").exists()
    else:
        assert scores["video"] == str(run / "test_video.mp4")   # the frames were drawn and recorded
        assert len(imageio.mimread(run / "test_video.mp4", memtest=False)) > 1
    lines = result.stderr.strip().splitlines()
    assert lines and all(line.startswith(("[herd]", "test [")) for line in lines), result.stderr


def test_render_records_an_mp4_when_there_is_no_display(pong_run, tmp_path):
    result = subprocess.run([sys.executable, "main.py", "--op_mode=test", "--env=PongNoFrameskip-v4",
                             "--test_episode_count=2", f"--load_model_url={pong_run}", "--render=True",
                             "--max_episode_steps=200", f"--results_dir={tmp_path}"],
                            cwd=ROOT, capture_output=True, text=True, timeout=180, env=no_display_env())
    assert result.returncode == 0, result.stderr[-2000:]
    run, scores = read_results(tmp_path)
    assert scores["episode_count"] == 2 and all(-21 <= s <= 21 for s in scores["episodes"])
    video = run / "test_video.mp4"
    assert scores["video"] == str(video) and video.stat().st_size > 0
    frames = imageio.mimread(video, memtest=False)
    # The first frame, then one per agent step of the first games, each cut at 200 steps.
    assert len(frames) == 1 + VIDEO_EPISODES * 200
    # Full-size RGB screens, not the agent's 84x84 grayscale input.
    assert frames[0].shape == (210, 160, 3)
