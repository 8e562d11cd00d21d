"""Test mode, multi-experiment runs, and checkpoints that must be refused."""
import hashlib
import json
import os
import subprocess
import sys

import imageio.v2 as imageio
import pytest
import torch

from herd_testing import ROOT, only_run, run_cli
from herd.checkpoint import list_checkpoints

QUEUE_ONLY = '--replay_parameters=[{"type": "queue", "capacity": 1, "sample_ratio": 1}]'


@pytest.fixture(scope="module")
def cartpole_run(tmp_path_factory):
    """A CartPole agent trained by the quick start's defaults."""
    results = tmp_path_factory.mktemp("cartpole")
    result = run_cli(["train", "--env=CartPole-v1", "--seed=4", "--tensorboard=False"], results, timeout=240)
    assert result.returncode == 0, result.stderr[-2000:]
    return only_run(results)


@pytest.fixture(scope="module")
def pong_run(tmp_path_factory):
    results = tmp_path_factory.mktemp("pong")
    result = run_cli(["train", "--env=PongNoFrameskip-v4", "--environment_max_steps=600", "--batch_size=4",
                      "--r_f_steps=5", "--worker_count=1", "--envs_per_worker=2", QUEUE_ONLY, "--tensorboard=False"],
                     results)
    assert result.returncode == 0, result.stderr[-2000:]
    return only_run(results)


def test_herd_test_scores_the_quick_start_agent(cartpole_run, tmp_path):
    result = run_cli(["test", str(cartpole_run), "--test_episode_count=100", "--render=False"], tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    scores = json.loads((only_run(tmp_path) / "test_results.json").read_text())
    assert scores["episodes"] == 100 and len(scores["scores"]) == 100
    assert scores["mean"] >= 475, scores["mean"]
    assert "100/100 episodes" in result.stderr


def test_seed_test_command_with_render_records_a_video(pong_run, tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("DISPLAY", "WAYLAND_DISPLAY")}
    result = subprocess.run([sys.executable, "main.py", "--op_mode=test", "--env=PongNoFrameskip-v4",
                             "--test_episode_count=2", f"--load_model_url={pong_run}", "--render=True",
                             "--max_episode_steps=100", f"--results_dir={tmp_path}"],
                            cwd=ROOT, capture_output=True, text=True, timeout=240, env=env)
    assert result.returncode == 0, result.stderr[-2000:]
    run = only_run(tmp_path)
    scores = json.loads((run / "test_results.json").read_text())
    assert scores["episodes"] == 2 and scores["video"]
    frames = imageio.mimread(run / "test_video.mp4", memtest=False)
    assert len(frames) > 100 and frames[0].shape[-1] == 3


def test_multi_runs_every_experiment_and_survives_a_failing_one(tmp_path):
    experiments = tmp_path / "experiments.yaml"
    experiments.write_text(
        "- {env: CartPole-v1, environment_max_steps: 2000, lr: 0.002}\n"
        "- {env: NoSuchEnv-v0}\n"
        "- {env: CartPole-v1, environment_max_steps: 2000, gamma: 0.9}\n")
    results = tmp_path / "results"
    result = subprocess.run([sys.executable, "-m", "herd.cli", "multi", str(experiments), "--worker_count=1",
                             f"--results_dir={results}"], cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert result.returncode == 1
    assert "NoSuchEnv-v0" in result.stderr and "2/3 experiments succeeded" in result.stderr
    configs = sorted(json.loads((run / "config.json").read_text())["lr"] for run in results.iterdir())
    assert configs == [0.001, 0.002]              # the command line's worker_count applied to both
    gammas = sorted(json.loads((run / "config.json").read_text())["gamma"] for run in results.iterdir())
    assert gammas == [0.9, 0.99]
    assert all((run / "summary.json").exists() for run in results.iterdir())


def folder_hashes(folder):
    return {p.relative_to(folder): hashlib.sha256(p.read_bytes()).hexdigest() for p in folder.rglob("*") if p.is_file()}


class Payload:
    def __reduce__(self):
        return (os.system, ("touch /tmp/herd-payload-ran",))


def bad_checkpoints(cartpole_run, tmp_path):
    """(url, words expected in the error) for every kind of bad checkpoint."""
    newest = list_checkpoints(cartpole_run / "checkpoints")[0]
    truncated = tmp_path / "truncated.pt"
    truncated.write_bytes(newest.read_bytes()[: newest.stat().st_size // 2])
    garbage = tmp_path / "garbage.pt"
    garbage.write_bytes(os.urandom(5000))
    malicious = tmp_path / "malicious.pt"
    torch.save({"format_version": 1, "payload": Payload()}, malicious)
    empty = tmp_path / "empty_run"
    empty.mkdir()
    return [
        ([f"--load_model_url={tmp_path / 'missing'}"], "does not exist"),
        ([f"--load_model_url={empty}"], "no checkpoint"),
        ([f"--load_model_url={truncated}"], "truncated or corrupt"),
        ([f"--load_model_url={garbage}"], "truncated or corrupt"),
        ([f"--load_model_url={malicious}"], "cannot be loaded safely"),
        ([f"--load_model_url={cartpole_run}", "--env=Acrobot-v1"], "made for CartPole-v1"),
        ([f"--load_model_url={cartpole_run}", "--hidden_sizes=32,32"], "another network"),
    ]


@pytest.mark.parametrize("mode", ["train_w_load", "test"])
def test_bad_checkpoints_are_refused_and_nothing_changes(cartpole_run, tmp_path, mode):
    if os.path.exists("/tmp/herd-payload-ran"):
        os.remove("/tmp/herd-payload-ran")
    before = folder_hashes(cartpole_run)
    for args, words in bad_checkpoints(cartpole_run, tmp_path):
        results = tmp_path / "results"
        result = run_cli([f"--op_mode={mode}", *args], results, entry="main", timeout=60)
        assert result.returncode == 2, (args, result.stderr)
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and words in lines[0], (args, result.stderr)
        assert not results.exists()
    assert folder_hashes(cartpole_run) == before
    assert not os.path.exists("/tmp/herd-payload-ran")
