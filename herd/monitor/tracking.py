"""Experiment tracking beside the run's own files: Weights & Biases (`--wandb_project`, the
optional extra `wandb`) and TensorBoard's HParams tab (the resolved config as the run's
hyperparameters, linked to its average score).

`TrackedMetrics` wraps the run's RunMetrics (herd/monitor/metrics.py) with the same three
calls the training session makes (episode, training, close), so the metric files stay
the record and the trackers only mirror them. wandb honours its own environment
variables: WANDB_MODE=offline keeps everything in RUN/wandb/ with no network.
"""
from __future__ import annotations

import importlib.util
import json
import logging
import math
from pathlib import Path
from typing import Any

from herd.errors import ConfigError

log = logging.getLogger("herd")

# The scalar the HParams tab shows beside each run's hyperparameters (a train.csv column).
HPARAM_METRIC = "train/average_score"


def check_wandb(project: str | None) -> None:
    """--wandb_project needs the wandb package: one line before anything runs, not a failure later."""
    if project is not None and importlib.util.find_spec("wandb") is None:
        raise ConfigError(f"--wandb_project={project} needs Weights & Biases: pip install -e '.[wandb]'")


def hparam_value(value: Any) -> bool | int | float | str:
    """TensorBoard's HParams take bools, numbers and strings: None and lists become text."""
    if isinstance(value, (bool, int, float, str)):
        return value
    return "None" if value is None else json.dumps(value)


def write_tensorboard_hparams(writer, config: dict[str, Any]) -> None:
    """The config as hyperparameters of this run's own event files (not a sub-run, which
    add_hparams would make), so the HParams tab lists runs, not run/timestamp folders."""
    from torch.utils.tensorboard.summary import hparams
    experiment, session_start, session_end = hparams({k: hparam_value(v) for k, v in config.items()},
                                                     {HPARAM_METRIC: math.nan})
    file_writer = writer.file_writer
    for summary in (experiment, session_start, session_end):
        file_writer.add_summary(summary)


class TrackedMetrics:
    """RunMetrics, mirrored to wandb and with the config in TensorBoard's HParams."""

    def __init__(self, metrics, config: dict[str, Any], run_dir: Path, wandb_project: str | None):
        self.metrics = metrics
        self.wandb_run = None
        if metrics.writer is not None:
            write_tensorboard_hparams(metrics.writer, config)
        if wandb_project is not None:
            self.wandb_run = start_wandb(wandb_project, config, run_dir)

    @property
    def writer(self):
        """The TensorBoard writer, shared with the hardware monitor (herd/training.py)."""
        return self.metrics.writer

    def episode(self, env_step: int, **values) -> None:
        self.metrics.episode(env_step, **values)

    def training(self, env_step: int, values: dict) -> None:
        self.metrics.training(env_step, values)
        if self.wandb_run is not None:
            row = {f"train/{name}": value for name, value in values.items()
                   if name not in ("update", "wall_time") and isinstance(value, (int, float)) and value == value}
            self.wandb_run.log(row, step=env_step)

    def close(self) -> None:
        try:
            self.metrics.close()
        finally:
            if self.wandb_run is not None:
                self.wandb_run.finish()


def start_wandb(project: str, config: dict[str, Any], run_dir: Path):
    """A wandb run named after the run folder, its files in RUN/wandb/; None (and one
    warning line) when wandb cannot start: the run's own files are the record."""
    import wandb
    try:
        return wandb.init(project=project, name=run_dir.name, dir=str(run_dir), config=config,
                          settings=wandb.Settings(console="off", silent=True))
    except Exception as err:  # a network or login failure must not cost the training run
        log.warning("wandb did not start (%s): training without it", " ".join(str(err).split())[:200])
        return None


def tracked(metrics, config: dict[str, Any], run_dir: Path, wandb_project: str | None):
    """The session's metrics: RunMetrics itself when nothing tracks them, else wrapped."""
    if metrics is None or (metrics.writer is None and wandb_project is None):
        return metrics
    return TrackedMetrics(metrics, config, run_dir, wandb_project)
