"""--learner_count 2 from the command line: one run folder written by the primary with the
totals of both learners, Ctrl+C stops both with a checkpoint, a killed learner ends the
run with a checkpoint and one clear line, resume with another learner count, bad values."""
import json
import os
import signal
import subprocess
import sys

import psutil
import pytest

from herd_testing import ROOT, any_alive, cli, killed_at_exit, only_run, run_cli, start_cli, wait_for  # noqa: F401
from herd.checkpoint import list_checkpoints, load_checkpoint
from herd.monitor.metrics import EPISODE_COLUMNS

E, T, BATCH = 4, 8, 8
TWO = ["--env=CartPole-v1", "--learner_count=2", "--worker_count=2", f"--envs_per_worker={E}", f"--batch_size={BATCH}",
       f"--r_f_steps={T}", "--seed=3", "--tensorboard=False"]


def training(results) -> bool:
    """The primary logged its first update (the group's first round): the run trains."""
    logs = list(results.glob("*/log.txt")) if results.exists() else []
    return bool(logs) and "first update" in logs[0].read_text()


def test_two_learners_write_one_run_with_the_totals_of_both(tmp_path):
    result = run_cli(["train", *TWO, "--environment_max_steps=6000", "--verbose_learner_out_int=5"], tmp_path, timeout=180)
    assert result.returncode == 0, result.stderr[-2000:]
    run = only_run(tmp_path)
    assert "2 learners" in result.stderr and "[herd learner 1] finished" in result.stderr
    summary = json.loads((run / "summary.json").read_text())
    state, _ = load_checkpoint(run)
    counters = state["counters"]
    # Every rollout holds E x T steps, and the steps are the total over both learners.
    assert counters["env_steps"] == counters["rollouts"] * E * T == summary["environment_steps"] >= 6000
    # With the queue only, each update uses BATCH fresh trajectories in all (BATCH/2 per
    # learner): the rollouts of one learner alone could not have supplied them.
    assert counters["rollouts"] * E >= counters["updates"] * BATCH > 0
    episodes = (run / "episodes.csv").read_text().splitlines()
    assert episodes[0] == ",".join(EPISODE_COLUMNS) and len(episodes) - 1 == summary["episodes"] > 0
    assert summary["training_steps"] == counters["updates"]
    assert len(list_checkpoints(run / "checkpoints")) >= 1
    assert json.loads((run / "config.json").read_text())["learner_count"] == 2
    # Only the primary writes into the run folder: no second summary, log or metrics.
    assert sorted(p.name for p in run.iterdir()) == ["checkpoints", "config.json", "episodes.csv", "hardware.csv",
                                                     "log.txt", "summary.json", "train.csv"]

    # Resume the 2-learner run with 1 learner: the counters continue; the saved queue
    # (fresh trajectories, sized by the batch share) is not loaded, the weights are.
    steps = counters["env_steps"]
    one = run_cli(["resume", str(run), "--learner_count=1", f"--environment_max_steps={steps + 2000}"],
                  tmp_path / "one", timeout=120)
    assert one.returncode == 0, one.stderr[-2000:]
    resumed = json.loads((only_run(tmp_path / "one") / "summary.json").read_text())
    assert resumed["environment_steps"] >= steps + 2000 and resumed["training_steps"] > counters["updates"]
    assert resumed["episodes"] > summary["episodes"]


def test_ctrl_c_stops_both_learners_with_a_checkpoint(tmp_path):
    with killed_at_exit(start_cli(["train", *TWO, "--environment_max_steps=100000000", "--verbose_learner_out_int=2"],
                                  tmp_path)) as process:
        assert wait_for(lambda: training(tmp_path), 90)
        children = psutil.Process(process.pid).children(recursive=True)
        os.killpg(process.pid, signal.SIGINT)
        _, err = process.communicate(timeout=60)
    assert process.returncode == 0, err[-2000:]
    assert wait_for(lambda: not any_alive(children), 15)
    summary = json.loads((only_run(tmp_path) / "summary.json").read_text())
    assert summary["ended"] == "stopped"
    state, _ = load_checkpoint(only_run(tmp_path))
    assert state["counters"]["updates"] == summary["training_steps"] > 0


@pytest.mark.parametrize("victim", ["learner 1", "primary"])
def test_a_killed_learner_ends_the_run_with_a_checkpoint_and_one_line(tmp_path, victim):
    with killed_at_exit(start_cli(["train", *TWO, "--environment_max_steps=100000000", "--verbose_learner_out_int=2",
                                   "--save_model_period=1000000"], tmp_path)) as process:
        assert wait_for(lambda: training(tmp_path), 90)
        # log.txt: "2 learners (pids <primary>, <learner 1>); ..."
        line = next(l for l in (only_run(tmp_path) / "log.txt").read_text().splitlines() if "2 learners (pids" in l)
        primary, learner1 = (int(pid) for pid in line.split("(pids ")[1].split(")")[0].split(", "))
        assert primary == process.pid
        survivor_children = psutil.Process(process.pid).children(recursive=True)
        os.kill(learner1 if victim == "learner 1" else primary, signal.SIGKILL)
        if victim == "learner 1":
            _, err = process.communicate(timeout=60)
            assert process.returncode == 1, err[-2000:]
        else:
            process.communicate(timeout=10)
            # Learner 1 notices, writes the last checkpoint and the summary, and exits.
            assert wait_for(lambda: not any_alive(survivor_children), 60)
            err = ""
    run = only_run(tmp_path)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["ended"] == "learner failed" and summary["training_steps"] > 0
    state, path = load_checkpoint(run)          # written at the failure (the period is far away)
    assert state["counters"]["updates"] == summary["training_steps"]
    if victim == "learner 1":
        lines = [l for l in err.splitlines() if "died" in l or "lost" in l]
        assert len(lines) == 1 and lines[0].startswith("[herd] learner 1 died; learner 0 lost the other learners"), err
        assert "the run stops" in lines[0]


TOO_FEW = ["--env=CartPole-v1", "--learner_count=3", "--worker_count=2"]


BAD_LEARNER_OPTIONS = [
    (TOO_FEW, {}, "--worker_count=2 is less than --learner_count=3"),
    (["--env=CartPole-v1", "--learner_count=2", "--batch_size=7"], {}, "does not split evenly"),
    (["--env=CartPole-v1", "--learner_count=2", "--worker_count=2", "--batch_size=2",
      '--replay_parameters=[{"type": "queue", "capacity": 1, "sample_ratio": 0.5}, '
      '{"type": "standard", "capacity": 100, "sample_ratio": 0.5}]'], {}, "then no trajectory"),
    (["--env=CartPole-v1", "--learner_count=0"], {}, "--learner_count must be >= 1"),
    (["--env=CartPole-v1", "--learner_count=2", "--learner_timeout=0"], {}, "--learner_timeout must be"),
    (["--env=CartPole-v1", "--learner_count=2"], {"RANK": "0", "WORLD_SIZE": "3"}, "torchrun started 3"),
]


def assert_one_line(result, words, tmp_path):
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and words in lines[0], result.stderr
    assert not tmp_path.exists() or not any(tmp_path.iterdir())


@pytest.mark.parametrize("args, env, words", BAD_LEARNER_OPTIONS)
def test_bad_learner_options_are_one_line(cli, monkeypatch, tmp_path, args, env, words):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert_one_line(cli(["train", *args], tmp_path), words, tmp_path)


def test_torchrun_variables_that_disagree_are_one_line_in_a_real_process(tmp_path):
    """The case above whose input is the process's environment, as torchrun sets it."""
    args, env, words = BAD_LEARNER_OPTIONS[-1]
    result = subprocess.run([sys.executable, "-m", "herd.cli", "train", *args, f"--results_dir={tmp_path}"], cwd=ROOT,
                            capture_output=True, text=True, timeout=60, env={**os.environ, **env})
    assert_one_line(result, words, tmp_path)


def test_resume_a_one_learner_run_with_two_the_primary_keeps_the_replay(stopped_run, tmp_path):
    """The one-learner run: the shared lifecycle run (conftest.py; a uniform replay of 64
    beside the queue, stopped with Ctrl+C)."""
    saved, _ = load_checkpoint(stopped_run["run"])
    assert saved["config"]["learner_count"] == 1
    filled = saved["replay"]["replays"][1]["sampler"]["ring"]["filled"]
    steps = saved["counters"]["env_steps"]
    two = run_cli(["resume", str(stopped_run["run"]), "--learner_count=2", f"--environment_max_steps={steps + 3000}"],
                  tmp_path / "two", timeout=120)
    assert two.returncode == 0, two.stderr[-2000:]
    state, _ = load_checkpoint(only_run(tmp_path / "two"))
    assert state["counters"]["env_steps"] >= steps + 3000 and state["counters"]["updates"] > saved["counters"]["updates"]
    # The primary's uniform replay continued from the saved one (it holds more than the
    # new steps alone could have put into the primary's half).
    assert state["replay"]["replays"][1]["sampler"]["ring"]["filled"] >= min(64, filled + 1)
    assert state["config"]["learner_count"] == 2


def test_torchrun_starts_the_learners(tmp_path):
    # --standalone: torchrun's own store binds a port of its choosing (no port picked here
    # and bound later, which another process could take in between).
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
               "-m", "herd.cli",
               "train", "--env=CartPole-v1", "--worker_count=2", f"--envs_per_worker={E}", "--tensorboard=False",
               "--environment_max_steps=3000", "--seed=6", f"--results_dir={tmp_path}"]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, result.stderr[-2000:]
    run = only_run(tmp_path)                       # one run folder, made by learner 0
    assert "(torchrun: 2 learners)" in result.stderr and "[herd learner 1] finished" in result.stderr
    config = json.loads((run / "config.json").read_text())
    assert config["learner_count"] == 2 and config["seed"] == 6
    assert json.loads((run / "summary.json").read_text())["environment_steps"] >= 3000
