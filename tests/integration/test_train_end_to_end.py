"""A real training run, end to end: processes, shared memory, run folder, checkpoint."""
import glob
import json
import os

import psutil
import pytest
import torch

from herd_testing import any_alive, only_run, run_cli, start_cli, wait_for
from herd.checkpoint import load_checkpoint


def shm_files() -> set:
    return set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()


def shm_inodes_in_use() -> set:
    """Inodes of /dev/shm files that some live process maps. Other programs' files (a test
    run beside this one) are in use; a leaked one is mapped by no one. By inode, not name:
    glibc maps a semaphore under a temporary name before linking it to its own."""
    used = set()
    for maps in glob.glob("/proc/[0-9]*/maps"):
        try:
            with open(maps) as f:
                used.update(int(line.split()[4]) for line in f if "/dev/shm/" in line)
        except (OSError, ValueError, IndexError):   # the process ended meanwhile
            continue
    return used


def leaked_shm(before: set) -> set:
    in_use = shm_inodes_in_use()
    leaked = set()
    for name in shm_files() - before:
        try:
            if os.stat(f"/dev/shm/{name}").st_ino not in in_use:
                leaked.add(name)
        except FileNotFoundError:
            continue
    return leaked


@pytest.fixture(scope="module")
def cartpole_run(tmp_path_factory):
    """One real CartPole run that two tests read: 2 actors x 4 envs, with the policy-lag
    bound at 0 (rollouts from an older policy are dropped). Hardware figures every 0.25 s:
    the monitor starts before the actors, which take longer than that to start (importing
    torch), so its first sample sees them however fast the machine (at the default 5 s a
    fast machine finished the run before the first sample)."""
    results = tmp_path_factory.mktemp("cartpole")
    before = shm_files()
    process = start_cli(["train", "--env=CartPole-v1", "--environment_max_steps=20000", "--worker_count=2",
                         "--envs_per_worker=4", "--batch_size=4", "--r_f_steps=16", "--save_model_period=20",
                         "--max_policy_lag=0", "--seed=3", "--hardware_interval=0.25"], results)
    children = []
    # Recursive: the actors are forked by a fork server, the herd process's child.
    wait_for(lambda: len(children.extend(psutil.Process(process.pid).children(recursive=True)) or children) >= 4, 30,
             0.05)
    _, err = process.communicate(timeout=120)
    return {"returncode": process.returncode, "stderr": err, "children": children, "shm_before": before,
            "results": results}


def test_cartpole_run_fills_its_folder_and_cleans_up(cartpole_run):
    assert cartpole_run["returncode"] == 0, cartpole_run["stderr"][-2000:]
    children = cartpole_run["children"]
    assert len(children) >= 2
    run = only_run(cartpole_run["results"])
    assert run.name.startswith("CartPole-v1_")
    for name in ("config.json", "log.txt", "episodes.csv", "train.csv", "summary.json"):
        assert (run / name).is_file(), name
    assert any((run / "tensorboard").iterdir())
    summary = json.loads((run / "summary.json").read_text())
    assert summary["environment_steps"] >= 20000 and summary["training_steps"] > 0
    assert summary["episodes"] > 0 and summary["ended"] == "finished"
    config = json.loads((run / "config.json").read_text())
    assert config["seed"] == 3 and config["optimizer"] == "adam"
    state, path = load_checkpoint(run)
    assert state["counters"]["updates"] == summary["training_steps"]
    assert set(state["model"]) and all(torch.isfinite(v).all() for v in state["model"].values())
    lines = (run / "episodes.csv").read_text().splitlines()
    assert lines[0].startswith("episode,score,length,env_step")
    train_rows = (run / "train.csv").read_text().splitlines()
    assert len(train_rows) > 1 and "policy_lag" in train_rows[0]
    hardware = (run / "hardware.csv").read_text()
    assert hardware.startswith("time,source,metric,value,unit") and ",actor-1,cpu," in hardware and ",learner,rss," in hardware
    # No leaked shared memory and no orphaned actor processes.
    assert not leaked_shm(cartpole_run["shm_before"])
    assert wait_for(lambda: not any_alive(children), 5)


def test_seed_pong_command_runs_verbatim(tmp_path):
    result = run_cli(["--op_mode=train", "--env=PongNoFrameskip-v4", "--environment_max_steps=1000",
                      "--batch_size=10", "--r_f_steps=10", "--worker_count=2", "--envs_per_worker=2",
                      '--replay_parameters=[{"type": "queue", "capacity": 1, "sample_ratio": 0.5}, '
                      '{"type": "standard", "capacity": 1000, "sample_ratio": 0.5}]',
                      "--training_fill_in_factor=0.01"], tmp_path, entry="main")
    assert result.returncode == 0, result.stderr[-2000:]
    run = only_run(tmp_path)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["environment_steps"] >= 1000 and summary["training_steps"] > 0
    state, _ = load_checkpoint(run)
    assert state["env_spec"]["obs_shape"] == [4, 84, 84] and state["env_spec"]["num_actions"] == 6
    assert "replay" in state


def test_policy_lag_bound_drops_stale_rollouts_and_still_trains(cartpole_run):
    summary = json.loads((only_run(cartpole_run["results"]) / "summary.json").read_text())
    # Two actors with four slots each run ahead of the learner: some rollouts come from an
    # older policy and are dropped, the others train.
    assert summary["stale_rollouts_dropped"] > 0 and summary["training_steps"] > 0
    assert summary["environment_steps"] >= 20000
