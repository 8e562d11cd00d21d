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
from torch.utils._python_dispatch import TorchDispatchMode

# A device value brought to Python: every scalar read (item, float, int, bool, and a 0-dim
# tensor that an op takes as a number, such as _foreach_lerp_'s weight) dispatches aten's
# _local_scalar_dense from Python; tolist and numpy read without it. Each one waits for the
# device. (A CPU kernel's own scalar reads, std's or the fused CPU Adam's, are no device
# read: they are below the Python dispatch that _ScalarReads sees.)
SCALAR_READ = torch.ops.aten._local_scalar_dense.default
READ_METHODS = {torch.Tensor.tolist, torch.Tensor.numpy}
# Ops whose output shape depends on data (a boolean-mask selection): the host waits for it.
DATA_DEPENDENT_SHAPES = ("aten::nonzero",)


class _ReadCounter(TorchFunctionMode):
    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.count += func in READ_METHODS
        return func(*args, **(kwargs or {}))


class _ScalarReads(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += func is SCALAR_READ
        return func(*args, **(kwargs or {}))


@dataclass
class Counts:
    host_reads: int      # SCALAR_READ and DATA_DEPENDENT_SHAPES ops + READ_METHODS calls
    aten_ops: int        # every aten op the profiler saw (children of composite ops included)


def count(fn) -> Counts:
    """Runs fn() once under a TorchFunctionMode, a TorchDispatchMode and torch.profiler
    (CPU activity)."""
    with profile(activities=[ProfilerActivity.CPU]) as prof, _ReadCounter() as reads, _ScalarReads() as scalars:
        fn()
    events = prof.key_averages()
    return Counts(host_reads=reads.count + scalars.count + sum(e.count for e in events if e.key in DATA_DEPENDENT_SHAPES),
                  aten_ops=sum(e.count for e in events if e.key.startswith("aten::")))
