"""Fixtures several integration modules share."""
import pytest

from herd_testing import only_run, run_cli


@pytest.fixture(scope="session")
def small_cartpole_run(tmp_path_factory):
    """A few seconds of CartPole training (one actor, 2,048 steps, seed 1): a real run
    folder with a checkpoint, config and metric files, not a good player. Read-only: a
    test that changes it works on a copy (herd_testing.copy_of_run)."""
    results = tmp_path_factory.mktemp("small_cartpole")
    result = run_cli(["train", "--env=CartPole-v1", "--environment_max_steps=2000", "--worker_count=1", "--seed=1",
                      "--tensorboard=False"], results)
    assert result.returncode == 0, result.stderr[-2000:]
    return only_run(results)
