"""Custom environments named gymnasium's way, `pkg.module:EnvId-v0`, end to end: the
example package under examples/custom_env (on PYTHONPATH, as an uninstalled package would
be) trained by two actor processes with the evaluation worker on, then tested."""
import csv
import json
import os
import subprocess
import sys

from herd_testing import ROOT, only_run

EXAMPLE = ROOT / "examples" / "custom_env"
ENV = "herd_example_envs:Match-v0"
RANDOM_SCORE = 20 / 4        # Match-v0: 20 presses, 4 lights, reward 1 per right press


def herd(args, results, timeout=240):
    # PYTHONPATH names the example package only: herd itself comes from the repository root (cwd).
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(EXAMPLE)])}
    return subprocess.run([sys.executable, "-m", "herd.cli", *args, f"--results_dir={results}"], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout, env=env)


def test_custom_env_package_trains_with_two_actors_and_tests(tmp_path):
    """Catches a `module:` id imported only in the launching process: the two spawned actors
    and the evaluation worker would then fail to make Match-v0 (gymnasium does not know it
    there) and the run would end without episodes or evaluations; and a test mode that does
    not import it. The learned policy must also beat chance, so the actors really played it."""
    train = herd(["train", f"--env={ENV}", "--worker_count=2", "--environment_max_steps=30000", "--seed=1",
                  "--eval_interval=50", "--eval_episodes=2", "--eval_video_every=0", "--tensorboard=False"],
                 tmp_path / "train")
    assert train.returncode == 0, train.stderr[-2000:]
    run = only_run(tmp_path / "train")
    assert json.loads((run / "config.json").read_text())["env"] == ENV
    with open(run / "episodes.csv", newline="") as f:
        episodes = list(csv.DictReader(f))
    assert len(episodes) >= 1000            # 30,000 steps of 20-step games, by both actors
    with open(run / "eval.csv", newline="") as f:
        assert list(csv.DictReader(f)), "the evaluation worker played no Match-v0 game"

    # --env again: herd imports a module a checkpoint names only when the command line names it too
    test = herd(["test", str(run), f"--env={ENV}", "--test_episode_count=10", "--render=False"], tmp_path / "test")
    assert test.returncode == 0, test.stderr[-2000:]
    results = json.loads(next((tmp_path / "test").rglob("test_results.json")).read_text())
    # Chance is 5 +- 0.6 for a mean of 10 games; the run ends near 18.
    assert results["mean"] > RANDOM_SCORE + 5, results


def test_a_module_that_cannot_be_imported_is_one_line(tmp_path):
    """Catches a traceback (or gymnasium's 'doesn't exist') instead of herd's one line naming
    the module to install, and a run folder made before the env was checked."""
    result = herd(["train", "--env=no_such_herd_package.envs:Foo-v0"], tmp_path)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "cannot import module 'no_such_herd_package.envs'" in lines[0], result.stderr
    assert not tmp_path.exists() or not any(tmp_path.iterdir())


def test_an_id_the_module_does_not_register_is_refused_with_a_hint(tmp_path):
    """Catches a module that imports but does not register the id reaching gym.make's
    traceback, and a 'did you mean' that misses the id the module did register."""
    result = herd(["train", "--env=herd_example_envs:Matchh-v0"], tmp_path)
    assert result.returncode == 2
    assert "unknown environment 'Matchh-v0'" in result.stderr and "Match-v0" in result.stderr, result.stderr


def test_custom_env_on_ray_actors(tmp_path):
    """Catches Ray actors (processes Ray's raylet starts, which never ran the launcher's
    imports) that cannot make a `module:` id: the run would end with no game played."""
    train = herd(["train", f"--env={ENV}", "--worker_count=2", "--environment_max_steps=6000", "--seed=2",
                  "--multiprocessing_backend=ray", "--tensorboard=False"], tmp_path, timeout=400)
    assert train.returncode == 0, train.stderr[-2000:]
    run = only_run(tmp_path)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["ended"] == "finished" and summary["environment_steps"] >= 6000 and summary["episodes"] >= 200, summary
    assert "learner_node" in summary, summary        # the Ray backend ran (the local one has no nodes)
