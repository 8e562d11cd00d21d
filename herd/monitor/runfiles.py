"""Reading a run folder back: its CSV tables as columns of floats, its config, and the
moving-average score. What `herd plot` and `herd watch` show comes from here only, so
they read exactly what the run wrote."""
from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np

from herd.errors import UserError

# Options that differ between runs of one configuration (seeds, where they were written).
NOT_CONFIGURATION = ("seed", "results_dir", "load_model_url", "continues_from", "op_mode")


def check_run_dir(path: str | Path) -> Path:
    run = Path(path)
    if not (run / "config.json").is_file():
        raise UserError(f"'{path}' is not a herd run folder (it has no config.json)")
    return run


def read_table(path: Path) -> dict[str, np.ndarray]:
    """column -> float array [rows] (empty cells are NaN); {} when the file is missing."""
    if not path.is_file():
        return {}
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    if not rows:
        return {}

    def number(text: str) -> float:
        try:
            return float(text)
        except (TypeError, ValueError):
            return float("nan")

    return {name: np.array([number(row.get(name)) for row in rows]) for name in rows[0]}


def read_config(run: Path) -> dict:
    return json.loads((run / "config.json").read_text())


def configuration_key(config: dict) -> tuple:
    """What makes two runs the same configuration: every option but the seed and paths."""
    return tuple(sorted((k, json.dumps(v, sort_keys=True)) for k, v in config.items() if k not in NOT_CONFIGURATION))


def moving_average(scores: np.ndarray, window: int) -> np.ndarray:
    """[n] -> [n]: the mean of the last `window` scores up to each one (fewer at the start)."""
    if len(scores) == 0:
        return scores
    sums = np.cumsum(np.insert(scores, 0, 0.0))
    counts = np.minimum(np.arange(1, len(scores) + 1), window)
    ends = np.arange(1, len(scores) + 1)
    return (sums[ends] - sums[ends - counts]) / counts
