"""Ape-X end to end on the local backend: a short CartPole run (marks of the least exploring
actor, Ape-X's metrics, target network and priorities in the checkpoint), an exact resume,
a greedy `herd test`; and a Pong smoke run stopped with Ctrl+C and resumed."""
import json
import os
import signal

import numpy as np
import pytest
import torch

from herd_testing import killed_at_exit, log_text, only_run, read_rows, run_cli, start_cli, wait_for
from herd.checkpoint import list_checkpoints, load_checkpoint

CARTPOLE = ["--env=CartPole-v1", "--algorithm=apex", "--worker_count=2", "--envs_per_worker=4", "--r_f_steps=8",
            "--batch_size=32", "--training_fill_in_factor=0.1", "--seed=3", "--save_model_period=40",
            "--target_update_period=25", "--replay_ratio=4",
            '--replay_parameters=[{"type": "prioritized", "capacity": 100, "sample_ratio": 1}]']


@pytest.fixture(scope="module")
def apex_cartpole(tmp_path_factory):
    """One short Ape-X CartPole run (2 actors, 2,000 steps), shared read-only by the tests
    below: each checks one thing, so the first failure hides none of the others."""
    first = tmp_path_factory.mktemp("apex_first")
    result = run_cli(["train", *CARTPOLE, "--environment_max_steps=2000"], first, timeout=180)
    assert result.returncode == 0, result.stderr[-2000:]
    run = only_run(first)
    state, _ = load_checkpoint(run)
    return run, state


def test_cartpole_run_marks_the_least_exploring_actor_and_saves_apex_state(apex_cartpole):
    run, state = apex_cartpole
    summary = json.loads((run / "summary.json").read_text())
    assert summary["algorithm"] == "apex" and summary["training_steps"] > 0 and summary["least_exploring_actor"] == 1
    episodes = read_rows(run / "episodes.csv")
    assert episodes and {row["actor"] for row in episodes} == {"0", "1"}
    assert all(row["least_exploring"] == str(int(row["actor"] == "1")) for row in episodes)
    train = read_rows(run / "train.csv")
    assert {"td_error", "q_mean", "mean_weight", "least_exploring_average"} <= set(train[0])
    assert "least exploring actor (1)" in (run / "log.txt").read_text()

    updates = state["counters"]["updates"]
    assert state["loss_state"]["calls"] == updates
    sampler = state["replay"]["replays"][0]["sampler"]
    leaves = sampler["tree"]["leaves"]
    filled = sampler["ring"]["filled"] * 8
    assert leaves.shape == (800,) and np.all(leaves[:filled] > 0) and np.all(leaves[filled:] == 0)
    # Every leaf started from its actor's priority (kept in the stored trajectories); the
    # learner's |TD errors| have replaced some of them since.
    actor_priority = state["replay"]["replays"][0]["storage"]["arrays"]["priority"]      # [T, stored]
    from_actors = (np.abs(actor_priority.T.reshape(-1)) + 1e-6) ** 0.6
    assert np.all(np.isfinite(actor_priority))
    assert 0 < np.count_nonzero(~np.isclose(leaves[:filled], from_actors[:filled])) < filled


def test_resuming_with_no_budget_left_re_saves_exactly_what_was_saved(apex_cartpole, tmp_path):
    run, state = apex_cartpole
    updates, steps = state["counters"]["updates"], state["counters"]["env_steps"]
    sampler = state["replay"]["replays"][0]["sampler"]
    result = run_cli(["resume", str(run), f"--environment_max_steps={steps}"], tmp_path, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    again, _ = load_checkpoint(only_run(tmp_path))
    assert again["loss_state"]["calls"] == updates
    for name, tensor in state["loss_state"]["target"].items():
        assert torch.equal(tensor, again["loss_state"]["target"][name]), name
    np.testing.assert_array_equal(again["replay"]["replays"][0]["sampler"]["tree"]["leaves"], sampler["tree"]["leaves"])
    assert again["replay"]["replays"][0]["sampler"]["samples"] == sampler["samples"]


def test_resuming_with_a_budget_continues_the_counters(apex_cartpole, tmp_path):
    run, state = apex_cartpole
    updates, steps = state["counters"]["updates"], state["counters"]["env_steps"]
    result = run_cli(["resume", str(run), f"--environment_max_steps={steps + 1000}"], tmp_path, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    resumed = json.loads((only_run(tmp_path) / "summary.json").read_text())
    assert resumed["environment_steps"] >= steps + 1000 and resumed["training_steps"] > updates


def test_q_values_cannot_resume_as_another_algorithm(apex_cartpole, cli, tmp_path):
    run, _ = apex_cartpole
    result = cli(["resume", str(run), "--algorithm=impala"], tmp_path / "other")
    assert result.returncode == 2 and "trained with --algorithm=apex" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and not (tmp_path / "other").exists()


def test_herd_test_plays_greedily_by_default(apex_cartpole, tmp_path):
    run, _ = apex_cartpole
    result = run_cli(["test", str(run), "--test_episode_count=4", "--render=False"], tmp_path, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    outcome = json.loads((only_run(tmp_path) / "test_results.json").read_text())
    assert outcome["episode_count"] == 4 and outcome["policy"] == "apex {'epsilon': 0.0}" and outcome["greedy"]


def test_herd_test_plays_epsilon_greedy_when_told(apex_cartpole, tmp_path):
    run, _ = apex_cartpole
    result = run_cli(["test", str(run), "--test_episode_count=2", "--render=False", "--apex_test_epsilon=0.5"],
                     tmp_path, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    exploring = json.loads((only_run(tmp_path) / "test_results.json").read_text())
    assert exploring["policy"] == "apex {'epsilon': 0.5}" and not exploring["greedy"]


# One learner thread: on two cores the run's actor holds one, and a two-thread learner
# (fp32's default, one per core) spends its OpenMP barriers waiting for it.
PONG = ["--env=PongNoFrameskip-v4", "--algorithm=apex", "--worker_count=1", "--envs_per_worker=2", "--r_f_steps=10",
        "--batch_size=8", "--training_fill_in_factor=0.25", "--seed=1", "--learner_precision=fp32",
        "--learner_thread_count=1",
        "--verbose_learner_out_int=1", "--target_update_period=5",
        '--replay_parameters=[{"type": "prioritized", "capacity": 20, "sample_ratio": 1}]']


@pytest.mark.timeout(470)   # the sum of its inner budgets (150 + 60 + 200 s), and a margin
def test_pong_smoke_ctrl_c_checkpoint_and_resume(tmp_path):
    results = tmp_path / "pong"
    process = start_cli(["train", *PONG, "--environment_max_steps=100000000"], results)
    with killed_at_exit(process):
        assert wait_for(lambda: "first update" in log_text(results), 150), "no update within 150 s"
        os.killpg(process.pid, signal.SIGINT)
        _, err = process.communicate(timeout=60)
    assert process.returncode == 0, err[-2000:]
    run = only_run(results)
    assert json.loads((run / "summary.json").read_text())["ended"] == "stopped"
    state, _ = load_checkpoint(run)
    steps, updates = state["counters"]["env_steps"], state["counters"]["updates"]
    assert updates > 0 and state["loss_state"]["calls"] == updates
    storage = state["replay"]["replays"][0]["storage"]
    assert len(storage["packed_obs"]) > 0                                  # frames LZ4-packed in the checkpoint

    resumed = tmp_path / "resumed"
    result = run_cli(["resume", str(run), f"--environment_max_steps={steps + 200}"], resumed, timeout=200)
    assert result.returncode == 0, result.stderr[-2000:]
    summary = json.loads((only_run(resumed) / "summary.json").read_text())
    assert summary["environment_steps"] >= steps + 200 and summary["training_steps"] > updates
    assert list_checkpoints(only_run(resumed) / "checkpoints")
