"""Batches on their way to a GPU learner: copied from host memory on a copy stream of their
own, so that the copy of batch k+1 overlaps the update on batch k instead of queueing
behind it on the default stream; the learner's stream waits on the copy's event before
it reads the batch. Host memory is pinned through torch's caching host allocator, which
hands the same pinned blocks out again batch after batch (a ring of reused pinned
buffers, without one here). On a CPU learner all of this falls away: the batch is used
where it is."""
from __future__ import annotations

import numpy as np
import torch

from herd.learner.learner import to_tensors
from herd.store import Gather


class Staging:
    def __init__(self, device: torch.device):
        self.device = device
        self.stream = torch.cuda.Stream(device) if device.type == "cuda" else None

    def stage(self, batch: dict[str, np.ndarray], replayed: np.ndarray) -> tuple[dict[str, torch.Tensor], object]:
        """(the batch's tensors on the device, the copy's event or None). Called from the
        thread that prepares batches."""
        if self.stream is None:
            return to_tensors(batch, replayed, self.device), None
        with torch.cuda.stream(self.stream):
            tensors = to_tensors(batch, replayed, self.device, pin=True)
            copied = torch.cuda.Event()
            copied.record(self.stream)
        return tensors, copied

    @staticmethod
    def hand_over(tensors: dict[str, torch.Tensor] | Gather, copied) -> dict[str, torch.Tensor] | Gather:
        """In the learner's thread, before the update: its stream waits for the copy (on
        the device, no host wait), and the allocator learns that stream uses the tensors."""
        if copied is not None:
            stream = torch.cuda.current_stream()
            stream.wait_event(copied)
            for tensor in (tensors.columns if isinstance(tensors, Gather) else tensors).values():
                tensor.record_stream(stream)
        return tensors
