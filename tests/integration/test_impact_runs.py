"""IMPACT end to end on real runs: CartPole trains each batch K times, checkpoints the
target network and the circular buffer, and resumes exactly; and it runs where IMPALA
runs (the LSTM core, continuous actions, MinAtar, two learners, Ray)."""
import json

import numpy as np
import pytest
import torch

from herd_testing import FAMILIES, only_run, read_rows, run_cli, short_family_run
from herd.checkpoint import load_checkpoint

E, T, BATCH, K = 4, 8, 8, 2
CARTPOLE = ["--env=CartPole-v1", "--algorithm=impact", "--worker_count=2", f"--envs_per_worker={E}",
            f"--r_f_steps={T}", f"--batch_size={BATCH}", "--seed=3", "--save_model_period=50", "--tensorboard=False",
            "--target_update_period=6",
            f'--replay_parameters=[{{"type": "circular", "capacity": 3, "sample_ratio": 1, "iterations_per_batch": {K}}}]']


def test_cartpole_trains_each_batch_k_times_and_resumes_exactly(tmp_path):
    """Catches a circular buffer that the learner does not drain K times per batch, weights
    published after every pass, a checkpoint without the target network or the buffer, and
    a resume that changes them."""
    first = tmp_path / "first"
    result = run_cli(["train", *CARTPOLE, "--environment_max_steps=3000"], first, timeout=240)
    assert result.returncode == 0, result.stderr[-2000:]
    run = only_run(first)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["algorithm"] == "impact" and summary["target_update_period"] == 6
    train = read_rows(run / "train.csv")
    assert {"clip_fraction", "kl_target", "mean_ratio"} <= set(train[0])
    assert all(0 <= float(row["clip_fraction"]) <= 1 for row in train)

    state, _ = load_checkpoint(run)
    updates, steps = state["counters"]["updates"], state["counters"]["env_steps"]
    sampler = state["replay"]["replays"][0]["sampler"]
    # Every batch completed is trained on K times, less the passes still waiting in the buffer.
    batches = steps // (T * BATCH)
    assert updates == K * batches - int(sampler["uses_left"].sum()) and updates > 0
    assert state["loss_state"]["calls"] == updates and sampler["evicted_unused"] == 0
    # Weights go to the actors once per batch, after its last pass (not after each pass).
    assert summary["weights_published"] == batches - np.count_nonzero(sampler["uses_left"]) < updates

    same = tmp_path / "same"
    result = run_cli(["resume", str(run), f"--environment_max_steps={steps}"], same, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    again, _ = load_checkpoint(only_run(same))
    assert again["loss_state"]["calls"] == updates
    for name, tensor in state["loss_state"]["target"].items():
        assert torch.equal(tensor, again["loss_state"]["target"][name]), name
    for name, value in sampler.items():
        np.testing.assert_array_equal(again["replay"]["replays"][0]["sampler"][name], value)

    more = tmp_path / "more"
    result = run_cli(["resume", str(run), f"--environment_max_steps={steps + 1000}"], more, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    resumed = json.loads((only_run(more) / "summary.json").read_text())
    assert resumed["environment_steps"] >= steps + 1000 and resumed["training_steps"] > updates


@pytest.mark.parametrize("args", FAMILIES.values(), ids=FAMILIES.keys())
def test_impact_runs_where_impala_runs(args, tmp_path):
    """Catches an IMPACT path that breaks on a recurrent core (the target must unroll from
    the stored states), a Gaussian policy, MinAtar frames, several learners or Ray."""
    summary, state = short_family_run("impact", args, tmp_path)
    assert state["loss_state"]["calls"] >= summary["training_steps"] > 0
