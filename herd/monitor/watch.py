"""`herd watch RUN`: one terminal screen, refreshed in place, with what a run is doing:
steps, score, fps, policy lag, losses, replay memory and each process's CPU and memory.
It only reads the run's own files (episodes.csv, train.csv, hardware.csv, summary.json),
so it can watch a run started anywhere, and it ends when the run writes its summary."""
from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np

from herd.monitor.progress import format_score
from herd.monitor.runfiles import check_run_dir, moving_average, read_config, read_table


def last(table: dict, column: str) -> float:
    values = table.get(column)
    return float(values[-1]) if values is not None and len(values) else float("nan")


def latest_hardware(hardware: dict) -> list[tuple[str, float, float, float]]:
    """(source, cpu %, rss MiB, value) of the newest sample."""
    if not hardware:
        return []
    newest = hardware["wall_time"] == hardware["wall_time"][-1]
    return [(source, cpu, rss, value) for source, cpu, rss, value in
            zip(hardware["source"][newest], hardware["cpu_percent"][newest], hardware["rss_mib"][newest],
                hardware["value"][newest])]


def read_hardware(run: Path) -> dict:
    """hardware.csv with its source column kept as text."""
    table = read_table(run / "hardware.csv")
    if table:
        import csv
        with open(run / "hardware.csv", newline="") as f:
            table["source"] = np.array([row["source"] for row in csv.DictReader(f)])
    return table


def snapshot(run: Path):
    """A rich renderable of the run now."""
    from rich.console import Group
    from rich.table import Table

    config = read_config(run)
    episodes, train = read_table(run / "episodes.csv"), read_table(run / "train.csv")
    summary_path = run / "summary.json"
    ended = json.loads(summary_path.read_text()).get("ended") if summary_path.is_file() else None
    window = int(config.get("avg_buff_size", 100))
    average = moving_average(episodes["score"], window)[-1] if episodes else float("nan")
    steps = max(last(episodes, "env_step"), last(train, "env_step"))
    budget = config.get("environment_max_steps") or float("nan")
    progress = Table.grid(padding=(0, 2))
    for name, value in (
            ("run", f"{run.name} ({config.get('env')}, {config.get('algorithm', 'impala')})"
                    + (f" - ended: {ended}" if ended else "")),
            ("environment steps", f"{steps:,.0f} of {budget:,.0f}" if steps == steps else "-"),
            ("updates", format_score(last(train, "update"), 0)),
            ("games", f"{len(episodes.get('score', []))}"),
            (f"score (last {window})", format_score(average)),
            ("eval score", format_score(last(read_table(run / "eval.csv"), "mean"))),
            ("frames/s", format_score(last(train, "fps"), 0)),
            ("policy lag (updates)", format_score(last(train, "policy_lag"), 1)),
            ("loss / entropy", f"{format_score(last(train, 'loss'), 3)} / {format_score(last(train, 'entropy'), 3)}")):
        progress.add_row(name, value)
    hardware = Table(title="hardware (newest sample)", show_edge=False)
    for column in ("source", "CPU %", "memory MiB", "other"):
        hardware.add_column(column)
    for source, cpu, rss, value in latest_hardware(read_hardware(run)):
        other = f"{value:.1f} MiB stored" if source == "replay" else (f"{value:.0f} W" if value == value else "")
        hardware.add_row(source, format_score(cpu, 0), format_score(rss, 0), other)
    return Group(progress, hardware)


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
