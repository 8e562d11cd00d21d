"""Publishing the learner's weights without blocking its update.

Sent as one blocking copy to the host after every update, a GPU learner's weights (7.8 MB
for the Nature CNN) would make the host wait for the update to finish, then for the copy.
Here the copy is queued on a side stream into a pinned host buffer, behind the
update that made the weights, and a publisher thread waits for the copy's event and
writes the versioned weights the actors pull. One copy is in flight at a time; a publish
asked for while one is still on its way is skipped, and the next one carries newer
weights (actors only ever want the newest). On a CPU learner there is no copy where its
parameters live in the host store itself (herd/weights.py SharedWeights.adopt: the
optimizer writes them there, and the publish moves the version); else one memcpy in
place.

Given a board (herd/device_weights.py: an inference server on the learner's own GPU), the
same side stream also copies the weights into the board's free slot, device to device, and
the thread publishes that slot once the copies' event fired, before the host copy (the
server acts on every publish; the host copy serves actors with their own model).
The host publish stays: it is off the update's critical path."""
from __future__ import annotations

from typing import Callable

import torch

from herd.device_weights import DeviceWeightBoard
from herd.errors import PublishFailed
from herd.learner.courier import OneInFlight, failure_line


def publish_failed(err: BaseException) -> PublishFailed:
    return PublishFailed(f"the weight publisher failed ({failure_line(err)}): the actors would act on frozen "
                         "weights, so the run stops")


class WeightPublisher:
    def __init__(self, model: torch.nn.Module, write: Callable[[torch.Tensor, int], object] | None,
                 board: DeviceWeightBoard | None = None):
        """write(weights, version): the versioned store (SharedWeights.publish_vector), given
        the flat float32 vector [P] from a GPU learner's pinned copy, or a CPU learner's
        parameters themselves; None where nothing reads host memory (every reader takes the
        weights from `board`: no copy off the device). board: where a same-device inference
        server reads, or None."""
        if write is None and board is None:
            raise ValueError("a weight publisher needs somewhere to publish: a host store or a device board")
        self.params = list(model.parameters())
        with torch.no_grad():
            # A CPU learner's parameters, copied straight in: no joined [P] between. Detached
            # once: they share the parameters' memory, which the optimizer updates in place.
            self.parts = [p.detach() for p in self.params]
        # The same memory as numpy arrays for the host store (SharedWeights copies those
        # with numpy, in this thread); float32 parameters on the host only.
        on_host = all(p.device.type == "cpu" and p.dtype == torch.float32 for p in self.params)
        self.host_parts = [part.numpy() for part in self.parts] if on_host else self.parts
        self.write = write
        self.board = board
        self.device = self.params[0].device
        self.skipped = 0                         # publishes skipped while a copy was in flight
        if self.device.type == "cuda":
            numel = sum(p.numel() for p in self.params)
            self.host = torch.empty(numel, dtype=torch.float32, pin_memory=True) if write is not None else None
            self.stream = torch.cuda.Stream(self.device)
            self.courier = OneInFlight("herd-publisher", publish_failed)

    def __call__(self, version: int) -> None:
        if self.device.type != "cuda":
            try:
                if self.write is not None:
                    self.write(self.host_parts, version)
                if self.board is not None:
                    self.board.publish_vector(self.parts, version)
            except Exception as err:
                raise PublishFailed(f"the weights could not be published ({failure_line(err)}): the actors "
                                    "would act on frozen weights, so the run stops") from err
            return
        self.courier.check()
        if self.courier.job is not None:         # a copy in flight: the next publish carries newer weights
            self.skipped += 1
            return
        self.stream.wait_stream(torch.cuda.current_stream())      # after the update that made them
        with torch.cuda.stream(self.stream), torch.no_grad():
            flat = torch.cat([p.detach().reshape(-1).float() for p in self.params])   # [P] on the device
            if self.host is not None:
                self.host.copy_(flat, non_blocking=True)
            # Device to device into the board's free slot; readers keep off it until finish.
            slot = self.board.begin(flat) if self.board is not None else None
            copied = torch.cuda.Event(blocking=True)
            copied.record(self.stream)
        self.courier.offer(lambda: self.deliver(copied, version, slot))

    def deliver(self, copied, version: int, slot) -> None:
        """In the publisher thread: once the copies are done, the board's slot, then the host copy."""
        copied.synchronize()                     # a blocking event: the thread sleeps, no core spins
        if slot is not None:
            self.board.finish(slot, version)
        if self.write is not None:
            self.write(self.host, version)

    def close(self) -> None:
        """Waits for the copy in flight (its weights are published), then stops the thread."""
        if self.device.type == "cuda":
            self.courier.close()
