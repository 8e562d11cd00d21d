"""`herd export RUN`: the TorchScript policy acts as the run's own policy does on
observations recorded from the run's environment, the safetensors weights are the
checkpoint's, the JSON spec describes the preprocessing; LSTM runs are refused."""
import json
import subprocess
import sys

import numpy as np
import torch
from safetensors.torch import load_file

import herd
from herd_testing import BALANCER, ROOT, fixed_policy_run, only_run, run_cli
from herd.checkpoint import load_checkpoint


def export(run, out=None):
    args = [sys.executable, "-m", "herd.cli", "export", str(run), *([f"--out={out}"] if out else [])]
    return subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=240)


def recorded_observations(policy, steps=200, seed=11):
    """Observations of the run's own environment, played by the policy (greedy)."""
    env = policy.make_env(seed=seed)
    obs, _ = env.reset()
    seen = []
    for _ in range(steps):
        seen.append(obs)
        obs, _, terminated, truncated, _ = env.step(policy.act(obs))
        if terminated or truncated:
            obs, _ = env.reset()
    env.close()
    return np.stack(seen)


def test_exported_torchscript_acts_as_the_runs_policy(small_cartpole_run, tmp_path):
    """Catches an export that traces other weights, another input layout, or a different
    action rule: on recorded observations the TorchScript's actions equal the run's policy's
    (greedy) and its logits and values equal the network's; the balancer's known actions
    vary with the observation, so equal actions are no accident of a constant policy."""
    for run in (small_cartpole_run, fixed_policy_run(small_cartpole_run, tmp_path / "balancer", BALANCER)):
        result = export(run, tmp_path / run.parent.name / "export")
        assert result.returncode == 0, result.stderr[-2000:]
        folder = tmp_path / run.parent.name / "export"
        assert result.stdout.split() == [str(folder / name) for name in ("policy.pt", "weights.safetensors",
                                                                          "preprocessing.json")]
        policy = herd.load_policy(run, greedy=True)
        observations = recorded_observations(policy)
        scripted = torch.jit.load(str(folder / "policy.pt"))
        actions, logits, values = scripted(torch.from_numpy(observations))
        assert actions.tolist() == policy.act(observations).tolist()
        with torch.no_grad():
            out = policy.model(torch.from_numpy(observations).unsqueeze(0))
        torch.testing.assert_close(logits, out.logits[0])
        torch.testing.assert_close(values, out.value[0])
    assert len(set(actions.tolist())) == 2          # the balancer pushes both ways


def test_weights_and_preprocessing_spec(small_cartpole_run, tmp_path):
    """Catches safetensors weights that differ from the checkpoint's (names or values) and a
    spec that misdescribes the network's input; the default folder is RUN/export."""
    from herd_testing import copy_of_run
    run = copy_of_run(small_cartpole_run, tmp_path)
    assert export(run).returncode == 0
    state, path = load_checkpoint(run)
    weights = load_file(str(run / "export" / "weights.safetensors"))
    assert weights.keys() == state["model"].keys()
    assert all(torch.equal(weights[k], state["model"][k]) for k in weights)
    spec = json.loads((run / "export" / "preprocessing.json").read_text())
    assert spec["env"] == "CartPole-v1" and spec["obs_shape"] == [4] and spec["obs_dtype"] == "float32"
    assert spec["action_kind"] == "discrete" and spec["num_actions"] == 2 and spec["checkpoint"] == str(path)
    assert spec["env_kwargs"]["reward_scale"] == 0.1           # the vector profile's, as the run trained


def test_lstm_run_is_refused_in_one_line(tmp_path):
    """Catches an LSTM run exported without its recurrent state (a policy that would act
    differently from the run's) or a traceback instead of one line."""
    trained = run_cli(["train", "--env=CartPole-v1", "--environment_max_steps=1000", "--worker_count=1",
                       "--use_lstm=True", "--lstm_size=16", "--tensorboard=False"], tmp_path)
    assert trained.returncode == 0, trained.stderr[-2000:]
    run = only_run(tmp_path)
    result = export(run)
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1
    assert "LSTM core" in result.stderr and not (run / "export").exists()


def test_continuous_export_gives_the_gaussian_mean_and_the_bounds(tmp_path):
    """Catches a continuous export that samples (or returns the log-std) instead of the
    mean the run's greedy policy plays, and a spec without the Box bounds [-1, 1] maps to."""
    trained = run_cli(["train", "--env=Pendulum-v1", "--environment_max_steps=2000", "--worker_count=1",
                       "--tensorboard=False", "--seed=3"], tmp_path)
    assert trained.returncode == 0, trained.stderr[-2000:]
    run = only_run(tmp_path)
    assert export(run).returncode == 0
    policy = herd.load_policy(run, greedy=True)
    observations = recorded_observations(policy, steps=50)
    actions, params, _ = torch.jit.load(str(run / "export" / "policy.pt"))(torch.from_numpy(observations))
    np.testing.assert_allclose(actions.numpy(), policy.act(observations), rtol=1e-6, atol=1e-6)
    assert actions.shape == (50, 1) and params.shape == (50, 2)
    spec = json.loads((run / "export" / "preprocessing.json").read_text())
    assert spec["action_kind"] == "continuous" and spec["action_low"] == [-2.0] and spec["action_high"] == [2.0]
