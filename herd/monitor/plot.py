"""`herd plot RUN [RUN ...]`: figures of runs fit for a paper, headless (matplotlib's Agg).

A resumed run is joined to the run it continues (one curve, not "2 runs"). Runs are then
grouped by the options that change learning (runfiles.NOT_CONFIGURATION lists those that
do not: seeds, names, logging, paths...). Each group is drawn as the mean of its runs'
100-game moving-average score with a band: the standard error of the mean, or a 95%
bootstrap interval, optionally smoothed; against environment steps and against wall
time; then losses, policy lag and frames per second from train.csv. Titles name the
environment, tick labels read 1.5M rather than 1500000. PNG (at --dpi), PDF or SVG.
Without --compare each group gets its own figures (a folder per group); with --compare
the groups share axes, labelled by the options in which they differ."""
from __future__ import annotations

import io
import json
import os
from pathlib import Path

import numpy as np

from herd.errors import UserError
from herd.files import run_subfolder, write_bytes
from herd.monitor.runfiles import (check_run_dir, config_number, config_text, configuration_key, join_resumed,
                                   moving_average, read_config, read_joined)

TRAIN_PANELS = (("loss", "loss"), ("pg_loss", "policy-gradient loss"), ("value_loss", "value loss"),
                ("entropy", "entropy"), ("policy_lag", "policy lag (updates)"), ("fps", "frames per second"))
GRID_POINTS = 200
BOOTSTRAP_SAMPLES = 2000
FORMATS = ("png", "pdf", "svg")
BANDS = ("se", "bootstrap", "none")
BAND_NAMES = {"se": "band: standard error of the mean", "bootstrap": "band: 95% bootstrap interval of the mean",
              "none": ""}

Chain = list[Path]      # a run and the runs that resumed it (runfiles.join_resumed)


def group_runs(runs: list[Path]) -> list[list[Chain]]:
    """Runs joined into chains, then chains grouped by configuration (their first run's)."""
    groups: dict[tuple, list[Chain]] = {}
    for chain in join_resumed(runs):
        groups.setdefault(configuration_key(read_config(chain[0])), []).append(chain)
    return list(groups.values())


def literal(text: str) -> str:
    """Text from a run's files as matplotlib draws it: one bounded line (config_text's rule)
    with every $ escaped, so "$\\x$" is drawn as typed, never parsed as mathtext (a parse
    error once ended herd plot in a traceback)."""
    return config_text({"text": text}, "text", "").replace("$", r"\$")


def shown(value: str, common_start: str) -> str:
    return "..." + value[len(common_start):] if len(common_start) > 20 else value


def group_labels(groups: list[list[Chain]]) -> list[str]:
    """Each group named by the learning options whose values differ between groups; labels
    that still coincide once shortened get a number, so no two curves share a name."""
    configs = [dict(configuration_key(read_config(group[0][0]))) for group in groups]
    keys = sorted({k for c in configs for k in c})
    differing = [k for k in keys if len({c.get(k) for c in configs}) > 1]
    values = [{k: json.loads(c[k]) if k in c else None for k in differing} for c in configs]
    # A long value (a --replay_parameters list) often differs only after a long common
    # start; show it from where the groups part, or the labels cut at 80 look the same.
    common = {k: os.path.commonprefix([str(v[k]) for v in values]) for k in differing}
    labels = []
    for value, group, config in zip(values, groups, configs):
        text = ", ".join(describe_option(k, value[k], common[k]) for k in differing) or json.loads(
            config.get("env", '"run"'))
        labels.append(literal(f"{str(text)[:80]} ({len(group)} run{'s' if len(group) > 1 else ''})"))
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


def smoothed(values: np.ndarray, points: int) -> np.ndarray:
    """[..., G] -> [..., G]: the mean of the last `points` grid values (fewer at the start)."""
    if points <= 1:
        return values
    return np.apply_along_axis(moving_average, -1, values, points)


def score_curves(chains: list[Chain], x_column: str, smooth: int = 1) -> tuple[np.ndarray, np.ndarray] | None:
    """Moving-average score of each chain on a common grid of `x_column` (env_step or
    wall_time): (grid [G], curves [chains, G]); the grid covers what every chain reached."""
    series = []
    for chain in chains:
        episodes = read_joined(chain, "episodes.csv")
        if not episodes:
            continue
        window = int(config_number(read_config(chain[0]), "avg_buff_size", 100))
        if "score" not in episodes or x_column not in episodes:
            continue
        series.append((episodes[x_column], moving_average(episodes["score"], window)))
    if not series:
        return None
    end = min(x[-1] for x, _ in series)
    grid = np.linspace(min(x[0] for x, _ in series), end, GRID_POINTS)
    return grid, smoothed(np.stack([np.interp(grid, x, y) for x, y in series]), smooth)


def band_of(curves: np.ndarray, kind: str) -> tuple[np.ndarray, np.ndarray] | None:
    """[runs, G] -> (low [G], high [G]) around the mean, or None (one run, or kind none).
    se: mean -+ the standard error; bootstrap: the 2.5 and 97.5 percentiles of the means
    of runs drawn with replacement (a fixed generator: the same figure every time)."""
    if len(curves) < 2 or kind == "none":
        return None
    mean = curves.mean(axis=0)
    if kind == "se":
        error = curves.std(axis=0, ddof=1) / np.sqrt(len(curves))
        return mean - error, mean + error
    draws = np.random.default_rng(0).integers(0, len(curves), size=(BOOTSTRAP_SAMPLES, len(curves)))
    means = curves[draws].mean(axis=1)                                 # [samples, G]
    return np.percentile(means, 2.5, axis=0), np.percentile(means, 97.5, axis=0)


def readable(value: float, _position=None) -> str:
    """Tick labels: 1.5M, 200k, 12, 0.25."""
    for size, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= size:
            return f"{value / size:.4g}{suffix}"
    return f"{value:.4g}"


def title_of(groups: list[list[Chain]]) -> str:
    configs = [read_config(group[0][0]) for group in groups]
    envs = sorted({config_text(c, "env", "?") for c in configs})
    algorithms = sorted({config_text(c, "algorithm", "impala") for c in configs})
    return literal(f"{', '.join(envs)} ({', '.join(algorithms)})")


def style(ax, x_label: str, y_label: str, title: str) -> None:
    from matplotlib.ticker import FuncFormatter
    ax.set(xlabel=x_label, ylabel=y_label, title=title)
    ax.xaxis.set_major_formatter(FuncFormatter(readable))
    ax.yaxis.set_major_formatter(FuncFormatter(readable))
    ax.grid(alpha=0.3)


def score_figure(groups: list[list[Chain]], labels: list[str], x_column: str, band: str = "se", smooth: int = 1):
    """The score of each group against `x_column`: its mean, and its band where it has
    several runs. Returns the matplotlib Figure (closed by the caller)."""
    from matplotlib.figure import Figure
    fig = Figure(figsize=(7, 4.5))
    ax = fig.add_subplot()
    for group, label in zip(groups, labels):
        curves = score_curves(group, x_column, smooth)
        if curves is None:
            continue
        grid, runs = curves
        line, = ax.plot(grid, runs.mean(axis=0), label=label)
        spread = band_of(runs, band)
        if spread is not None:
            ax.fill_between(grid, *spread, color=line.get_color(), alpha=0.2, linewidth=0)
    window = int(config_number(read_config(groups[0][0][0]), "avg_buff_size", 100))
    x_label = {"env_step": "environment steps", "wall_time": "seconds of training"}[x_column]
    note = BAND_NAMES[band] if any(len(g) > 1 for g in groups) else ""
    style(ax, x_label, f"score (moving average of {window} games)", title_of(groups))
    ax.legend(fontsize=8, title=note or None, title_fontsize=7)
    fig.tight_layout()
    return fig


def training_figure(groups: list[list[Chain]], labels: list[str]):
    """Losses, policy lag and frames per second from train.csv, every run its own line."""
    from matplotlib.figure import Figure
    fig = Figure(figsize=(14, 7))
    axes = fig.subplots(2, 3)
    for ax, (column, panel) in zip(axes.flat, TRAIN_PANELS):
        for index, (group, label) in enumerate(zip(groups, labels)):
            for run_index, chain in enumerate(group):
                table = read_joined(chain, "train.csv")
                if column in table and "env_step" in table:
                    ax.plot(table["env_step"], table[column], color=f"C{index % 10}", alpha=0.7,
                            label=label if run_index == 0 else None)
        style(ax, "environment steps", "", panel)
    axes.flat[0].legend(fontsize=7)
    fig.suptitle(title_of(groups))
    fig.tight_layout()
    return fig


def save_figures(groups: list[list[Chain]], labels: list[str], out: Path, file_format: str = "png",
                 dpi: int = 150, band: str = "se", smooth: int = 1) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    figures = {"score_vs_steps": score_figure(groups, labels, "env_step", band, smooth),
               "score_vs_time": score_figure(groups, labels, "wall_time", band, smooth),
               "training": training_figure(groups, labels)}
    written = []
    for name, fig in figures.items():
        path = out / f"{name}.{file_format}"
        buffer = io.BytesIO()              # then write_bytes: a linked figure is refused, not written through
        fig.savefig(buffer, format=file_format, dpi=dpi, bbox_inches="tight")
        write_bytes(path, buffer.getvalue())
        written.append(path)
    return written


def check_plot_options(file_format: str, dpi: int, band: str, smooth: int) -> None:
    if file_format not in FORMATS:
        raise UserError(f"--format={file_format}: use one of {', '.join(FORMATS)}")
    if band not in BANDS:
        raise UserError(f"--band={band}: use one of {', '.join(BANDS)}")
    if not 10 <= dpi <= 1200:
        raise UserError(f"--dpi={dpi}: use 10 to 1200 (300 for print)")
    if not 1 <= smooth <= GRID_POINTS:
        raise UserError(f"--smooth={smooth}: use 1 (none) to {GRID_POINTS} grid points")


def plot_runs(paths: list[str], out: str | None = None, compare: bool = False, file_format: str = "png",
              dpi: int = 150, band: str = "se", smooth: int = 1) -> list[Path]:
    """Writes the figures; returns their paths. out: a folder (default: the run's plots/
    for one run, ./herd_plots for several). A folder with no finished game yet is
    refused (UserError): its figures would be blank."""
    check_plot_options(file_format, dpi, band, smooth)
    runs = [check_run_dir(p) for p in paths]
    for run in runs:
        if not read_joined([run], "episodes.csv").get("score", np.empty(0)).size:
            raise UserError(f"'{run}' has no finished games yet (episodes.csv is empty or missing): nothing to plot")
    # A run's own plots/ must not be a link out of it (herd.files.run_subfolder).
    target = Path(out) if out else (run_subfolder(runs[0], "plots") if len(runs) == 1 else Path("herd_plots"))
    groups = group_runs(runs)
    labels = group_labels(groups)
    options = dict(file_format=file_format, dpi=dpi, band=band, smooth=smooth)
    if compare or len(groups) == 1:
        return save_figures(groups, labels, target, **options)
    written = []
    for index, (group, label) in enumerate(zip(groups, labels), start=1):
        written += save_figures([group], [label], target / f"configuration_{index}", **options)
    return written
