"""Several experiments in sequence: `herd multi FILE` and multi_train.py."""
import json
import os
import signal
import subprocess
import sys

import pytest

from herd_testing import ROOT, killed_at_exit, start_cli, wait_for

TINY = {"env": "CartPole-v1", "environment_max_steps": 2000, "tensorboard": False}


def configs(results):
    """The saved config of every run folder, oldest first (the folder names' timestamps increase)."""
    runs = sorted(p for p in results.iterdir() if p.is_dir())
    return [json.loads((run / "config.json").read_text()) for run in runs], runs


def test_multi_file_runs_the_others_when_one_fails(tmp_path):
    """A failure no check can foresee (this lr overflows the weights at every update, so
    the run diverges) is logged and the sequence goes on."""
    experiments = tmp_path / "experiments.yaml"
    experiments.write_text(
        "- {env: CartPole-v1, environment_max_steps: 2000, tensorboard: false, lr: 0.002}\n"
        "- {env: CartPole-v1, environment_max_steps: 2000, tensorboard: false, optimizer: rmsprop, lr: 3.0e+38}\n"
        "- {env: CartPole-v1, environment_max_steps: 2000, tensorboard: false, gamma: 0.9, envs_per_worker: 8}\n")
    results = tmp_path / "results"
    result = subprocess.run([sys.executable, "-m", "herd.cli", "multi", str(experiments), "--worker_count=1",
                             "--envs_per_worker=4", "--seed=7", f"--results_dir={results}"],
                            cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert result.returncode == 1, result.stderr[-3000:]
    assert "experiment 2 failed (exit code 1)" in result.stderr
    assert "2/3 experiments succeeded; failed: 2" in result.stderr
    saved, runs = configs(results)
    assert len(runs) == 3 and all((run / "summary.json").exists() for run in runs)
    assert [json.loads((run / "summary.json").read_text())["ended"] for run in runs] == ["finished", "diverged",
                                                                                         "finished"]
    # Precedence: the experiment's values over the defaults, the command line's over both.
    assert [c["lr"] for c in saved] == [0.002, 3e38, 0.001]
    assert [c["gamma"] for c in saved] == [0.99, 0.99, 0.9]
    assert [c["envs_per_worker"] for c in saved] == [4, 4, 4]
    assert [c["worker_count"] for c in saved] == [1, 1, 1] and [c["seed"] for c in saved] == [7, 7, 7]


def test_a_bad_experiment_is_found_before_the_first_runs(tmp_path):
    experiments = tmp_path / "experiments.yaml"
    experiments.write_text("- {env: CartPole-v1, environment_max_steps: 2000, tensorboard: false}\n"
                           "- {env: CartPole-v1, lr: .nan}\n"
                           "- {env: NoSuchEnv-v0}\n")
    results = tmp_path / "results"
    result = subprocess.run([sys.executable, "-m", "herd.cli", "multi", str(experiments), "--worker_count=1",
                             f"--results_dir={results}"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("herd: error: experiment 2/3") and "--lr must be a finite number" in lines[0]
    assert not results.exists()     # nothing ran, nothing was written


def test_ctrl_c_stops_the_whole_sequence(tmp_path):
    """A stopped training run exits 0 on its own; in a sequence the stop must end the sequence."""
    experiments = tmp_path / "experiments.yaml"
    experiments.write_text(json.dumps([{**TINY, "environment_max_steps": 5_000_000}, TINY]))
    results = tmp_path / "results"
    process = start_cli(["multi", str(experiments), "--worker_count=1"], results)
    with killed_at_exit(process):
        def training():   # the first update logged: the run is past its start-up and handles signals
            return any("first update" in p.read_text() for p in results.glob("*/log.txt"))
        assert wait_for(training, timeout=90)
        os.killpg(process.pid, signal.SIGINT)
        _, stderr = process.communicate(timeout=90)
    assert process.returncode == 130, stderr[-3000:]
    assert "stopped during experiment 1; experiments 2..2 were not run" in stderr
    saved, runs = configs(results)
    assert len(runs) == 1
    assert json.loads((runs[0] / "summary.json").read_text())["ended"] == "stopped"


def test_a_neighbours_stop_in_the_shared_results_folder_does_not_end_the_sequence(tmp_path):
    """Another run in the same results folder stopped by its own Ctrl+C (its summary.json says
    "stopped") while experiment 1 runs: the sequence goes on, it follows its own folders."""
    experiments = tmp_path / "experiments.yaml"
    experiments.write_text(json.dumps([{**TINY, "environment_max_steps": 6000}, TINY]))
    results = tmp_path / "results"
    process = start_cli(["multi", str(experiments), "--worker_count=1"], results)
    with killed_at_exit(process):
        assert wait_for(lambda: results.is_dir() and any(results.iterdir()), timeout=90, interval=0.05)
        neighbour = results / "neighbour_CartPole-v1_impala_20200101-000000"
        neighbour.mkdir()
        (neighbour / "summary.json").write_text(json.dumps({"ended": "stopped"}))
        assert not any((p / "summary.json").exists() for p in results.iterdir() if p != neighbour), \
            "experiment 1 ended before the neighbour stopped: the test proves nothing"
        _, stderr = process.communicate(timeout=180)
    assert process.returncode == 0, stderr[-3000:]
    assert "2/2 experiments succeeded" in stderr
    ours = [p for p in results.iterdir() if p != neighbour]
    assert len(ours) == 2
    assert [json.loads((run / "summary.json").read_text())["ended"] for run in sorted(ours)] == ["finished"] * 2


@pytest.mark.parametrize("text, words", [
    ("- {env: CartPole-v1\n  lr: [", "cannot read experiments"),       # not YAML
    ("env: CartPole-v1\n", "must hold a list of experiments"),          # a dict, not a list
])
def test_multi_file_that_is_not_a_list_of_experiments_is_one_line(cli, tmp_path, text, words):
    experiments = tmp_path / "experiments.yaml"
    experiments.write_text(text)
    results = tmp_path / "results"
    result = cli(["multi", str(experiments)], results)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and words in lines[0], result.stderr
    assert not results.exists()


def test_multi_train_main_runs_its_experiments_with_command_line_precedence(tmp_path):
    """multi_train.main with a small EXPERIMENTS list in place of the real one."""
    experiments = [{**TINY, "lr": 0.003}, {**TINY, "lr": 0.004, "gamma": 0.9}]
    results = tmp_path / "results"
    script = ("import json, sys, multi_train; multi_train.EXPERIMENTS[:] = json.loads(sys.argv[1]); "
              "sys.exit(multi_train.main(sys.argv[2:]))")
    result = subprocess.run([sys.executable, "-c", script, json.dumps(experiments), "--gamma=0.95", "--worker_count=1",
                             f"--results_dir={results}"], cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "2/2 experiments succeeded" in result.stderr
    saved, runs = configs(results)
    assert [c["lr"] for c in saved] == [0.003, 0.004]
    assert [c["gamma"] for c in saved] == [0.95, 0.95]      # the command line wins over an experiment
    assert all((run / "summary.json").exists() for run in runs)


def test_multi_train_bad_flag_is_one_line():
    result = subprocess.run([sys.executable, "multi_train.py", "--no_such_flag=1"], cwd=ROOT, capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0 and "no_such_flag" in result.stderr
