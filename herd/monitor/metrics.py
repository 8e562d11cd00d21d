"""Metric files of a run: CSV tables written in chunks, and TensorBoard scalars.

Rows are buffered and appended every `flush_seconds` (and at close), so a long run
writes its statistics in chunks instead of holding them all in memory or hitting the
disk on every episode."""
from __future__ import annotations

import csv
import os
import time
from pathlib import Path


class CsvTable:
    def __init__(self, path: Path, columns: list[str], flush_seconds: float = 5.0):
        self.path = path
        self.columns = columns
        self.flush_seconds = flush_seconds
        self.rows: list[list] = []
        self.last_flush = time.monotonic()
        if not path.exists():
            with open(path, "w", newline="") as f:
                csv.writer(f).writerow(columns)

    def add(self, **values) -> None:
        self.rows.append([values.get(c, "") for c in self.columns])
        if time.monotonic() - self.last_flush >= self.flush_seconds:
            self.flush()

    def flush(self) -> None:
        if self.rows:
            with open(self.path, "a", newline="") as f:
                csv.writer(f).writerows(self.rows)
                f.flush()
                os.fsync(f.fileno())
            self.rows.clear()
        self.last_flush = time.monotonic()


EPISODE_COLUMNS = ["episode", "score", "length", "env_step", "update", "wall_time", "unix_time"]
TRAIN_COLUMNS = ["update", "env_step", "wall_time", "loss", "pg_loss", "value_loss", "entropy",
                 "policy_cloning_loss", "value_cloning_loss", "kl_mask_fraction", "mean_rho",
                 "grad_norm", "lr", "policy_lag", "fps", "average_score"]


class RunMetrics:
    """episodes.csv, train.csv and TensorBoard events in the run folder."""

    def __init__(self, run_dir: Path, tensorboard: bool):
        self.episodes = CsvTable(run_dir / "episodes.csv", EPISODE_COLUMNS)
        self.train = CsvTable(run_dir / "train.csv", TRAIN_COLUMNS)
        self.writer = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter
            self.writer = SummaryWriter(log_dir=str(run_dir / "tensorboard"))

    def episode(self, env_step: int, **values) -> None:
        self.episodes.add(env_step=env_step, unix_time=round(time.time(), 3), **values)
        if self.writer:
            self.writer.add_scalar("episode/score", values["score"], env_step)

    def training(self, env_step: int, values: dict) -> None:
        self.train.add(env_step=env_step, **values)
        if self.writer:
            for name, value in values.items():
                if name not in ("update", "wall_time") and value == value:  # skip NaN
                    self.writer.add_scalar(f"train/{name}", value, env_step)

    def close(self) -> None:
        self.episodes.flush()
        self.train.flush()
        if self.writer:
            self.writer.flush()
            self.writer.close()
