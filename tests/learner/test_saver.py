"""Periodic checkpoints written by a thread of their own (herd/learner/saver.py): the
learner hands a snapshot over and trains on; the snapshot is the state as it was; one
write in flight; a failed write reaches the learner's thread as one SaveFailed line."""
from __future__ import annotations

import threading

import numpy as np
import pytest
import torch

import herd.learner.saver as saver_module
from herd.checkpoint import CHECKPOINT_DIR, list_checkpoints, load_checkpoint
from herd.errors import SaveFailed
from herd.learner.saver import BackgroundSaver, host_snapshot


def state(value: float) -> dict:
    model = torch.nn.Linear(3, 2)
    with torch.no_grad():
        model.weight.fill_(value)
    return {"model": model.state_dict(), "counters": {"updates": 5, "history": [1, 2]},
            "rng": {"torch": torch.get_rng_state()}, "replay": {"version": np.arange(3)}}


def test_a_snapshot_is_the_state_as_it_was_when_taken():
    """Catches a snapshot that shares the model's tensors (or the state's lists) with the
    session: training on after the hand-over would change what gets written."""
    live = state(1.0)
    snapshot = host_snapshot(live)
    live["model"]["weight"].add_(5.0)
    live["counters"]["history"].append(3)
    assert torch.equal(snapshot["model"]["weight"], torch.full((2, 3), 1.0))
    assert snapshot["counters"]["history"] == [1, 2]
    with pytest.raises(TypeError, match="not object"):
        host_snapshot({"odd": object()})


def test_the_learner_hands_over_and_goes_on_while_a_checkpoint_is_written(tmp_path, monkeypatch):
    """Catches a save that blocks the learner's thread until the file is written, a second
    save started while one is in flight (it is skipped and counted instead), and a wait
    that returns before the file is on disk."""
    release, started = threading.Event(), threading.Event()
    real_save = saver_module.save_checkpoint

    def slow_save(*args, **kwargs):
        started.set()
        assert release.wait(30)
        return real_save(*args, **kwargs)
    monkeypatch.setattr(saver_module, "save_checkpoint", slow_save)
    saver = BackgroundSaver(tmp_path)
    assert saver.offer(host_snapshot(state(2.0)), 5)            # returns with the write still to do
    assert started.wait(30)
    assert not saver.offer(host_snapshot(state(3.0)), 6) and saver.skipped == 1
    assert not list_checkpoints(tmp_path / CHECKPOINT_DIR)
    release.set()
    saver.wait()
    assert [p.name for p in list_checkpoints(tmp_path / CHECKPOINT_DIR)] == ["ckpt_0000000005.pt"]
    loaded, _ = load_checkpoint(tmp_path)
    assert torch.equal(loaded["model"]["weight"], torch.full((2, 3), 2.0))
    saver.close()
    assert not saver.courier.thread.is_alive()


def test_a_failed_background_write_is_one_save_failed_line_on_the_learner_thread(tmp_path, monkeypatch):
    """Catches a writer thread that dies silently (every later save then 'skipped' as busy,
    and the run would go on with no checkpoint) and an error that is a traceback."""
    def full_disk(*args, **kwargs):
        raise OSError(28, "No space left on device\nsecond line")
    monkeypatch.setattr(saver_module, "save_checkpoint", full_disk)
    saver = BackgroundSaver(tmp_path)
    assert saver.offer(host_snapshot(state(1.0)), 5)
    with pytest.raises(SaveFailed) as raised:
        saver.wait()
    line = str(raised.value)
    assert "No space left on device" in line and "\n" not in line and "no checkpoint was saved" in line
    with pytest.raises(SaveFailed):
        saver.check()
    with pytest.raises(SaveFailed):
        saver.offer(host_snapshot(state(1.0)), 10)
    saver.close()
