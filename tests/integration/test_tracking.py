"""Experiment tracking: --wandb_project mirrors the training rows and the config into a
Weights & Biases run (offline mode: no network), and TensorBoard's HParams tab gets the
config of every run."""
import glob
import importlib.util
import os
import struct
import subprocess
import sys

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.plugins.hparams import plugin_data_pb2

from herd_testing import ROOT, only_run
from herd.errors import ConfigError
from herd.monitor import tracking


def wandb_records(path):
    """The protobuf records of an offline run's .wandb file: wandb's header, then LevelDB's
    log format (32 KiB blocks of records with a 7-byte header: crc, length, type)."""
    from wandb.proto import wandb_internal_pb2
    data = open(path, "rb").read()
    assert data[:4] == b":W&B"
    pos, pending, block = 7, b"", 32768
    while pos + 7 <= len(data):
        if block - pos % block < 7:                 # a block's tail too short for a header is padding
            pos += block - pos % block
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        pending += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):                          # a full record, or the last fragment of one
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            pending = b""
            yield record


def test_wandb_offline_and_tensorboard_hparams(tmp_path):
    """Catches --wandb_project accepted but nothing logged (no history rows, no config),
    wandb files outside the run folder, and TensorBoard events without the config as
    hyperparameters."""
    env = {**os.environ, "WANDB_MODE": "offline", "WANDB_SILENT": "true"}
    env.pop("WANDB_API_KEY", None)
    result = subprocess.run([sys.executable, "-m", "herd.cli", "train", "--env=CartPole-v1", "--worker_count=1",
                             "--environment_max_steps=6000", "--verbose_learner_out_int=5", "--seed=7",
                             "--wandb_project=herd-test", f"--results_dir={tmp_path}"],
                            cwd=ROOT, capture_output=True, text=True, timeout=240, env=env)
    assert result.returncode == 0, result.stderr[-2000:]
    run = only_run(tmp_path)
    [path] = glob.glob(str(run / "wandb" / "offline-run-*" / "run-*.wandb"))
    records = list(wandb_records(path))
    [run_record] = [r.run for r in records if r.WhichOneof("record_type") == "run"]
    config = {item.key or "/".join(item.nested_key): item.value_json for item in run_record.config.update}
    assert config["env"] == '"CartPole-v1"' and config["seed"] == "7" and run_record.display_name == run.name
    history = [{i.key or "/".join(i.nested_key): i.value_json for i in r.history.item}   # wandb nests "a/b" keys
               for r in records if r.WhichOneof("record_type") == "history"]
    assert len(history) >= 5 and all("train/loss" in row and "train/average_score" in row for row in history)
    steps = [int(row["_step"]) for row in history]
    assert steps == sorted(steps) and steps[-1] <= 6200             # logged at environment steps

    events = EventAccumulator(str(run / "tensorboard"))
    events.Reload()
    content = events.PluginTagToContent("hparams")
    starts = [plugin_data_pb2.HParamsPluginData.FromString(c).session_start_info for c in content.values()]
    hparams = next(s.hparams for s in starts if s.hparams)
    assert hparams["env"].string_value == "CartPole-v1" and hparams["seed"].number_value == 7
    assert hparams["use_lstm"].bool_value is False


def test_wandb_project_without_wandb_is_one_line(monkeypatch):
    """Catches --wandb_project silently ignored when the package is missing."""
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a))
    with pytest.raises(ConfigError, match=r"pip install -e '\.\[wandb\]'"):
        tracking.check_wandb("my-project")
    tracking.check_wandb(None)                       # no project: nothing needed
