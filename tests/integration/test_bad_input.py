"""Bad input: one clear line on stderr, exit code 2, nothing started and nothing written.

Every case runs through both entry points in this process (the `cli` fixture: herd's CLI
function with the argument list, file descriptor 2 captured); a few, chosen to cover each
layer that refuses (the parser, the replay spec, the environment probe with ALE's C
library, the memory check), also run as real `herd` and `python main.py` processes, where
the exit code, the single line and the absence of a traceback are the process's own."""
import pytest

from herd_testing import run_cli

CASES = [
    (["--env=CartPole-v1", "--replay_parameters=[{\"type\": \"queue\""], "not valid JSON"),
    (["--env=CartPole-v1", '--replay_parameters=[{"type": "queue", "capacity": 1, "sample_ratio": 0.4}]'], "sum to 1"),
    (["--env=CartPole-v1", '--replay_parameters=[{"type": "lifo", "capacity": 1, "sample_ratio": 1}]'], "unknown replay type"),
    (["--env=NoSuchGame-v9"], "NoSuchGame-v9"),
    # Pendulum (a Box action space) runs now (continuous control); pixel observations other
    # than Atari's are still refused.
    (["--env=CarRacing-v3"], "1-D Box (vector) observations or Atari frames"),
    (["--env=CartPole-v1", "--batch_size=0"], "--batch_size must be >= 1"),
    (["--env=CartPole-v1", "--envs_per_worker=-2"], "--envs_per_worker must be >= 1"),
    (["--env=PongNoFrameskip-v4", '--replay_parameters=[{"type": "standard", "capacity": 100000000, "sample_ratio": 1}]'],
     "GiB"),
    (["--env=CartPole-v1", "--lr=fast"], "not a valid float"),
    (["--env=CartPole-v1", "--no_such_option=1"], "no_such_option"),
    (["--env=CartPole-v1", "--env_backend=ale_vector"], "Atari games only"),
    (["--env=Acrobot-v1", "--env_backend=numpy"], "CartPole-v0 and CartPole-v1, not 'Acrobot-v1'"),
    (["--env=CartPole-v1", "--envs_per_worker=4", "--env_batch_size=2"], "which only --env_backend=ale_vector does"),
    (["--env=PongNoFrameskip-v4", "--envs_per_worker=4", "--env_batch_size=5"], "--env_batch_size"),
    (["--env=CartPole-v1", "--actor_inference=gpu"], "not one of"),
    (["--env=PongNoFrameskip-v4", '--replay_parameters=[{"type": "custom", "capacity": 10, "sample_ratio": 1, '
      '"dist_function": "ln_norm", "sample_strategy": "best"}]'], "sample_strategy"),
    (["--env=PongNoFrameskip-v4", '--replay_parameters=[{"type": "custom", "capacity": 10, "sample_ratio": 1, '
      '"dist_function": "ln_norm", "lambda": 6}]'], "unknown key 'lambda'"),
    # The Ray backend's options: an unreachable head is one line within seconds, not a hang.
    (["--env=CartPole-v1", "--multiprocessing_backend=ray", "--ray_address=127.0.0.1:1"], "cannot reach a Ray head"),
    (["--env=CartPole-v1", "--multiprocessing_backend=ray", "--actor_cpus=1.5"], "--actor_cpus must be > 0"),
    (["--env=CartPole-v1", "--algorithm=dqn"], "--algorithm: 'dqn' is not one of impala"),
    (["--env=CartPole-v1", "--actions_count=3"], "--actions_count=3 but CartPole-v1 has 2 actions"),
    (["--env=PongNoFrameskip-v4", "--observation_shape=(3, 84, 84)"], "gives 4,84,84 after preprocessing"),
    # Ape-X's options
    (["--env=CartPole-v1", "--algorithm=apex", "--n_step=0"], "--n_step must be >= 1"),
    (["--env=CartPole-v1", "--algorithm=apex", "--n_step=17"], "longer than a trajectory"),
    (["--env=CartPole-v1", "--algorithm=apex", "--target_update_period=0"], "--target_update_period must be >= 1"),
    (["--env=CartPole-v1", "--algorithm=apex", "--apex_epsilon=1.5"], "--apex_epsilon must be in [0, 1]"),
    (["--env=CartPole-v1", "--algorithm=apex", "--apex_alpha=-1"], "--apex_alpha must be"),
    (["--env=CartPole-v1", "--algorithm=apex", "--apex_test_epsilon=2"], "--apex_test_epsilon must be in [0, 1]"),
    (["--env=CartPole-v1", "--algorithm=apex", "--replay_ratio=0"], "--replay_ratio must be a number > 0"),
    (["--env=CartPole-v1", "--replay_ratio=2"], "--replay_ratio paces training without a queue"),
    (["--env=CartPole-v1", "--algorithm=apex", "--actor_inference=server"], "need their own model"),
    (["--env=CartPole-v1", "--algorithm=apex", '--replay_parameters=[{"type": "standard", "capacity": 10, '
      '"sample_ratio": 1}]'], "apex does not train from a 'standard' replay"),
    (["--env=CartPole-v1", '--replay_parameters=[{"type": "prioritized", "capacity": 10, "sample_ratio": 1}]'],
     "impala does not train from a 'prioritized' replay"),
    (["--env=CartPole-v1", "--algorithm=apex", '--replay_parameters=[{"type": "prioritized", "capacity": 10, '
      '"sample_ratio": 1, "gamma": 1}]'], "unknown key 'gamma' for type 'prioritized'"),
    (["--env=CartPole-v1", "--algorithm=apex", '--replay_parameters=[{"type": "prioritized", "capacity": 10, '
      '"sample_ratio": 1, "beta": 2}]'], "beta must be a number in [0, 1]"),
    (["--env=CartPole-v1", "--algorithm=apex", '--replay_parameters=[{"type": "prioritized", "capacity": 10, '
      '"sample_ratio": 1, "beta_annealing_steps": -1}]'], "beta_annealing_steps must be an integer >= 0"),
]


# Indices into CASES that also run as real processes: JSON, the environment probe (ALE's
# C library prints a banner unless silenced), the replay memory check, argparse.
IN_A_REAL_PROCESS = [0, 3, 7, 9]


def command(entry, args):
    return ["--op_mode=train", *args] if entry == "main" else ["train", *args]


# `herd train` takes no test-mode option (herd/cli_options.py): it refuses one before its value is checked.
HERD_TRAIN_WORDS = {"--apex_test_epsilon must be in [0, 1]": "--apex_test_epsilon is not an option of herd train"}


@pytest.mark.parametrize("entry", ["main", "herd"])
@pytest.mark.parametrize("args, words", CASES)
def test_bad_input_is_one_line_and_nonzero(cli, tmp_path, entry, args, words):
    result = cli(command(entry, args), tmp_path / "results", entry=entry)
    assert_refused(result, HERD_TRAIN_WORDS.get(words, words) if entry == "herd" else words, tmp_path)


@pytest.mark.parametrize("entry", ["main", "herd"])
@pytest.mark.parametrize("args, words", [CASES[i] for i in IN_A_REAL_PROCESS],
                         ids=[f"args{i}" for i in IN_A_REAL_PROCESS])
def test_bad_input_in_a_real_process_is_one_line_and_nonzero(tmp_path, entry, args, words):
    result = run_cli(command(entry, args), tmp_path / "results", entry=entry, timeout=60)
    assert_refused(result, words, tmp_path)


def assert_refused(result, words, tmp_path):
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert words.lower() in lines[0].lower()
    assert not (tmp_path / "results").exists()  # nothing was created
