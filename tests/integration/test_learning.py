"""A learning test: only a working learner balances CartPole for hundreds of steps."""
import json

from herd_testing import only_run, run_cli


def test_cartpole_quick_start_learns(tmp_path):
    # The quick start's own defaults; a random policy averages about 22.
    result = run_cli(["train", "--env=CartPole-v1", "--seed=2", "--environment_max_steps=250000",
                      "--tensorboard=False"], tmp_path, timeout=240)
    assert result.returncode == 0, result.stderr[-2000:]
    summary = json.loads((only_run(tmp_path) / "summary.json").read_text())
    assert summary["environment_steps"] <= 250000 + 2 * 16 * 16
    # 200 is far beyond chance yet robust to a loaded CI machine (the time to 475 is in benchmarks/).
    # Pass rate: one seed must pass, this one. Six runs of seed 2 on the 2-core Intel machine
    # under load 5-7 (2026-11-24, 500,000 steps each, episodes.csv read back) first reached a
    # 100-game average of 200 after 43,008 / 53,248 / 55,808 / 60,160 / 94,976 / 192,768
    # steps, and their best averages by 250,000 steps were 270 to 500: 6 of 6 pass at this
    # budget. In the recorded runs of benchmarks/cartpole.py (seeds 1-5: results/cartpole.json
    # on a quiet machine, and before/after the seams on a machine shared with other training
    # runs) every one of 15 runs reached a best 100-episode average of 284 or more at 500,000.
    # Those runs learned from raw rewards; with the vector profile's reward scale 0.1 (the
    # default since), 30 of 30 seeds reached 475 within 253,000 steps (results/
    # cartpole_20_defaults.json, cartpole_issue16_reward_scale_0.1.json), and this test passed.
    assert summary["max_average_score"] is not None and summary["max_average_score"] >= 200, summary
