"""Publishing the learner's weights without blocking its update.

A GPU learner's weights used to go out after every update as one blocking copy to the
host (7.8 MB for the Nature CNN): the host waited for the update to finish, then for the
copy. Here the copy is queued on a side stream into a pinned host buffer, behind the
update that made the weights, and a publisher thread waits for the copy's event and
writes the versioned weights the actors pull. One copy is in flight at a time; a publish
asked for while one is still on its way is skipped, and the next one carries newer
weights (actors only ever want the newest). On a CPU learner the copy is a memcpy and
is done in place, as before.

Given a board (herd/device_weights.py: an inference server on the learner's own GPU), the
same side stream also copies the weights into the board's free slot, device to device, and
the thread publishes that slot once the copies' event fired, before the host copy (the
server acts on every publish; the host copy serves actors with their own model).
The host publish stays: it is off the update's critical path."""
from __future__ import annotations

import threading
from typing import Callable

import torch

from herd.device_weights import DeviceWeightBoard


class WeightPublisher:
    def __init__(self, model: torch.nn.Module, write: Callable[[torch.Tensor, int], object],
                 board: DeviceWeightBoard | None = None):
        """write(flat float32 CPU vector, version): the versioned store (SharedWeights.publish_vector,
        or a Ray board's). board: where a same-device inference server reads, or None."""
        self.params = list(model.parameters())
        self.write = write
        self.board = board
        self.device = self.params[0].device
        self.skipped = 0                         # publishes skipped while a copy was in flight
        if self.device.type == "cuda":
            numel = sum(p.numel() for p in self.params)
            self.host = torch.empty(numel, dtype=torch.float32, pin_memory=True)
            self.stream = torch.cuda.Stream(self.device)
            self.pending: tuple | None = None    # (event, version) for the thread
            self.wake = threading.Condition()
            self.stopping = False
            self.thread = threading.Thread(target=self.run, name="herd-publisher", daemon=True)
            self.thread.start()

    def __call__(self, version: int) -> None:
        if self.device.type != "cuda":
            with torch.no_grad():
                flat = torch.cat([p.detach().reshape(-1).float() for p in self.params])   # [P]
            self.write(flat, version)
            if self.board is not None:
                self.board.publish_vector(flat, version)
            return
        with self.wake:
            if self.pending is not None:
                self.skipped += 1
                return
            self.stream.wait_stream(torch.cuda.current_stream())      # after the update that made them
            with torch.cuda.stream(self.stream), torch.no_grad():
                flat = torch.cat([p.detach().reshape(-1).float() for p in self.params])   # [P] on the device
                self.host.copy_(flat, non_blocking=True)
                # Device to device into the board's free slot; readers keep off it until finish.
                slot = self.board.begin(flat) if self.board is not None else None
                copied = torch.cuda.Event(blocking=True)
                copied.record(self.stream)
            self.pending = (copied, version, slot)
            self.wake.notify()

    def run(self) -> None:
        while True:
            with self.wake:
                while self.pending is None and not self.stopping:
                    self.wake.wait()
                if self.pending is None:
                    return
                copied, version, slot = self.pending
            copied.synchronize()                 # a blocking event: the thread sleeps, no core spins
            if slot is not None:
                self.board.finish(slot, version)
            self.write(self.host, version)
            with self.wake:
                self.pending = None

    def close(self) -> None:
        """Waits for the copy in flight (its weights are published), then stops the thread."""
        if self.device.type != "cuda":
            return
        with self.wake:
            self.stopping = True
            self.wake.notify()
        self.thread.join()
