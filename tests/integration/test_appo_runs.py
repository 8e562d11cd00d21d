"""APPO end to end on real runs: CartPole trains each stored batch in K passes of M
minibatches, checkpoints the target network, the batch count and the return scale, and
resumes exactly; and it runs where IMPALA runs (the LSTM core, continuous actions,
MinAtar, two learners, Ray)."""
import json

import pytest
import torch

from herd_testing import FAMILIES, only_run, read_rows, run_cli, short_family_run
from herd.checkpoint import load_checkpoint

E, T, BATCH = 4, 8, 8
CARTPOLE = ["--env=CartPole-v1", "--algorithm=appo", "--worker_count=2", f"--envs_per_worker={E}",
            f"--r_f_steps={T}", f"--batch_size={BATCH}", "--seed=3", "--save_model_period=50", "--tensorboard=False",
            "--passes_per_batch=2", "--minibatches_per_pass=2", "--target_update_period=3",
            "--normalize_returns=True"]


def test_cartpole_trains_stored_batches_and_resumes_exactly(tmp_path):
    """Catches a stored batch counted per gradient step instead of per batch, a target that
    is not synced every period batches, a checkpoint without the loss's state (target,
    batch count, return scale), a resume that changes it, and policy lag missing from the
    run's files."""
    first = tmp_path / "first"
    result = run_cli(["train", *CARTPOLE, "--environment_max_steps=3000"], first, timeout=240)
    assert result.returncode == 0, result.stderr[-2000:]
    run = only_run(first)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["algorithm"] == "appo"
    assert summary["policy_lag_mean"] is not None and summary["policy_lag_max"] >= summary["policy_lag_mean"] >= 0
    train = read_rows(run / "train.csv")
    assert {"clip_fraction", "return_scale", "policy_lag", "policy_lag_max"} <= set(train[0])
    assert all(0 <= float(row["clip_fraction"]) <= 1 for row in train)

    state, _ = load_checkpoint(run)
    updates, steps = state["counters"]["updates"], state["counters"]["env_steps"]
    loss = state["loss_state"]
    # One update per stored batch of BATCH trajectories of T steps: its K x M gradient steps
    # do not count as updates.
    assert updates == steps // (T * BATCH) == loss["stored_batches"] > 0
    assert loss["target_syncs"] == updates // 3
    # The return scale learned something (its second moment moved off its initial 1).
    assert float(loss["return_second_moment"]) != 1.0

    same = tmp_path / "same"
    result = run_cli(["resume", str(run), f"--environment_max_steps={steps}"], same, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    again, _ = load_checkpoint(only_run(same))
    assert again["loss_state"]["stored_batches"] == updates
    assert again["loss_state"]["target_syncs"] == loss["target_syncs"]
    assert torch.equal(again["loss_state"]["return_second_moment"], loss["return_second_moment"])
    for name, tensor in loss["target"].items():
        assert torch.equal(tensor, again["loss_state"]["target"][name]), name


@pytest.mark.parametrize("args", FAMILIES.values(), ids=FAMILIES.keys())
def test_appo_runs_where_impala_runs(args, tmp_path):
    """Catches an APPO path that breaks on a recurrent core (the target unrolls from the
    stored states), a Gaussian policy, MinAtar frames, several learners or Ray."""
    _, state = short_family_run("appo", args, tmp_path)
    assert state["loss_state"]["stored_batches"] == state["counters"]["updates"] > 0
