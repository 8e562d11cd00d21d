"""--use_lstm in real runs on the memory task (CartPole with --hide_velocity): one short
training run (actors through the inference server, an elite replay beside the queue, the
evaluation worker), then resuming it (actors with their own models) and test mode from
its checkpoint; and the options' one-line refusals."""
import csv
import json

import pytest

from herd_testing import only_run, run_cli
from herd.api import evaluate
from herd.checkpoint import load_checkpoint

ELITE = ('[{"type": "queue", "capacity": 1, "sample_ratio": 0.5}, {"type": "custom", "capacity": 40, '
         '"sample_ratio": 0.5, "dist_function": "ln_norm", "sample_strategy": "elite_sampling", '
         '"lambda_batch_multiplier": 3}]')
MEMORY_TASK = ["--env=CartPole-v1", "--hide_velocity=True", "--use_lstm=True", "--lstm_size=16", "--worker_count=1",
               "--envs_per_worker=4", "--r_f_steps=8", "--batch_size=4", "--basic_verbose=False",
               "--tensorboard=False", "--actor_timeout=600"]   # slow starts on a busy machine are not hangs


@pytest.fixture(scope="module")
def lstm_run(tmp_path_factory):
    results = tmp_path_factory.mktemp("lstm")
    result = run_cli(["train", *MEMORY_TASK, "--environment_max_steps=6000", f"--replay_parameters={ELITE}",
                      "--actor_inference=server", "--device=cpu", "--eval_interval=40", "--eval_episodes=2",
                      "--eval_video_every=1", "--save_model_period=50", "--seed=2"], results, timeout=180)
    assert result.returncode == 0, result.stderr[-2000:]
    return only_run(results)


def test_a_recurrent_run_trains_saves_its_core_and_evaluates(lstm_run):
    state, _ = load_checkpoint(lstm_run)
    assert state["config"]["use_lstm"] is True and state["config"]["hide_velocity"] is True
    assert state["model"]["core.lstm.weight_hh_l0"].shape == (4 * 16, 16)
    assert state["model"]["core.value_lstm.weight_hh_l0"].shape == (4 * 16, 16)
    assert state["env_spec"]["obs_shape"] == [2]                     # position and angle only
    summary = json.loads((lstm_run / "summary.json").read_text())
    assert summary["training_steps"] > 40 and summary["environment_steps"] >= 6000
    # The elite replay kept every trajectory's start state and sampled with the model.
    custom = state["replay"]["replays"][1]
    stored = custom["storage"]["arrays"]["core_state"]               # [1, stored, 2, L, H]
    assert stored.shape[1:] == (40, 2, 1, 32) and (abs(stored) > 0).any()
    assert custom["sampler"]["rounds"] > 0
    with open(lstm_run / "eval.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert rows and all(int(r["episodes"]) == 2 and int(r["update"]) % 40 == 0
                        and float(r["min"]) <= float(r["mean"]) <= float(r["max"]) for r in rows)
    assert any((lstm_run / "eval_videos").glob("*.mp4"))


def test_resuming_a_recurrent_run_continues_it(lstm_run, tmp_path):
    before, _ = load_checkpoint(lstm_run)
    result = run_cli(["resume", str(lstm_run), "--environment_max_steps=9000", "--actor_inference=local"], tmp_path,
                     timeout=180)
    assert result.returncode == 0, result.stderr[-2000:]
    after, _ = load_checkpoint(only_run(tmp_path))
    assert after["counters"]["updates"] > before["counters"]["updates"]
    assert after["counters"]["env_steps"] >= 9000
    assert set(after["model"]) == set(before["model"]) and after["config"]["lstm_size"] == 16


def test_test_mode_plays_a_recurrent_policy(lstm_run, tmp_path):
    result = run_cli(["test", str(lstm_run), "--test_episode_count=6", "--render=False", "--test_greedy=True"],
                     tmp_path, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    run = only_run(tmp_path)
    scores = json.loads((run / "test_results.json").read_text())["episodes"]
    # The checkpoint's greedy policy, its core carried through each game, on the test seeds
    # through the Python API: untrained weights, sampled actions or other seeds would differ.
    seed = json.loads((run / "config.json").read_text())["seed"]
    expected = evaluate(lstm_run, episodes=6, greedy=True, seed=seed)["episodes"]
    assert sorted(scores) == sorted(expected) and len(scores) == 6


@pytest.mark.parametrize("flags,message", [
    (["--env=CartPole-v1", "--use_lstm=True", "--algorithm=apex"], "--use_lstm: the LSTM core trains with "
                                                                     "--algorithm=impala, impact or appo only"),
    (["--env=CartPole-v1", "--use_lstm=True", "--lstm_size=0"], "--lstm_size must be >= 1"),
    (["--env=PongNoFrameskip-v4", "--hide_velocity=True"], "--hide_velocity removes velocity entries"),
])
def test_bad_recurrent_options_are_refused_in_one_line(cli, tmp_path, flags, message):
    result = cli(["train", *flags], tmp_path)
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], result.stderr
