"""MinAtar end to end: a short run with the MinAtar profile (minatar_cnn on [C, 10, 10]
float frames, one actor), then `herd test` of its checkpoint recording a video (no
display here). Learning itself is benchmarks/minatar_learning.py's job, not a unit test's."""
import json
import os
import subprocess
import sys

import imageio.v2 as imageio
import pytest

from herd_testing import ROOT, only_run, run_cli
from herd.checkpoint import load_checkpoint


@pytest.mark.timeout(480)   # the sum of its inner budgets (240 + 180 s), and a margin
def test_minatar_trains_and_tests_with_a_video(tmp_path):
    result = run_cli(["train", "--env=MinAtar/Breakout-v1", "--environment_max_steps=1000", "--seed=1",
                      "--worker_count=1", "--envs_per_worker=4", "--batch_size=4", "--tensorboard=False"],
                     tmp_path / "train")
    assert result.returncode == 0, result.stderr[-2000:]
    run = only_run(tmp_path / "train")
    config = json.loads((run / "config.json").read_text())
    assert config["r_f_steps"] == 20 and config["optimizer"] == "adam" and config["lr"] == 0.001   # the profile
    weights, _ = load_checkpoint(run)
    assert tuple(weights["model"]["convs.0.weight"].shape) == (16, 4, 3, 3)     # minatar_cnn on Breakout's 4 channels
    episodes = (run / "episodes.csv").read_text().splitlines()
    assert len(episodes) > 10                              # random Breakout games last about 10 steps

    env = {k: v for k, v in os.environ.items() if k not in ("DISPLAY", "WAYLAND_DISPLAY")}
    tested = subprocess.run([sys.executable, "-m", "herd.cli", "test", str(run), "--test_episode_count=3",
                             "--render=True", "--max_episode_steps=100", f"--results_dir={tmp_path / 'test'}"],
                            cwd=ROOT, capture_output=True, text=True, timeout=180, env=env)
    assert tested.returncode == 0, tested.stderr[-2000:]
    test_run = only_run(tmp_path / "test")
    scores = json.loads((test_run / "test_results.json").read_text())
    assert scores["episode_count"] == 3 and all(0 <= s <= 100 for s in scores["episodes"])
    frames = imageio.mimread(test_run / "test_video.mp4", memtest=False)
    assert len(frames) > 3 and frames[0].shape == (160, 160, 3)     # 10x10 cells of 16 pixels, RGB
