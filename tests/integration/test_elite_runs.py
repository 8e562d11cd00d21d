"""Elite and attentive replay in real Pong runs: the seed's elite command verbatim, every
strategy and both sampling kinds, and the custom replay's state across a resume."""
import json
import os
import signal
import subprocess
import sys

import numpy as np
import pytest

from herd_testing import ROOT, killed_at_exit, log_text, only_run, run_cli, wait_for
from herd.checkpoint import load_checkpoint

SEED_ELITE = ["--op_mode=train", "--env=PongNoFrameskip-v4", "--environment_max_steps=1000000",
              '--replay_parameters=[{"type": "custom", "capacity": 1000, "sample_ratio": 0.5, "dist_function":"ln_norm", '
              '"sample_strategy":"elite_sampling", "lambda_batch_multiplier":6, "alfa_annealing_factor":2.0} ,'
              '{"type": "queue", "capacity": 1, "sample_ratio": 0.5}]']


def custom_sampler_state(state: dict) -> dict:
    return state["replay"]["replays"][0]["sampler"]


@pytest.mark.timeout(660)   # the sum of its inner budgets (60 + 240 + 60 + 240 s), and a margin
def test_seed_elite_command_runs_verbatim_and_resumes_its_replay(tmp_path):
    # Verbatim: no flag added; the run folder lands in results/ under the working directory.
    process = subprocess.Popen([sys.executable, str(ROOT / "main.py"), *SEED_ELITE], cwd=tmp_path,
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)
    results = tmp_path / "results"
    with killed_at_exit(process):
        assert wait_for(lambda: results.exists() and any(results.iterdir()), 60)
        # Start-up, 2,000 steps of warm-up (200 trajectories), then updates: the first one
        # is logged at once (train.csv would show one only at update 50, 25,000 steps later).
        assert wait_for(lambda: "first update" in log_text(results), 240), "no update within 240 s"
        os.killpg(process.pid, signal.SIGINT)
        _, err = process.communicate(timeout=60)
    assert process.returncode == 0, err[-2000:]
    run = only_run(results)
    first = next(line for line in log_text(results).splitlines() if "first update" in line)
    assert int(first.split(" after ")[1].split()[0]) >= 2000          # not before the warm-up was done
    state, _ = load_checkpoint(run)
    updates = state["counters"]["updates"]
    assert updates >= 1
    sampler = custom_sampler_state(state)
    config = json.loads((run / "config.json").read_text())
    # herd's Atari defaults for this machine (a CPU learner: batches of 8 x 20 steps); the
    # learning rate decays over the whole run: 1M steps / (4 fresh trajectories x 20 steps).
    assert config["batch_size"] == 8 and config["r_f_steps"] == 20
    assert config["lr_scheduler_steps"] == 1_000_000 // (4 * 20)
    share = config["batch_size"] // 2
    # Every update drew its share of elite-sampled trajectories (prefetched batches may add a
    # few rounds); a trajectory overwritten by a newer one takes its sample count with it.
    assert sampler["rounds"] >= updates and 0 < sampler["counts"].sum() <= share * sampler["rounds"]
    assert state["replay"]["replays"][0]["sampler"]["ring"]["filled"] >= 200

    # Resuming with no budget left restores the replay's contents, counters and RNG exactly.
    again = tmp_path / "again"
    result = run_cli(["resume", str(run), f"--environment_max_steps={state['counters']['env_steps']}"], again)
    assert result.returncode == 0, result.stderr[-2000:]
    resumed, _ = load_checkpoint(only_run(again))
    before, after = custom_sampler_state(state), custom_sampler_state(resumed)
    assert before["rounds"] == after["rounds"] and before["newest"] == after["newest"]
    np.testing.assert_array_equal(before["counts"], after["counts"])
    assert before["rng"] == after["rng"]
    for name, array in state["replay"]["replays"][0]["storage"]["arrays"].items():
        np.testing.assert_array_equal(array, resumed["replay"]["replays"][0]["storage"]["arrays"][name])


CUSTOM_VARIANTS = {
    "strategy1-elite-ln_norm-p1": {"dist_function": "ln_norm", "p": 1, "sample_strategy": "elite_sampling",
                                   "elite_sampling_strategy": "strategy1"},
    "strategy2-attentive-cos_dist": {"dist_function": "cos_dist", "sample_strategy": "attentive_sampling",
                                     "elite_sampling_strategy": "strategy2"},
    "strategy4-elite-kl_div-insertion": {"dist_function": "kl_div", "sample_strategy": "elite_sampling",
                                         "elite_sampling_strategy": "strategy4", "insert_strategy": "elite_insertion",
                                         "elite_batch_size": 8},
    "strategy3-attentive-insertion-all-steps": {"dist_function": "ln_norm", "sample_strategy": "attentive_sampling",
                                                "insert_strategy": "elite_insertion", "score_steps": "all"},
}


SHARE = 2     # trajectories each custom replay gives a batch of 16; the queue gives the other 8


@pytest.fixture(scope="module")
def strategies_run(tmp_path_factory):
    """One Pong run (python main.py, as the seed starts it) whose mix holds every variant as
    its own custom replay beside the queue: each samples its share of every batch by its
    own strategy and distance, with the current model, independently of the others."""
    results = tmp_path_factory.mktemp("strategies")
    customs = [{"type": "custom", "capacity": 40, "sample_ratio": 0.125, "lambda_batch_multiplier": 4,
                "alfa_annealing_factor": 0.5, **variant} for variant in CUSTOM_VARIANTS.values()]
    replays = json.dumps([*customs, {"type": "queue", "capacity": 1, "sample_ratio": 0.5}])
    result = run_cli(["--op_mode=train", "--env=PongNoFrameskip-v4", "--environment_max_steps=1500",
                      "--worker_count=1", "--envs_per_worker=4", "--batch_size=16", "--r_f_steps=5",
                      "--training_fill_in_factor=0.5", "--lr_scheduler_steps=24", "--seed=1",
                      # One learner thread: on two cores the actor holds one, and a two-thread
                      # learner (fp32's default: one per core) waits for it at every barrier.
                      "--learner_thread_count=1", f"--replay_parameters={replays}"], results, entry="main")
    assert result.returncode == 0, result.stderr[-2000:]
    state, _ = load_checkpoint(only_run(results))
    return state


@pytest.mark.parametrize("name", list(CUSTOM_VARIANTS))
def test_every_strategy_and_sampling_kind_trains_pong(strategies_run, name):
    state = strategies_run
    index = list(CUSTOM_VARIANTS).index(name)
    updates = state["counters"]["updates"]
    sampler = state["replay"]["replays"][index]["sampler"]
    assert updates >= 24                                  # past the annealing horizon of 24 * 0.5 rounds
    assert sampler["rounds"] >= updates and 0 < sampler["counts"].sum() <= SHARE * sampler["rounds"]
    assert sampler["ring"]["filled"] == 40                # 1,500 steps / 5 = 300 trajectories went through it
    assert state["replay"]["replays"][index]["storage"]["arrays"]["action"].min() >= 0  # no sentinel left
