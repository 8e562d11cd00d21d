"""`herd watch RUN`: one terminal screen, refreshed in place, with what a run is doing:
steps, elapsed time and ETA, score, frames/s (average and last), policy lag, losses,
replay memory and each process's CPU and memory; and a "no news for N s" line when the
run has written nothing for a minute without ending (it died).
It only reads the run's own files (episodes.csv, train.csv, hardware.csv, summary.json),
so it can watch a run started anywhere, and it ends when the run writes its summary."""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from herd.monitor.hardware import COLUMNS
from herd.monitor.progress import format_score
from herd.monitor.runfiles import (check_run_dir, config_number, config_text, moving_average, read_config,
                                   read_json_object, read_rows, read_table)

# The files a running run keeps writing: the hardware figures every --hardware_interval
# (5 s), the metrics every log interval. Silent for longer than STALE_S, a run without a
# summary.json has most likely died (kill -9, a lost machine).
NEWS_FILES = ("hardware.csv", "train.csv", "episodes.csv", "log.txt")
STALE_S = 60.0


def last(table: dict, column: str) -> float:
    values = table.get(column)
    return float(values[-1]) if values is not None and len(values) else float("nan")


def latest_hardware(table: dict) -> dict[str, dict[str, tuple[float, str]]]:
    """{source: {metric: (value, unit)}} of hardware.csv's newest sample."""
    if not table:
        return {}
    newest = table["time"] == table["time"][-1]
    figures: dict[str, dict[str, tuple[float, str]]] = {}
    for source, metric, value, unit in zip(table["source"][newest], table["metric"][newest], table["value"][newest],
                                           table["unit"][newest]):
        figures.setdefault(source, {})[metric] = (value, unit)
    return figures


def read_hardware(run: Path) -> dict:
    """hardware.csv (time, source, metric, value, unit) with its text columns kept as text."""
    table = read_table(run / "hardware.csv")
    if set(table) != set(COLUMNS):     # empty, or the columns herd wrote before (wall_time, pid, ...): not shown
        return {}
    if table:
        rows = read_rows(run / "hardware.csv")
        for column in ("source", "metric", "unit"):
            table[column] = np.array([str(row[column]) for row in rows])
    return table


def clock(seconds: float) -> str:
    """1:02:03, or '-' for an unknown time."""
    if seconds != seconds or seconds < 0 or seconds == float("inf"):
        return "-"
    minutes, secs = divmod(int(round(seconds)), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}"


def last_news(run: Path) -> float:
    """Unix time of the newest write to the run's metric files (0: none yet)."""
    times = [path.stat().st_mtime for name in NEWS_FILES if (path := run / name).is_file()]
    return max(times, default=0.0)


def timing(train: dict, episodes: dict, budget: float) -> tuple[float, float, float, float]:
    """(steps, training seconds, average frames/s over the run, ETA in seconds) from the
    newest rows (env_step and wall_time continue across resumed parts)."""
    rows = [(last(t, "env_step"), last(t, "wall_time")) for t in (train, episodes) if t]
    steps, seconds = max(rows, default=(float("nan"), float("nan")))
    average = steps / seconds if seconds and seconds > 0 else float("nan")
    eta = (budget - steps) / average if average and average > 0 else float("nan")
    return steps, seconds, average, max(eta, 0.0) if eta == eta else eta


def shown(text: str) -> str:
    """A string from a run's files as the screen shows it (runfiles.config_text's rule)."""
    return config_text({"text": text}, "text", "")


def hardware_table(run: Path):
    from rich.table import Table
    from rich.text import Text
    table = Table(title="hardware (newest sample)", show_edge=False)
    for column in ("source", "CPU %", "memory MiB", "other"):
        table.add_column(column)
    for source, figures in latest_hardware(read_hardware(run)).items():
        value = lambda metric: figures.get(metric, (float("nan"), ""))[0]  # noqa: E731
        memory = value("rss") if "rss" in figures else value("memory_used")
        other = ", ".join(f"{v:.1f} {unit}" + (" stored" if metric == "stored" else "")
                          for metric, (v, unit) in figures.items() if metric in ("stored", "power"))
        cpu = value("cpu") if "cpu" in figures else value("utilisation")
        # Text, not markup: a name from the file is shown as it is ("[bold]" stays text) and
        # its control characters escaped (config_text's rule).
        table.add_row(Text(shown(source)), format_score(cpu, 0), format_score(memory, 0), Text(shown(other)))
    return table


def snapshot(run: Path, now: float | None = None):
    """A rich renderable of the run now (now: a Unix time, for tests)."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    now = time.time() if now is None else now
    config = read_config(run)
    episodes, train = read_table(run / "episodes.csv"), read_table(run / "train.csv")
    summary_path = run / "summary.json"
    ended = config_text(read_json_object(summary_path), "ended", "") if summary_path.is_file() else None
    window = int(config_number(config, "avg_buff_size", 100))
    average = moving_average(episodes["score"], window)[-1] if episodes.get("score") is not None else float("nan")
    budget = config_number(config, "environment_max_steps", float("nan"))
    steps, seconds, fps, eta = timing(train, episodes, budget)
    progress = Table.grid(padding=(0, 2))
    rows = [("run", f"{shown(run.name)} ({config_text(config, 'env', '?')}, "
                    f"{config_text(config, 'algorithm', 'impala')})" + (f" - ended: {ended}" if ended else "")),
            ("environment steps", f"{steps:,.0f} of {budget:,.0f}" if steps == steps else "-"),
            ("elapsed / ETA", f"{clock(seconds)} / {'-' if ended else clock(eta)}"),
            ("updates", format_score(last(train, "update"), 0)),
            ("games", f"{len(episodes.get('score', []))}"),
            (f"score (last {window})", format_score(average)),
            ("eval score", format_score(last(read_table(run / "eval.csv"), "mean"))),
            ("frames/s (average / last)", f"{format_score(fps, 0)} / {format_score(last(train, 'fps'), 0)}"),
            ("policy lag (updates)", format_score(last(train, "policy_lag"), 1)),
            ("loss / entropy", f"{format_score(last(train, 'loss'), 3)} / {format_score(last(train, 'entropy'), 3)}")]
    news = last_news(run)
    quiet = max(STALE_S, 3 * config_number(config, "hardware_interval", 0))
    if not ended and news and now - news > quiet:
        rows.append(("no news", f"no news for {now - news:.0f} s: the run may have died "
                                "(nothing written and no summary.json)"))
    for name, value in rows:
        progress.add_row(name, Text(value))      # text, never markup: it quotes the run's files
    return Group(progress, hardware_table(run))


def watch(path: str, interval: float = 1.0, once: bool = False, console=None) -> int:
    """Shows the run until it ends (or Ctrl+C); `once`: print one snapshot and return."""
    from rich.console import Console
    from rich.live import Live

    run = check_run_dir(path)
    console = console or Console()
    if once:
        console.print(snapshot(run))
        return 0
    try:
        with Live(snapshot(run), console=console, refresh_per_second=4, screen=False) as live:
            while not (run / "summary.json").is_file():
                time.sleep(interval)
                live.update(snapshot(run))
            live.update(snapshot(run))
    except KeyboardInterrupt:
        pass
    return 0
