"""Counts what a piece of learner code asks of the device, for tests and benchmarks:
host reads (a device value brought to Python, or a shape that depends on data) and aten
ops. Counts, not times: they are the same on a CPU as on a GPU, so a CPU-only test can
hold the line that a GPU's speed depends on (docs/learner-speed.md, "An update without
host reads")."""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.overrides import TorchFunctionMode
from torch.profiler import ProfilerActivity, profile

# Tensor methods that return a device value to Python: each one waits for the device.
READ_METHODS = {torch.Tensor.item, torch.Tensor.tolist, torch.Tensor.numpy, torch.Tensor.__bool__,
                torch.Tensor.__float__, torch.Tensor.__int__}
# Ops whose output shape depends on data (a boolean-mask selection): the host waits for it.
DATA_DEPENDENT_SHAPES = ("aten::nonzero",)


class _ReadCounter(TorchFunctionMode):
    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.count += func in READ_METHODS
        return func(*args, **(kwargs or {}))


@dataclass
class Counts:
    host_reads: int      # READ_METHODS calls + DATA_DEPENDENT_SHAPES ops
    aten_ops: int        # every aten op the profiler saw (children of composite ops included)


def count(fn) -> Counts:
    """Runs fn() once under a TorchFunctionMode and torch.profiler (CPU activity)."""
    with profile(activities=[ProfilerActivity.CPU]) as prof, _ReadCounter() as reads:
        fn()
    events = prof.key_averages()
    return Counts(host_reads=reads.count + sum(e.count for e in events if e.key in DATA_DEPENDENT_SHAPES),
                  aten_ops=sum(e.count for e in events if e.key.startswith("aten::")))
