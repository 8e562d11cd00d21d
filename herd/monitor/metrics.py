"""Metric files of a run: CSV tables written in chunks, and TensorBoard scalars.

Rows are buffered and appended every `flush_seconds` (and at close), so a long run
writes its statistics in chunks instead of holding them all in memory or hitting the
disk on every episode. With `background` (the seed's --background_save) the appends
happen in a thread of their own, so the learner never waits on the disk."""
from __future__ import annotations

import csv
import logging
import os
import threading
import time
from pathlib import Path


log = logging.getLogger("herd")

# Rows a table keeps while its file cannot be written (a full disk, a vanished folder):
# the oldest beyond this are dropped (and counted), so a long outage costs bounded memory.
MAX_PENDING_ROWS = 100_000


class CsvTable:
    def __init__(self, path: Path, columns: list[str], flush_seconds: float = 5.0, background: bool = False):
        """background: add() never writes; a daemon thread flushes every flush_seconds."""
        self.path = path
        self.columns = columns
        self.flush_seconds = flush_seconds
        self.rows: list[list] = []
        self.lock = threading.Lock()        # add() and a background flush may overlap
        self.last_flush = time.monotonic()
        self.failing = False                # the last flush failed: rows are kept and retried
        self.dropped = 0                    # rows dropped while failing (MAX_PENDING_ROWS)
        if not path.exists():
            with open(path, "w", newline="") as f:
                csv.writer(f).writerow(columns)
        self.stopping = threading.Event()
        self.flusher = None
        if background:
            self.flusher = threading.Thread(target=self.flush_periodically, name=f"herd-save-{path.stem}", daemon=True)
            self.flusher.start()

    def add(self, **values) -> None:
        with self.lock:
            self.rows.append([values.get(c, "") for c in self.columns])
            if len(self.rows) > MAX_PENDING_ROWS:      # only while the file cannot be written
                del self.rows[0]
                self.dropped += 1
        if self.flusher is None and time.monotonic() - self.last_flush >= self.flush_seconds:
            self.flush()

    def flush(self) -> None:
        """Appends the buffered rows. An OSError (a full disk) never escapes: one line says
        so, the rows stay buffered (at most MAX_PENDING_ROWS) and the next flush retries."""
        with self.lock:
            rows, self.rows = self.rows, []
        self.last_flush = time.monotonic()
        if not rows:
            return
        try:
            with open(self.path, "a", newline="") as f:
                csv.writer(f).writerows(rows)
                f.flush()
                os.fsync(f.fileno())
        except OSError as err:
            self.keep(rows, err)
            return
        if self.failing:
            self.failing = False
            log.warning("%s is written again%s", self.path.name,
                        f" ({self.dropped} rows were dropped meanwhile)" if self.dropped else "")

    def keep(self, rows: list[list], err: OSError) -> None:
        with self.lock:
            self.rows[:0] = rows
            extra = len(self.rows) - MAX_PENDING_ROWS
            if extra > 0:
                del self.rows[:extra]
                self.dropped += extra
        if not self.failing:
            self.failing = True
            log.warning("cannot write %s (%s): keeping up to %d rows in memory and retrying every %g s", self.path,
                        err.strerror or err, MAX_PENDING_ROWS, self.flush_seconds)

    def flush_periodically(self) -> None:
        while not self.stopping.wait(self.flush_seconds):
            self.flush()

    def close(self) -> None:
        self.stopping.set()
        if self.flusher is not None:
            self.flusher.join()
        self.flush()
        if self.rows:
            log.warning("%d rows of %s could not be written", len(self.rows), self.path.name)


EPISODE_COLUMNS = ["episode", "score", "length", "env_step", "update", "wall_time", "unix_time"]


def dashboard_layout(train_columns: list[str]) -> dict:
    """TensorBoard's "Custom Scalars" tab: herd's metrics grouped into ready-made charts."""
    losses = [c for c in train_columns if c.endswith("loss") or c in ("entropy", "kl_mask_fraction", "mean_rho")]
    return {
        "progress": {"score": ["Multiline", ["episode/score", "eval/mean"]],
                     "average score": ["Multiline", ["train/average_score"]],
                     "frames per second": ["Multiline", ["train/fps"]],
                     "policy lag (updates)": ["Multiline", ["train/policy_lag"]]},
        "learner": {"losses": ["Multiline", [f"train/{c}" for c in losses]],
                    "gradient norm and learning rate": ["Multiline", ["train/grad_norm", "train/lr"]]},
        "hardware": {"CPU % per process": ["Multiline", [r"hardware/.*/cpu"]],
                     "memory MiB per process": ["Multiline", [r"hardware/.*/(rss|memory_used)"]],
                     "replay MiB, GPU watts": ["Multiline", [r"hardware/replay/stored", r"hardware/gpu.*/power"]]},
    }


class RunMetrics:
    """episodes.csv, train.csv and TensorBoard events in the run folder. train.csv's columns
    come from the algorithm (its loss metrics) and the learner loop."""

    def __init__(self, run_dir: Path, tensorboard: bool, train_columns: list[str], background: bool = False,
                 episode_columns: list[str] | None = None):
        """episode_columns: EPISODE_COLUMNS and any the session adds (Ape-X: the actor)."""
        self.episodes = CsvTable(run_dir / "episodes.csv", episode_columns or EPISODE_COLUMNS, background=background)
        self.train = CsvTable(run_dir / "train.csv", train_columns, background=background)
        self.writer = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter
            self.writer = SummaryWriter(log_dir=str(run_dir / "tensorboard"))
            self.writer.add_custom_scalars(dashboard_layout(train_columns))

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
        self.episodes.close()
        self.train.close()
        if self.writer:
            self.writer.flush()
            self.writer.close()
