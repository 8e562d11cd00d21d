"""The Python API (herd/api.py): herd.train returns the run it wrote, herd.load_policy acts
with the saved weights on the run's observations, herd.evaluate plays whole games with
them; `import herd` stays light."""
import subprocess
import sys

import numpy as np
import pytest

import herd
from herd_testing import ANGLE_ONLY, BALANCER, ROOT, fixed_action, fixed_policy_run
from herd.errors import UserError


def test_train_returns_the_run_it_wrote_with_python_values(tmp_path):
    """Catches a Run pointing at another folder (or none), and options given as Python
    values (a tuple, a list of replay dicts, a bool) lost or refused on the way to the config."""
    replays = [{"type": "queue", "capacity": 1, "sample_ratio": 1}]
    run = herd.train(env="CartPole-v1", environment_max_steps=2000, worker_count=1, seed=3, tensorboard=False,
                     hidden_sizes=(32, 16), replay_parameters=replays, results_dir=str(tmp_path))
    assert [p for p in tmp_path.iterdir()] == [run.run_dir] and run.exit_code == 0
    assert run.config["hidden_sizes"] == [32, 16] and run.config["seed"] == 3 and run.config["tensorboard"] is False
    assert run.config["replay_parameters"] and '"queue"' in run.config["replay_parameters"]
    assert run.summary["ended"] == "finished" and run.summary["environment_steps"] >= 2000


def test_bad_options_raise_the_command_lines_line_and_write_nothing(tmp_path):
    """Catches a misspelt option silently ignored (or trained with defaults) from Python."""
    with pytest.raises(UserError, match="unknown option 'lrr'"):
        herd.train(env="CartPole-v1", lrr=0.1, results_dir=str(tmp_path / "r"))
    with pytest.raises(UserError, match="op_mode"):
        herd.train(env="CartPole-v1", op_mode="test", results_dir=str(tmp_path / "r"))
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("option", ["name", "tag"])
def test_train_checks_the_run_name_as_the_command_line_does(tmp_path, option):
    """Catches herd.train skipping the CLI's run-name check (it ran in the CLI only): a name
    of '../x' put the run folder outside results_dir."""
    with pytest.raises(UserError, match=f"--{option}="):
        herd.train(env="CartPole-v1", results_dir=str(tmp_path / "r"), **{option: "../escaped"})
    assert not (tmp_path / "r").exists() and not (tmp_path / "escaped").exists()
    assert not any(tmp_path.glob("escaped*"))


@pytest.mark.parametrize("w", [BALANCER, ANGLE_ONLY], ids=["balancer", "angle_only"])
def test_load_policy_acts_with_the_saved_weights(small_cartpole_run, tmp_path, w):
    """Catches a policy that loads other weights than the run's checkpoint, or acts on
    observations the network does not see that way: the fixed policies' actions are known
    for every observation (one at a time and as a batch)."""
    policy = herd.load_policy(fixed_policy_run(small_cartpole_run, tmp_path, w))
    env = policy.make_env(seed=5)
    obs, _ = env.reset()
    seen = []
    for _ in range(40):
        action = policy.act(obs)
        assert isinstance(action, int) and action == fixed_action(w, obs)
        seen.append(obs)
        obs, _, terminated, truncated, _ = env.step(action)
        if terminated or truncated:
            obs, _ = env.reset()
    batch = np.stack(seen)
    assert policy.act(batch).tolist() == [fixed_action(w, o) for o in batch]
    with pytest.raises(ValueError, match=r"this policy takes \(4,\)"):
        policy.act(np.zeros(7, np.float32))


def test_evaluate_plays_whole_games_with_the_policy(small_cartpole_run, tmp_path):
    """Catches evaluate playing another policy or cutting games short: the balancer holds
    every game to CartPole's 500-step cap, the angle-only policy loses every game early."""
    balancer = herd.evaluate(fixed_policy_run(small_cartpole_run, tmp_path / "b", BALANCER), episodes=3)
    assert balancer["episode_count"] == 3 and balancer["episodes"] == [500.0] * 3
    angle_only = herd.evaluate(fixed_policy_run(small_cartpole_run, tmp_path / "a", ANGLE_ONLY), episodes=3)
    assert len(angle_only["episodes"]) == 3 and max(angle_only["episodes"]) < 100
    with pytest.raises(UserError, match="episodes"):
        herd.evaluate(small_cartpole_run, episodes=0)


def test_import_herd_is_light_and_the_api_is_plain_functions():
    """Catches `import herd` importing torch (seconds, before the CLI's stop handlers), and
    herd.train / herd.evaluate replaced by a module of the same name once the platform's
    modules (herd.training, herd.evaluation) are imported."""
    code = ("import sys, types, herd; light = 'torch' not in sys.modules; import herd.training, herd.evaluation; "
            "print(light, *(isinstance(f, types.FunctionType) and f.__module__ == 'herd.api' "
            "for f in (herd.train, herd.evaluate, herd.load_policy)))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.stdout.split() == ["True", "True", "True", "True"], out.stderr[-2000:]


def test_act_applies_the_runs_preprocessing_to_raw_vector_observations(tmp_path):
    """Catches act() refusing, or misreading, the raw gymnasium observation of a run whose
    preprocessing removes entries (--hide_velocity: CartPole without its two velocities):
    the raw observation must give the action of the preprocessed one."""
    from herd_testing import only_run, run_cli
    trained = run_cli(["train", "--env=CartPole-v1", "--environment_max_steps=1000", "--worker_count=1",
                       "--hide_velocity=True", "--tensorboard=False", "--seed=2"], tmp_path)
    assert trained.returncode == 0, trained.stderr[-2000:]
    policy = herd.load_policy(only_run(tmp_path), greedy=True)
    assert policy.preprocessing["obs_shape"] == [2] and policy.preprocessing["hidden_entries"] == [1, 3]
    raw = np.random.default_rng(0).normal(size=(64, 4)).astype(np.float64)   # float64, as gymnasium may give
    masked = raw[:, [0, 2]].astype(np.float32)
    assert policy.act(raw).tolist() == policy.act(masked).tolist()
    assert all(policy.act(r) == policy.act(m) for r, m in zip(raw[:8], masked[:8]))
