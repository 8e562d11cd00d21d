"""A learning test: only a working learner balances CartPole for hundreds of steps."""
import json

from herd_testing import only_run, run_cli


def test_cartpole_quick_start_learns(tmp_path):
    # The quick start's own defaults; a random policy averages about 22.
    result = run_cli(["train", "--env=CartPole-v1", "--seed=2", "--environment_max_steps=500000",
                      "--tensorboard=False"], tmp_path, timeout=240)
    assert result.returncode == 0, result.stderr[-2000:]
    summary = json.loads((only_run(tmp_path) / "summary.json").read_text())
    assert summary["environment_steps"] <= 500000 + 2 * 16 * 16
    # 200 is far beyond chance yet robust to a loaded CI machine (the time to 475 is in benchmarks/).
    # Pass rate: one seed must pass, this one. In the recorded runs of benchmarks/cartpole.py
    # (seeds 1-5: results/cartpole.json on a quiet machine, and before/after the seams on a
    # machine shared with other training runs) every one of 15 runs reached a best
    # 100-episode average of 284 or more, seed 2 at least 293.
    assert summary["max_average_score"] is not None and summary["max_average_score"] >= 200, summary
