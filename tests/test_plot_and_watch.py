"""`herd plot` and `herd watch` read a run folder back: synthetic runs with known numbers."""
import csv
import io
import json

import numpy as np
import pytest

from herd.errors import UserError
from herd.monitor.plot import group_labels, group_runs, plot_runs, score_curves
from herd.monitor.runfiles import moving_average
from herd.monitor.watch import watch


def write_csv(path, columns, rows):
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(columns)
        writer.writerows(rows)


def make_run(root, name, seed, replay, scores, hardware=True):
    run = root / name
    run.mkdir()
    (run / "config.json").write_text(json.dumps({"env": "CartPole-v1", "seed": seed, "avg_buff_size": 2,
                                                 "replay_parameters": replay, "environment_max_steps": 1000,
                                                 "results_dir": str(root)}))
    write_csv(run / "episodes.csv", ["episode", "score", "length", "env_step", "update", "wall_time", "unix_time"],
              [[i + 1, s, 10, 10 * (i + 1), i, float(i + 1), 0] for i, s in enumerate(scores)])
    write_csv(run / "train.csv", ["update", "env_step", "wall_time", "loss", "entropy", "policy_lag", "fps"],
              [[u, 10 * u, float(u), 1.0 / u, 0.6, 2.5, 1234.0] for u in range(1, 4)])
    if hardware:
        write_csv(run / "hardware.csv", ["time", "source", "metric", "value", "unit"],
                  [[0.0, "learner", "cpu", 10.0, "%"], [5.0, "learner", "cpu", 90.0, "%"],
                   [5.0, "learner", "rss", 400.0, "MiB"], [5.0, "replay", "stored", 12.5, "MiB"]])
    return run


def test_moving_average():
    assert moving_average(np.array([1.0, 3.0, 5.0, 7.0]), 2).tolist() == [1.0, 2.0, 4.0, 6.0]


def test_runs_group_by_configuration_and_curves_show_mean_and_spread(tmp_path):
    a1 = make_run(tmp_path, "a1", 1, "uniform", [0, 2, 4, 6])
    a2 = make_run(tmp_path, "a2", 2, "uniform", [2, 4, 6, 8])
    b = make_run(tmp_path, "b", 1, "elite", [10, 10, 10, 10])
    groups = group_runs([a1, b, a2])
    assert sorted(len(g) for g in groups) == [1, 2]
    labels = group_labels(groups)
    assert any("replay_parameters=uniform (2 runs)" in label for label in labels)
    grid, curves = score_curves([[a1], [a2]], "env_step")
    assert grid[0] == 10 and grid[-1] == 40 and curves.shape == (2, len(grid))
    assert curves[:, -1].tolist() == [5.0, 7.0]            # each run's last 2-game average


def test_replay_lists_that_differ_late_get_different_short_labels(tmp_path):
    queue = '{"type": "queue", "capacity": 1, "sample_ratio": 0.5}'
    uniform = f'[{queue}, {{"type": "standard", "capacity": 500, "sample_ratio": 0.5}}]'
    elite = (f'[{queue}, {{"type": "custom", "capacity": 500, "sample_ratio": 0.5, "dist_function": "ln_norm", '
             '"sample_strategy": "elite_sampling"}]')
    runs = [make_run(tmp_path, "u", 1, uniform, [1, 2]), make_run(tmp_path, "e", 1, elite, [1, 2])]
    labels = group_labels(group_runs(runs))
    assert sorted(labels) == ["replays: queue 0.5 + custom/elite_sampling 0.5 (1 run)",
                              "replays: queue 0.5 + standard 0.5 (1 run)"]


def test_plot_writes_figures_per_configuration_or_compared(tmp_path):
    runs = [make_run(tmp_path, n, s, r, [1, 2, 3]) for n, s, r in (("a1", 1, "u"), ("a2", 2, "u"), ("b", 1, "e"))]
    compared = plot_runs([str(r) for r in runs], str(tmp_path / "cmp"), compare=True)
    assert sorted(p.name for p in compared) == ["score_vs_steps.png", "score_vs_time.png", "training.png"]
    assert all(p.read_bytes().startswith(b"\x89PNG") for p in compared)
    separate = plot_runs([str(r) for r in runs], str(tmp_path / "sep"))
    assert len(separate) == 6 and len({p.parent for p in separate}) == 2
    with pytest.raises(UserError, match="not a herd run folder"):
        plot_runs([str(tmp_path)])


def test_watch_once_shows_the_run(tmp_path):
    from rich.console import Console
    run = make_run(tmp_path, "a", 1, "u", [1, 3, 5, 7])
    (run / "summary.json").write_text(json.dumps({"ended": "finished"}))
    out = io.StringIO()
    assert watch(str(run), once=True, console=Console(file=out, width=120)) == 0
    text = out.getvalue()
    assert "ended: finished" in text and "40 of 1,000" in text and "6.00" in text     # last 2 games: 5, 7
    assert "1234" in text and "2.5" in text and "12.5 MiB stored" in text and "learner" in text


def test_tensorboard_dashboard_charts_the_algorithms_losses(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from herd.monitor.metrics import RunMetrics
    columns = ["update", "env_step", "loss", "pg_loss", "value_loss", "entropy", "grad_norm", "lr", "fps"]
    metrics = RunMetrics(tmp_path, tensorboard=True, train_columns=columns)
    metrics.training(10, {"loss": 1.0, "fps": 5.0})
    metrics.close()
    events = EventAccumulator(str(tmp_path / "tensorboard"), size_guidance={"tensors": 0})
    events.Reload()
    assert "custom_scalars__config__" in events.Tags()["tensors"]
    layout = events.Tensors("custom_scalars__config__")[0].tensor_proto.string_val[0]
    for chart in (b"train/pg_loss", b"train/value_loss", b"train/entropy", b"hardware/.*/cpu"):
        assert chart in layout


def test_labels_show_long_values_from_where_they_differ(tmp_path):
    queue = '[{"type": "queue", "capacity": 1, "sample_ratio": 0.8}, {"type": "'
    runs = [make_run(tmp_path, kind, 1, queue + kind + '", "capacity": 1000, "sample_ratio": 0.2}]', [1, 2])
            for kind in ("standard", "custom")]
    labels = group_labels(group_runs(runs))
    assert len({label for label in labels}) == 2
    assert sorted(labels) == ["replays: queue 0.8 + custom 0.2 (1 run)", "replays: queue 0.8 + standard 0.2 (1 run)"]


def test_other_long_values_show_from_where_they_differ(tmp_path):
    runs = [make_run(tmp_path, kind, 1, "x", [1, 2]) for kind in ("a", "b")]
    for run, tail in zip(runs, ("first", "second")):
        config = json.loads((run / "config.json").read_text())
        config["note"] = "a long common beginning of the two notes, then " + tail
        (run / "config.json").write_text(json.dumps(config))
    labels = group_labels(group_runs(runs))
    assert sorted(labels) == ["note=...first (1 run)", "note=...second (1 run)"]


def watch_text(run, now=None) -> str:
    from rich.console import Console
    from herd.monitor.watch import snapshot
    out = io.StringIO()
    Console(file=out, width=160).print(snapshot(run, now=now))
    return " ".join(out.getvalue().split())


def test_watch_shows_average_frames_per_second_elapsed_time_and_eta(tmp_path):
    """Catches watch showing only the last interval's frames/s, and no elapsed time or ETA:
    40 steps in 4 s of training is 10 frames/s on average, so 960 steps to go is 1:36."""
    run = make_run(tmp_path, "a", 1, "u", [1, 3, 5, 7])
    text = watch_text(run)
    assert "frames/s (average / last) 10 / 1234" in text
    assert "elapsed / ETA 0:00:04 / 0:01:36" in text
    (run / "summary.json").write_text(json.dumps({"ended": "finished"}))
    assert "elapsed / ETA 0:00:04 / -" in watch_text(run)


def test_watch_says_when_a_run_went_silent_without_ending(tmp_path):
    """Catches a run killed with kill -9 shown with its stale numbers forever: silent for
    longer than a minute and without summary.json, it gets a "no news for N s" line; a
    run that ended, or wrote a moment ago, does not."""
    import os
    import time
    run = make_run(tmp_path, "a", 1, "u", [1, 3, 5, 7])
    written = time.time() - 300
    for name in ("episodes.csv", "train.csv", "hardware.csv"):
        os.utime(run / name, (written, written))
    assert "no news for 300 s" in watch_text(run, now=written + 300)
    assert "no news" not in watch_text(run, now=written + 10)
    (run / "summary.json").write_text(json.dumps({"ended": "stopped"}))
    assert "no news" not in watch_text(run, now=written + 300)
