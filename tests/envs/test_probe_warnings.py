"""Probing an environment id prints no gymnasium warnings: herd's own one line says what
is wrong, with gymnasium's deprecation note folded in where there is one."""
import warnings

import gymnasium as gym

from herd.envs import EnvError, env_kind


def missing_dependency(**kwargs):
    raise ImportError("HerdProbe needs a package that is not installed")


# v0 is out of date once v1 exists: gymnasium warns on making it.
gym.register("HerdProbeBroken-v0", entry_point=missing_dependency)
gym.register("HerdProbeBroken-v1", entry_point=missing_dependency)
gym.register("HerdProbeFine-v0", entry_point="gymnasium.envs.classic_control:CartPoleEnv")
gym.register("HerdProbeFine-v1", entry_point="gymnasium.envs.classic_control:CartPoleEnv")


def probe(env_id):
    """env_kind's result or error, and every warning that escaped it."""
    with warnings.catch_warnings(record=True) as escaped:
        warnings.simplefilter("always")
        try:
            return env_kind(env_id), escaped
        except EnvError as err:
            return err, escaped


def test_a_failing_out_of_date_env_gives_one_error_with_the_deprecation_in_it():
    err, escaped = probe("HerdProbeBroken-v0")
    assert isinstance(err, EnvError) and escaped == []
    message = str(err)
    assert "\n" not in message and "\x1b" not in message and "WARN:" not in message
    assert "could not be created: HerdProbe needs a package" in message
    assert "HerdProbeBroken-v0 is out of date" in message and "`v1`" in message


def test_a_working_out_of_date_env_is_probed_silently():
    assert probe("HerdProbeFine-v0") == ("vector", [])


def test_the_cli_says_one_line_for_an_out_of_date_env(cli, tmp_path):
    """HalfCheetah-v4: gymnasium's DeprecationWarning (two lines) and MuJoCo's own warnings
    came before herd's error or the run. herd runs the MuJoCo v5 tasks and refuses older
    ones before making them (herd/envs/extras.py): one line, naming v5."""
    result = cli(["train", "--env=HalfCheetah-v4"], tmp_path / "results")
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("herd: error:"), result.stderr
    assert "HalfCheetah-v4' is out of date" in lines[0] and "HalfCheetah-v5" in lines[0], result.stderr
    assert not (tmp_path / "results").exists()
