"""`herd plot RUN [RUN ...]`: PNG figures of runs, headless (matplotlib's Agg backend).

Runs are grouped by configuration (every option but the seed and paths, from config.json).
Each group is drawn as the mean of its runs' 100-game moving-average score with the band
from the lowest to the highest run, against environment steps and against wall time;
then losses, policy lag and frames per second from train.csv. Without --compare each
group gets its own figures (a folder per group); with --compare the groups share axes,
labelled by the options in which they differ (elite vs uniform replay, say)."""
from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from herd.monitor.runfiles import check_run_dir, configuration_key, moving_average, read_config, read_table

TRAIN_PANELS = (("loss", "loss"), ("pg_loss", "policy-gradient loss"), ("value_loss", "value loss"),
                ("entropy", "entropy"), ("policy_lag", "policy lag (updates)"), ("fps", "frames per second"))
GRID_POINTS = 200


def group_runs(runs: list[Path]) -> list[list[Path]]:
    groups: dict[tuple, list[Path]] = {}
    for run in runs:
        groups.setdefault(configuration_key(read_config(run)), []).append(run)
    return list(groups.values())


def shown(value: str, common_start: str) -> str:
    return "..." + value[len(common_start):] if len(common_start) > 20 else value


def group_labels(groups: list[list[Path]]) -> list[str]:
    """Each group named by the options whose values differ between groups; labels that
    still coincide once shortened get a number, so no two curves share a name."""
    configs = [read_config(group[0]) for group in groups]
    keys = sorted({k for c in configs for k in c} - {"seed", "results_dir", "load_model_url", "continues_from"})
    differing = [k for k in keys if len({str(c.get(k)) for c in configs}) > 1]
    # A long value (a --replay_parameters list) often differs only after a long common
    # start; show it from where the groups part, or the labels cut at 80 look the same.
    common = {k: os.path.commonprefix([str(c.get(k)) for c in configs]) for k in differing}
    labels = []
    for config, group in zip(configs, groups):
        text = ", ".join(describe_option(k, config.get(k), common[k]) for k in differing) or config.get("env", "run")
        labels.append(f"{text[:80]} ({len(group)} run{'s' if len(group) > 1 else ''})")
    if len(set(labels)) < len(labels):
        labels = [f"{label} #{index}" for index, label in enumerate(labels, start=1)]
    return labels


def describe_option(key: str, value, common_start: str = "") -> str:
    """An option as a legend shows it. The replays, a long JSON list whose first 80
    characters are the same queue for most runs, become their types and ratios:
    `replays: queue 0.5 + custom/elite_sampling 0.5`; another long value is shown from
    where the groups' values part (`common_start`)."""
    if key == "replay_parameters" and isinstance(value, str):
        try:
            replays = json.loads(value)
            parts = [f"{r['type']}{'/' + r['sample_strategy'] if 'sample_strategy' in r else ''} {r['sample_ratio']:g}"
                     for r in replays]
            return "replays: " + " + ".join(parts)
        except (ValueError, TypeError, KeyError):
            pass                       # not the list herd writes: shown as it is
    return f"{key}={shown(str(value), common_start)}"


def score_curves(runs: list[Path], x_column: str) -> tuple[np.ndarray, np.ndarray] | None:
    """Moving-average score of each run on a common grid of `x_column` (env_step or
    wall_time): (grid [G], curves [runs, G]); the grid covers what every run reached."""
    series = []
    for run in runs:
        episodes = read_table(run / "episodes.csv")
        if not episodes:
            continue
        window = int(read_config(run).get("avg_buff_size", 100))
        series.append((episodes[x_column], moving_average(episodes["score"], window)))
    if not series:
        return None
    end = min(x[-1] for x, _ in series)
    grid = np.linspace(min(x[0] for x, _ in series), end, GRID_POINTS)
    return grid, np.stack([np.interp(grid, x, y) for x, y in series])


def draw_band(ax, grid, curves, label: str) -> None:
    line, = ax.plot(grid, curves.mean(axis=0), label=label)
    if len(curves) > 1:
        ax.fill_between(grid, curves.min(axis=0), curves.max(axis=0), color=line.get_color(), alpha=0.2)


def save_figures(groups: list[list[Path]], labels: list[str], out: Path) -> list[Path]:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    written = []
    for x_column, x_label, name in (("env_step", "environment steps", "score_vs_steps.png"),
                                    ("wall_time", "seconds of training", "score_vs_time.png")):
        fig, ax = plt.subplots(figsize=(8, 5))
        for group, label in zip(groups, labels):
            curves = score_curves(group, x_column)
            if curves is not None:
                draw_band(ax, *curves, label)
        ax.set(xlabel=x_label, ylabel="score (moving average of 100 games)")
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
        fig.savefig(out / name, dpi=100, bbox_inches="tight")
        plt.close(fig)
        written.append(out / name)
    fig, axes = plt.subplots(2, 3, figsize=(14, 7))
    for ax, (column, title) in zip(axes.flat, TRAIN_PANELS):
        for group, label in zip(groups, labels):
            for index, run in enumerate(group):
                table = read_table(run / "train.csv")
                if column in table:
                    ax.plot(table["env_step"], table[column], color=f"C{labels.index(label) % 10}", alpha=0.7,
                            label=label if index == 0 else None)
        ax.set(title=title, xlabel="environment steps")
        ax.grid(alpha=0.3)
    axes.flat[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "training.png", dpi=100)
    plt.close(fig)
    written.append(out / "training.png")
    return written


def plot_runs(paths: list[str], out: str | None = None, compare: bool = False) -> list[Path]:
    """Writes the figures; returns their paths. out: a folder (default: the run's plots/
    for one run, ./herd_plots for several)."""
    runs = [check_run_dir(p) for p in paths]
    target = Path(out) if out else (runs[0] / "plots" if len(runs) == 1 else Path("herd_plots"))
    groups = group_runs(runs)
    labels = group_labels(groups)
    if compare or len(groups) == 1:
        return save_figures(groups, labels, target)
    written = []
    for index, (group, label) in enumerate(zip(groups, labels), start=1):
        written += save_figures([group], [label], target / f"configuration_{index}")
    return written
