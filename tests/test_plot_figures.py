"""`herd plot` figures fit for a paper, checked by their data and axes
(matplotlib objects), not their bytes: resumed runs joined, grouping on learning options
only, standard-error and bootstrap bands, smoothing, titles, tick labels, formats, and a
folder with no games refused."""
import csv
import json

import numpy as np
import pytest

from herd.cli import main
from herd.errors import UserError
from herd.monitor.plot import (band_of, group_labels, group_runs, plot_runs, readable, score_curves, score_figure,
                               training_figure)


def write_csv(path, columns, rows):
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(columns)
        writer.writerows(rows)


def make_run(root, folder, scores, first_update=0, continues_from=None, **config):
    """A run folder whose i-th game ends at env_step 10*(first_update+i+1), update first_update+i."""
    run = root / folder
    run.mkdir()
    full = {"env": "CartPole-v1", "algorithm": "impala", "seed": 1, "avg_buff_size": 1, "lr": 0.001,
            "tensorboard": True, "results_dir": str(root), **config}
    if continues_from:
        full["continues_from"] = continues_from
    (run / "config.json").write_text(json.dumps(full))
    steps = range(first_update, first_update + len(scores))
    write_csv(run / "episodes.csv", ["episode", "score", "length", "env_step", "update", "wall_time", "unix_time"],
              [[u + 1, s, 10, 10 * (u + 1), u, float(u + 1), 0] for u, s in zip(steps, scores)])
    write_csv(run / "train.csv", ["update", "env_step", "wall_time", "loss", "fps"],
              [[u, 10 * (u + 1), float(u + 1), 1.0, 100.0] for u in steps])
    return run


def test_a_resumed_run_is_joined_to_the_run_it_continues(tmp_path):
    """Catches a stopped run and its resumed continuation averaged as '2 runs', and the
    stopped run's games after its checkpoint (lost work) kept in the joined curve."""
    first = make_run(tmp_path, "first", [1, 2, 3, 4, 99, 99])          # updates 0..5; resumed from update 3
    resumed = make_run(tmp_path, "resumed", [5, 6, 7], first_update=4,
                       continues_from=str(tmp_path / "first" / "checkpoints" / "ckpt_0000000003.pt"))
    groups = group_runs([resumed, first])
    assert groups == [[[first, resumed]]]
    assert group_labels(groups) == ["CartPole-v1 (1 run)"]
    grid, curves = score_curves(groups[0], "env_step")
    assert (grid[0], grid[-1]) == (10, 70) and curves.shape == (1, len(grid))
    assert np.interp([10, 40, 50, 70], grid, curves[0]).tolist() == [1, 4, 5, 7]   # 99s cut, no jump


def test_runs_that_differ_only_in_logging_or_names_are_one_configuration(tmp_path):
    """Catches tensorboard=False, a run name or provenance counting as another configuration."""
    a = make_run(tmp_path, "a", [1, 2], seed=1)
    b = make_run(tmp_path, "b", [3, 4], seed=2, tensorboard=False, name="x", provenance={"git_commit": "abc"},
                 results_dir="elsewhere", eval_interval="100")
    c = make_run(tmp_path, "c", [5, 6], lr=0.01)
    groups = group_runs([a, b, c])
    assert sorted(len(g) for g in groups) == [1, 2]
    assert sorted(group_labels(groups)) == ["lr=0.001 (2 runs)", "lr=0.01 (1 run)"]


def test_the_band_is_the_standard_error_or_a_bootstrap_interval_of_the_mean():
    """Catches a min-max band (the issue), and a bootstrap interval that is not about the mean."""
    curves = np.array([[0.0, 10.0], [2.0, 10.0], [4.0, 10.0], [10.0, 10.0]])
    low, high = band_of(curves, "se")
    se = np.std([0, 2, 4, 10], ddof=1) / 2
    assert np.allclose(low, [4 - se, 10]) and np.allclose(high, [4 + se, 10])
    low, high = band_of(curves, "bootstrap")
    assert 0 < low[0] < 4 < high[0] < 10 and low[1] == high[1] == 10
    assert band_of(curves[:1], "se") is None and band_of(curves, "none") is None


def test_the_score_figure_draws_the_mean_and_band_with_a_title_and_readable_ticks(tmp_path):
    """Catches figures without a title naming the environment, raw tick labels, and a
    drawn mean or band that is not the runs' mean and standard error."""
    runs = [make_run(tmp_path, f"r{i}", scores, seed=i) for i, scores in enumerate(([0, 0, 0], [2, 4, 6]))]
    groups = group_runs(runs)
    fig = score_figure(groups, group_labels(groups), "env_step", band="se")
    ax = fig.axes[0]
    assert ax.get_title() == "CartPole-v1 (impala)" and ax.get_xlabel() == "environment steps"
    [line] = ax.get_lines()
    assert np.allclose(np.interp([10, 30], line.get_xdata(), line.get_ydata()), [1, 3])
    [band] = ax.collections
    ys = band.get_paths()[0].vertices[:, 1]
    assert np.isclose(ys.max(), 6.0) and np.isclose(ys.min(), 0.0)   # mean 3 -+ se 3 at the end
    assert ax.get_legend().get_title().get_text() == "band: standard error of the mean"
    assert [readable(v) for v in (1_500_000, 200_000, 12, 0.25)] == ["1.5M", "200k", "12", "0.25"]
    assert ax.xaxis.get_major_formatter()(2_000_000, 0) == "2M"
    assert training_figure(groups, group_labels(groups))._suptitle.get_text() == "CartPole-v1 (impala)"


def test_smoothing_averages_over_grid_points(tmp_path):
    """Catches --smooth being ignored or shifting the curve's end."""
    run = make_run(tmp_path, "r", [0, 10] * 20)
    raw = score_curves([[run]], "env_step")[1][0]
    smooth = score_curves([[run]], "env_step", smooth=20)[1][0]
    assert np.ptp(smooth[40:]) < np.ptp(raw[40:]) / 2
    assert np.isclose(smooth[-1], raw[-20:].mean())


@pytest.mark.parametrize("file_format, magic", [("png", b"\x89PNG"), ("pdf", b"%PDF"), ("svg", b"<?xml")])
def test_figures_are_written_in_the_asked_format(tmp_path, file_format, magic):
    """Catches --format being ignored (PNG only, the issue)."""
    run = make_run(tmp_path, "r", [1, 2, 3])
    written = plot_runs([str(run)], str(tmp_path / "out"), file_format=file_format, dpi=300)
    assert sorted(p.name for p in written) == sorted(f"{n}.{file_format}" for n in
                                                     ("score_vs_steps", "score_vs_time", "training"))
    assert all(p.read_bytes().startswith(magic) for p in written)


def test_a_folder_with_no_games_is_refused_in_one_line(tmp_path, capsys):
    """Catches `herd plot` on a test folder or a fresh run writing blank figures and exiting 0."""
    run = make_run(tmp_path, "empty", [])
    with pytest.raises(UserError, match="no finished games yet"):
        plot_runs([str(run)])
    assert main(["plot", str(run)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no finished games yet" in err
    assert not (run / "plots").exists()
