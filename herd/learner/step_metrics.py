"""Metrics of the learner's updates, summed on the device and read once per logging
interval: a Python float of a device tensor stalls the device until everything queued
before it has run, so one read per update would serialise the host and the GPU.

train.csv gets the interval's means (not the last update's values); the skipped-update
count and the longest run of skipped updates in a row come with the same read."""
from __future__ import annotations

import torch
from torch import Tensor


class MetricSums:
    """Sums of a fixed set of 0-dim metrics over the updates of one interval.

    accumulate(metrics) is device work only (a stack and a few in-place adds, no host
    read), so the learner runs it inside its update and a CUDA graph of the update
    captures it (herd/learner/learner.py); counted() is the host's part after each update
    (the update count, the skip run's mirror). add() does both, for an update made
    elsewhere. read() makes the interval's one host read and starts the next interval."""

    def __init__(self, names: tuple[str, ...], device: torch.device):
        self.names = tuple(names)
        self.device = device
        self.sums = torch.zeros(len(self.names), dtype=torch.float64, device=device)      # [M]
        self.counts = torch.zeros(len(self.names), dtype=torch.float64, device=device)    # [M] finite values
        self.updates = 0                                    # host count: known without a read
        self.skipped = torch.zeros((), dtype=torch.float64, device=device)
        self.skip_run = torch.zeros((), dtype=torch.float64, device=device)   # skipped in a row, now
        self.longest_skip_run = torch.zeros((), dtype=torch.float64, device=device)
        # The current run of skips, mirrored to host memory by an asynchronous copy after
        # every update: the divergence check reads that mirror (numpy, host memory), one
        # update late on a GPU, and never waits for the device.
        self.skip_run_mirror = torch.zeros((), dtype=torch.float64, pin_memory=device.type == "cuda")
        self.skip_run_on_host = self.skip_run_mirror.numpy()      # a numpy view of the same host memory
        self.mirrored = torch.cuda.Event() if device.type == "cuda" else None
        self.last_run = 0

    def add(self, metrics: dict[str, Tensor]) -> None:
        """Both parts, for an update whose sums were not accumulated inside it."""
        self.accumulate(metrics)
        self.counted()

    def accumulate(self, metrics: dict[str, Tensor]) -> None:
        """Adds one update's metrics (each named one, and "skipped") to the sums: device
        ops on the sums in place, the same kernels every update, so they can be captured."""
        with torch.no_grad():       # one stack, one conversion: a few ops whatever the number of metrics
            values = torch.stack([metrics[name] for name in self.names]).to(torch.float64)   # [M]
            # A skipped update's non-finite loss is not averaged in (its update changed
            # nothing); the skip itself is counted below.
            finite = torch.isfinite(values)
            self.sums += torch.where(finite, values, 0.0)
            self.counts += finite
            skipped = metrics["skipped"].detach().to(torch.float64)
            self.skipped += skipped
            self.skip_run.mul_(skipped).add_(skipped)           # +1 on a skip, back to 0 on an update
            torch.maximum(self.longest_skip_run, self.skip_run, out=self.longest_skip_run)

    def counted(self) -> None:
        """The host's part of one update, after it was accumulated: the update count (known
        without a read) and the asynchronous mirror of the skip run."""
        self.updates += 1
        if self.mirrored is None or self.mirrored.query():
            self.skip_run_mirror.copy_(self.skip_run, non_blocking=True)
            if self.mirrored is not None:
                self.mirrored.record()

    def latest_skip_run(self) -> int:
        """Updates skipped in a row up to the last mirrored update (this one on a CPU, on a
        GPU the latest whose copy has landed): read from host memory, no device read."""
        if self.mirrored is None or self.mirrored.query():
            self.last_run = int(self.skip_run_on_host)
        return self.last_run

    def read(self) -> tuple[dict[str, float], int, int]:
        """(the interval's mean of each metric (NaN where every value was non-finite),
        skipped updates, longest run of skipped updates in a row, counting on from the
        previous interval's run); one host read."""
        packed = torch.cat([self.sums, self.counts, torch.stack([self.skipped, self.longest_skip_run])])
        if self.device.type == "cuda":
            # Wait on a blocking event, which sleeps, rather than in tolist's copy, which
            # spins a core for as long as the queued updates take.
            done = torch.cuda.Event(blocking=True)
            done.record()
            done.synchronize()
        packed = packed.tolist()
        M = len(self.names)
        means = {name: (packed[i] / packed[M + i] if packed[M + i] else float("nan"))
                 for i, name in enumerate(self.names)}
        skipped, longest = int(packed[2 * M]), int(packed[2 * M + 1])
        self.sums.zero_()
        self.counts.zero_()
        self.skipped.zero_()
        self.longest_skip_run.copy_(self.skip_run)          # a run that goes on into the next interval
        self.updates = 0
        return means, skipped, longest
