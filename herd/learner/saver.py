"""Checkpoints of a training session written to disk by a thread of their own: the
periodic save takes a host snapshot of the state on the learner's thread (copies of its
tensors, milliseconds) and the "herd-checkpoints" thread pickles, checksums and writes it
(0.2-1 s for a Pong run, seconds with a saved replay), while training goes on. The final
checkpoint of a run is written where the run ends, after the one in flight."""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np
import torch

from herd.checkpoint import CHECKPOINT_DIR, list_checkpoints, save_checkpoint
from herd.errors import SaveFailed
from herd.learner.courier import OneInFlight, failure_line

log = logging.getLogger("herd")


def host_snapshot(state: Any) -> Any:
    """`state` with every tensor copied to host memory and every dict, list and tuple
    rebuilt, so that training on after this returns changes nothing in it. numpy arrays
    are kept: the only ones in a session's state are the replays', copies already
    (herd/store.py state_dict)."""
    if isinstance(state, torch.Tensor):
        return state.detach().to("cpu", copy=True)
    if isinstance(state, dict):
        return {key: host_snapshot(value) for key, value in state.items()}
    if isinstance(state, (list, tuple)):
        return type(state)(host_snapshot(value) for value in state)
    if isinstance(state, np.ndarray) or state is None or isinstance(state, (bool, int, float, str, bytes)):
        return state
    raise TypeError(f"a checkpoint holds tensors, arrays and plain values, not {type(state).__name__}")


def write_checkpoint(state: dict, run_dir: Path, update: int) -> Path:
    """save_checkpoint, its OSError as one SaveFailed line naming the checkpoint kept
    (save_checkpoint removes its temporary file: the previous checkpoint is intact)."""
    try:
        path = save_checkpoint(state, run_dir, update)
    except OSError as err:
        kept = list_checkpoints(run_dir / CHECKPOINT_DIR)
        raise SaveFailed(f"cannot write the checkpoint at update {update} ({' '.join(str(err).split())}); "
                         + (f"the previous checkpoint {kept[0]} is kept" if kept else "no checkpoint was saved")
                         ) from None
    log.debug("checkpoint %s", path)
    return path


def writer_failed(err: BaseException) -> SaveFailed:
    return err if isinstance(err, SaveFailed) else SaveFailed(f"the checkpoint writer failed ({failure_line(err)})")


class BackgroundSaver:
    """One checkpoint in flight at a time. A save due while the previous one is still being
    written is skipped, with a log line (the next period writes a newer state); a write that
    failed raises SaveFailed on the learner's thread at the next check, offer or wait."""

    def __init__(self, run_dir: Path):
        self.run_dir = run_dir
        self.courier: OneInFlight | None = None     # the thread, started by the first save
        self.skipped = 0

    def offer(self, state: dict, update: int) -> bool:
        """Hands a snapshot (host_snapshot) over; False when the previous one is still writing."""
        if self.courier is None:
            self.courier = OneInFlight("herd-checkpoints", writer_failed)
        if self.courier.offer(lambda: write_checkpoint(state, self.run_dir, update)):
            return True
        self.skipped += 1
        log.info("checkpoint at update %d skipped: the previous one is still being written", update)
        return False

    def check(self) -> None:
        if self.courier is not None:
            self.courier.check()

    def wait(self) -> None:
        """Until the checkpoint in flight is on disk (SaveFailed if its write failed)."""
        if self.courier is not None:
            self.courier.wait()

    def close(self) -> None:
        if self.courier is not None:
            self.courier.close()
