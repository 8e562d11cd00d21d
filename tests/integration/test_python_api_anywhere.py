"""herd.train as users meet it (herd/api_run.py): the README's example run as a script
without a main guard, as a heredoc, with `python -c` and as a module with `-m`, each a
real process of its own, as a user's would be. The actors start by fork server or spawn,
which re-import the __main__ of the process that starts them: herd.train must start them
from a process whose __main__ is herd's, never the caller's."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

import herd
from herd_testing import ROOT
from herd.errors import UserError

# The README's example, small: a few thousand CartPole steps, one actor.
EXAMPLE = """import herd
run = herd.train(env="CartPole-v1", environment_max_steps=3000, worker_count=1, tensorboard=False,
                 results_dir={results!r})
print("RUN_DIR", run.run_dir)
"""

# An environment whose every step raises: its actors die, and the run fails.
BROKEN_ENV = """import gymnasium as gym
import numpy as np

class Broken(gym.Env):
    observation_space = gym.spaces.Box(-1, 1, (4,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, render_mode=None):
        self.render_mode = render_mode

    def reset(self, seed=None, options=None):
        return np.zeros(4, np.float32), {}

    def step(self, action):
        raise RuntimeError("this environment is broken")

gym.register(id="Broken-v0", entry_point=Broken)
"""


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    """One results folder for every run of this module."""
    return tmp_path_factory.mktemp("anywhere")


def python(args, cwd, stdin=None, timeout=240) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, *args], cwd=cwd, input=stdin, capture_output=True, text=True,
                          timeout=timeout, env=env)


def run_dir_of(result: subprocess.CompletedProcess):
    assert result.returncode == 0, result.stderr[-3000:]
    lines = [line.split(" ", 1)[1] for line in result.stdout.splitlines() if line.startswith("RUN_DIR ")]
    assert len(lines) == 1, result.stdout[-2000:]
    return Path(lines[0])


@pytest.mark.parametrize("way", ["script", "heredoc", "dash_c", "dash_m"])
def test_the_readme_example_trains_from_anywhere(results, tmp_path, way):
    """Catches actors that re-import the caller's __main__: a script without a main guard
    would run herd.train again in each ('before the current process has finished its
    bootstrapping phase'), a heredoc's has no file ('<stdin>' not found), and every actor
    dies; the run must instead end with a checkpoint in the folder herd.train returns."""
    code = EXAMPLE.format(results=str(results))
    if way == "script":
        (tmp_path / "train.py").write_text(code)
        result = python(["train.py"], tmp_path)
    elif way == "heredoc":
        result = python(["-"], tmp_path, stdin=code)
    elif way == "dash_c":
        result = python(["-c", code], tmp_path)
    else:
        (tmp_path / "user_train.py").write_text(code)
        result = python(["-m", "user_train"], tmp_path)
    run_dir = run_dir_of(result)
    assert run_dir.parent == results
    assert list((run_dir / "checkpoints").glob("*.pt")), sorted(p.name for p in run_dir.rglob("*"))
    assert (run_dir / "summary.json").is_file() and "died" not in result.stderr, result.stderr[-3000:]


def test_a_failing_run_raises_run_failed_with_the_logs_cause(results, tmp_path):
    """Catches a failed run reported without its cause (only an exit code), or as several
    errors: a `module:Id` environment found on the caller's sys.path (as a notebook's
    sys.path.insert would put it) reaches the actors, whose every step raises; herd.train
    raises one RunFailed whose message carries log.txt's last error line."""
    (tmp_path / "envs").mkdir()
    (tmp_path / "envs" / "broken_env.py").write_text(BROKEN_ENV)
    code = (f"import sys; sys.path.insert(0, {str(tmp_path / 'envs')!r})\n"
            "import herd\n"
            "try:\n"
            "    herd.train(env='broken_env:Broken-v0', environment_max_steps=3000, worker_count=1,\n"
            f"               tensorboard=False, max_actor_restarts=1, results_dir={str(results)!r})\n"
            "except herd.RunFailed as err:\n"
            "    print('FAILED', err)\n")
    result = python(["-"], tmp_path, stdin=code)
    assert result.returncode == 0, result.stderr[-3000:]
    failed = [line for line in result.stdout.splitlines() if line.startswith("FAILED ")]
    assert len(failed) == 1, result.stdout[-2000:] + result.stderr[-2000:]
    assert "ended with exit code 1: actors failed 2 times" in failed[0] and "log.txt" in failed[0], failed[0]
    assert "this environment is broken" in result.stderr     # the actors' own error, shown as it happened


def test_a_bad_option_value_raises_one_user_error(tmp_path):
    """Catches a bad value that the training process reports as a failed run (or not at
    all) instead of the command line's one line as the one UserError, with no run folder."""
    with pytest.raises(UserError, match=r"--lr: 'fast' is not a valid float"):
        herd.train(env="CartPole-v1", lr="fast", results_dir=str(tmp_path / "r"))
    assert not (tmp_path / "r").exists()
