"""A run's life: Ctrl+C saves and exits 0, resume continues, kill -9 never corrupts the
newest checkpoint, a killed or hung actor is replaced."""
import json
import os
import random
import signal
import time

import numpy as np
import psutil
import pytest

from herd_testing import (SMALL_RUN as SMALL, actor_pids, any_alive, killed_at_exit, log_text, newest_update, only_run,
                          run_cli, start_cli, wait_for)
from herd.checkpoint import load_checkpoint

def test_a_killed_actor_is_replaced(stopped_run):
    # The fixture saw a new actor process start after the kill; the log says why.
    assert "died (exit code -9): restarting it" in (stopped_run["run"] / "log.txt").read_text()
    summary = json.loads((stopped_run["run"] / "summary.json").read_text())
    assert summary["actor_restarts"] >= 2, summary        # the killed actor and the hung one


def test_actors_run_as_throughput_work(stopped_run):
    """The first actors and a replacement run SCHED_BATCH (herd/actors/actor.py
    run_as_throughput_work): woken, they do not preempt the learner or a server."""
    assert stopped_run["schedulers"] == {"first actors": [os.SCHED_BATCH] * 2, "replacement": [os.SCHED_BATCH]}


def test_a_hung_actor_is_replaced_and_training_goes_on(stopped_run):
    assert "delivered nothing" in (stopped_run["run"] / "log.txt").read_text()
    state, _ = load_checkpoint(stopped_run["run"])
    assert state["counters"]["updates"] > stopped_run["updates_after_both"]


@pytest.mark.timeout(560)   # the sum of its inner budgets (10 + 240 + 240 s), and a margin
def test_ctrl_c_saves_and_resume_continues(stopped_run, tmp_path):
    assert stopped_run["returncode"] == 0, stopped_run["stderr"][-2000:]
    assert wait_for(lambda: not any_alive(stopped_run["children"]), 10)
    run = stopped_run["run"]
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
    """Four runs checkpointing at every update, each killed (kill -9) at a random instant
    0.2-2 s after its first checkpoint. They run side by side: each is killed on its own
    clock, and their start-ups overlap instead of adding up."""
    rng = random.Random(0)
    attempts = []
    for attempt in range(4):
        results = tmp_path / f"r{attempt}"
        # The first attempt also runs an evaluation worker: it too must end with its learner.
        evaluating = ["--eval_interval=1s", "--eval_episodes=1", "--eval_video_every=0"] if attempt == 0 else []
        # One actor each: the checkpoint's atomicity is the learner's; whether actors end
        # with their learner is the same for one as for two.
        process = start_cli(["train", *SMALL, "--worker_count=1", "--environment_max_steps=100000000",
                             "--save_model_period=1", "--tensorboard=False", *evaluating], results)
        attempts.append({"results": results, "process": process, "delay": rng.uniform(0.2, 2.0), "kill_at": None})
    try:
        def kill_when_due() -> bool:
            now = time.monotonic()
            for a in attempts:
                if a["kill_at"] is None and newest_update(a["results"]) > 0:
                    a["children"] = psutil.Process(a["process"].pid).children(recursive=True)
                    a["kill_at"] = now + a["delay"]
                elif a["kill_at"] is not None and now >= a["kill_at"] and a["process"].poll() is None:
                    os.kill(a["process"].pid, signal.SIGKILL)
            return all(a["process"].poll() is not None for a in attempts)
        assert wait_for(kill_when_due, 120, 0.02), [newest_update(a["results"]) for a in attempts]
    finally:
        for a in attempts:
            if a["process"].poll() is None:
                os.killpg(a["process"].pid, signal.SIGKILL)
    for a in attempts:
        assert a["process"].wait(timeout=10) == -signal.SIGKILL
        state, path = load_checkpoint(only_run(a["results"]))    # the newest surviving checkpoint loads
        assert state["counters"]["updates"] >= 1
        # Actors (and the evaluation worker) notice their learner is gone and exit by themselves.
        assert wait_for(lambda: not any_alive(a["children"]), 15)
        # Only then are the output pipes they inherited closed: reading them to the end first
        # would bound the same exits by 10 s instead of 15.
        a["process"].communicate(timeout=10)
    assert len(attempts[0]["children"]) > len(attempts[1]["children"])      # the evaluation worker was there


def test_start_up_slower_than_the_actor_timeout_is_not_a_hang(stopped_run):
    # Actors take seconds to import torch and build their envs (the first ones, and the
    # replacement of the killed one); the 15 s timeout applies only once an actor has
    # delivered its first rollout. Only the actor that was made to hang was called hung.
    log = (stopped_run["run"] / "log.txt").read_text().splitlines()
    died = [line for line in log if " died " in line]
    hung = [line for line in log if "delivered nothing" in line]
    assert len(died) == 1 and len(hung) == 1, died + hung
    killed_id = died[0].split("actor ")[1].split()[0]
    assert hung[0].split("actor ")[1].split()[0] == str(1 - int(killed_id)), hung


def test_a_diverging_run_stops_with_a_clear_message_and_finite_weights(tmp_path):
    result = run_cli(["train", *SMALL, "--worker_count=1", "--environment_max_steps=100000000", "--lr=1e30",
                      "--max_bad_updates=5", "--tensorboard=False"], tmp_path, timeout=120)
    assert result.returncode == 1
    assert "non-finite losses in a row" in result.stderr
    run = only_run(tmp_path)
    assert json.loads((run / "summary.json").read_text())["ended"] == "diverged"
    state, _ = load_checkpoint(run)
    assert all(np.isfinite(v.numpy()).all() for v in state["model"].values())


def test_actors_failing_past_the_restart_budget_end_the_run(tmp_path):
    """--max_actor_restarts=1: the first killed actor is replaced, the second failure ends
    the run with an error, its summary saying why, and the actors gone. Catches a budget
    that is never checked (a run whose actors crash at start would restart them forever)
    or one that ends the run at the first restart."""
    results = tmp_path / "budget"
    process = start_cli(["train", *SMALL, "--environment_max_steps=100000000", "--max_actor_restarts=1",
                         "--actor_timeout=60", "--tensorboard=False"], results)
    with killed_at_exit(process):
        assert wait_for(lambda: len(actor_pids(process)) >= 2, 60), "the actors never started"
        assert wait_for(lambda: "first update" in log_text(results), 90), "no update within 90 s"
        first = min(actor_pids(process))
        psutil.Process(first).kill()
        assert wait_for(lambda: "died" in log_text(results), 30)
        assert wait_for(lambda: len(actor_pids(process) - {first}) >= 2, 30), "the first killed actor was not replaced"
        assert process.poll() is None, "one restart (within the budget of 1) ended the run"
        second = min(actor_pids(process) - {first})
        children = psutil.Process(process.pid).children(recursive=True)
        psutil.Process(second).kill()
        _, err = process.communicate(timeout=60)
    assert process.returncode == 1, err[-2000:]
    assert "actors failed 2 times (more than --max_actor_restarts=1)" in err
    summary = json.loads((only_run(results) / "summary.json").read_text())
    assert summary["ended"] == "actors failed" and summary["actor_restarts"] == 2
    assert wait_for(lambda: not any_alive(children), 30), "actors outlived the run"
