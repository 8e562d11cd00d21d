"""The evaluation worker in a real run: whole games at the interval, eval.csv, a video."""
import csv

import pytest

from herd_testing import only_run, run_cli
from herd.config import ConfigError, parse_eval_interval


def test_interval_in_updates_or_seconds():
    assert parse_eval_interval("500") == (500, None) and parse_eval_interval("60s") == (None, 60.0)
    for bad in ("0", "-5", "1.5", "fast", "infs", "nans"):
        with pytest.raises(ConfigError, match="--eval_interval"):
            parse_eval_interval(bad)


def test_a_run_evaluates_every_n_updates_and_records_a_video(tmp_path):
    result = run_cli(["train", "--env=CartPole-v1", "--environment_max_steps=40000", "--tensorboard=False",
                      "--eval_interval=60", "--eval_episodes=3", "--eval_video_every=1", "--seed=4"], tmp_path,
                     timeout=180)
    assert result.returncode == 0, result.stderr[-2000:]
    run = only_run(tmp_path)
    with open(run / "eval.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert rows, "no evaluation in a run of 300 updates"
    updates = [int(r["update"]) for r in rows]
    # Published at updates 60, 120, ...: the worker evaluates the newest it finds when idle.
    assert all(u % 60 == 0 for u in updates) and updates == sorted(set(updates))
    assert all(int(r["episodes"]) == 3 and 1 <= float(r["min"]) <= float(r["mean"]) <= float(r["max"]) <= 500
               for r in rows)
    assert (run / "eval_videos" / f"eval_{updates[0]:08d}.mp4").stat().st_size > 1000
