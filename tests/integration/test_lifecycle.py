"""A run's life: Ctrl+C saves and exits 0, resume continues, kill -9 never corrupts the
newest checkpoint, a killed actor is replaced."""
import json
import os
import random
import signal

import numpy as np
import psutil

from herd_testing import any_alive, only_run, run_cli, start_cli, wait_for
from herd.checkpoint import list_checkpoints, load_checkpoint

REPLAY = '--replay_parameters=[{"type": "queue", "capacity": 1, "sample_ratio": 0.5}, ' \
         '{"type": "standard", "capacity": 64, "sample_ratio": 0.5}]'
SMALL = ["--env=CartPole-v1", "--worker_count=2", "--envs_per_worker=4", "--batch_size=8", "--r_f_steps=8",
         "--training_fill_in_factor=0.1", "--seed=5", REPLAY]


def episodes_logged(results):
    runs = [p for p in results.iterdir() if p.is_dir()] if results.exists() else []
    return bool(runs) and (runs[0] / "log.txt").exists() and (runs[0] / "train.csv").stat().st_size > 200 \
        if runs and (runs[0] / "train.csv").exists() else False


def test_ctrl_c_saves_and_resume_continues(tmp_path):
    results = tmp_path / "first"
    process = start_cli(["train", *SMALL, "--environment_max_steps=100000000", "--verbose_learner_out_int=1"], results)
    assert wait_for(lambda: episodes_logged(results), 60)
    children = psutil.Process(process.pid).children(recursive=True)
    os.killpg(process.pid, signal.SIGINT)          # Ctrl+C in a terminal signals the whole group
    _, err = process.communicate(timeout=30)
    assert process.returncode == 0, err[-2000:]
    assert wait_for(lambda: not any_alive(children), 10)
    run = only_run(results)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["ended"] == "stopped"
    state, _ = load_checkpoint(run)
    steps, updates = state["counters"]["env_steps"], state["counters"]["updates"]
    assert steps > 0 and updates > 0 and state["replay"]["replays"][1]["sampler"]["ring"]["filled"] > 0

    # Resuming with no budget left restores and re-saves exactly what was saved.
    same = tmp_path / "same"
    result = run_cli(["resume", str(run), f"--environment_max_steps={steps}"], same)
    assert result.returncode == 0, result.stderr[-2000:]
    again, _ = load_checkpoint(only_run(same))
    assert again["counters"]["env_steps"] == steps and again["counters"]["updates"] == updates
    for name, array in state["replay"]["replays"][1]["storage"]["arrays"].items():
        np.testing.assert_array_equal(array, again["replay"]["replays"][1]["storage"]["arrays"][name])
    packed_before = state["replay"]["replays"][1]["storage"]["packed_obs"]
    packed_after = again["replay"]["replays"][1]["storage"]["packed_obs"]
    assert len(packed_before) == len(packed_after) > 0
    assert all(np.array_equal(a, b) for a, b in zip(packed_before, packed_after))
    assert json.loads((only_run(same) / "config.json").read_text())["continues_from"].startswith(str(run))

    # Resuming with a budget continues the counters from where the old run stopped.
    more = tmp_path / "more"
    result = run_cli(["--op_mode=train_w_load", f"--load_model_url={run}", f"--environment_max_steps={steps + 3000}"],
                     more, entry="main")
    assert result.returncode == 0, result.stderr[-2000:]
    resumed = json.loads((only_run(more) / "summary.json").read_text())
    assert resumed["environment_steps"] >= steps + 3000 and resumed["training_steps"] > updates
    assert resumed["episodes"] >= summary["episodes"]  # the episode count continues, never restarts
    # The old run folder is untouched by the resumed runs.
    assert json.loads((run / "summary.json").read_text()) == summary


def test_kill_9_while_checkpointing_leaves_a_loadable_checkpoint(tmp_path):
    rng = random.Random(0)
    for attempt in range(4):
        results = tmp_path / f"r{attempt}"
        # The first attempt also runs an evaluation worker: it too must end with its learner.
        evaluating = ["--eval_interval=1s", "--eval_episodes=1", "--eval_video_every=0"] if attempt == 0 else []
        process = start_cli(["train", *SMALL, "--environment_max_steps=100000000", "--save_model_period=1",
                             "--tensorboard=False", *evaluating], results)
        assert wait_for(lambda: results.exists() and any(list_checkpoints(p / "checkpoints")
                                                         for p in results.iterdir()), 60)
        children = psutil.Process(process.pid).children(recursive=True)
        wait_for(lambda: False, rng.uniform(0.2, 2.0))
        os.kill(process.pid, signal.SIGKILL)
        process.communicate(timeout=10)
        state, path = load_checkpoint(only_run(results))    # the newest surviving checkpoint loads
        assert state["counters"]["updates"] >= 1
        # Actors (and the evaluation worker) notice their learner is gone and exit by themselves.
        assert wait_for(lambda: not any_alive(children), 15)


def test_a_killed_actor_is_replaced_and_the_run_completes(tmp_path):
    process = start_cli(["train", *SMALL, "--environment_max_steps=300000", "--tensorboard=False"], tmp_path)

    def actors():
        return [c for c in psutil.Process(process.pid).children() if "resource_tracker" not in " ".join(c.cmdline())]

    assert wait_for(lambda: len(actors()) >= 2, 30)
    wait_for(lambda: False, 3.0)  # let it train a little
    victim = actors()[0]
    victim.kill()
    _, err = process.communicate(timeout=180)
    assert process.returncode == 0, err[-2000:]
    run = only_run(tmp_path)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["environment_steps"] >= 300000 and summary["ended"] == "finished"
    assert "died" in (run / "log.txt").read_text()


def games_logged(results) -> int:
    """Rows of episodes.csv so far in the one run folder under `results` (flushed every 5 s)."""
    files = list(results.glob("*/episodes.csv"))
    return max(0, len(files[0].read_text().splitlines()) - 1) if files else 0


def test_start_up_slower_than_the_actor_timeout_is_not_a_hang(tmp_path):
    # Actors take seconds to import torch and build their envs; a 2 s timeout (the least
    # allowed) applies only once an actor has delivered its first rollout.
    result = run_cli(["train", *SMALL, "--environment_max_steps=20000", "--tensorboard=False", "--actor_timeout=2"],
                     tmp_path, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "delivered nothing" not in (only_run(tmp_path) / "log.txt").read_text()


def test_a_hung_actor_is_replaced(tmp_path):
    process = start_cli(["train", *SMALL, "--environment_max_steps=150000", "--tensorboard=False",
                         "--actor_timeout=3"], tmp_path)

    def actors():
        return [c for c in psutil.Process(process.pid).children() if "resource_tracker" not in " ".join(c.cmdline())]

    assert wait_for(lambda: len(actors()) >= 2, 30)
    # Rollouts flow (games are logged): the actors are past their start-up grace.
    assert wait_for(lambda: games_logged(tmp_path) > 0, 90)
    actors()[0].suspend()                    # SIGSTOP: alive, but delivers nothing
    _, err = process.communicate(timeout=180)
    assert process.returncode == 0, err[-2000:]
    run = only_run(tmp_path)
    assert "delivered nothing" in (run / "log.txt").read_text()
    assert json.loads((run / "summary.json").read_text())["environment_steps"] >= 150000


def test_a_diverging_run_stops_with_a_clear_message_and_finite_weights(tmp_path):
    result = run_cli(["train", *SMALL, "--environment_max_steps=100000000", "--lr=1e30", "--max_bad_updates=5",
                      "--tensorboard=False"], tmp_path, timeout=120)
    assert result.returncode == 1
    assert "non-finite losses in a row" in result.stderr
    run = only_run(tmp_path)
    assert json.loads((run / "summary.json").read_text())["ended"] == "diverged"
    state, _ = load_checkpoint(run)
    assert all(np.isfinite(v.numpy()).all() for v in state["model"].values())
