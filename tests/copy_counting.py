"""Counting the copies of observation data, in tests only: how many bytes of frames an op
writes into memory of its own, whether numpy or torch does it.

A frame is "observation-like" data: an array or tensor of the observations' dtype whose
trailing dimensions are the observation shape ([..., 4, 84, 84] uint8 for Atari). Three
instruments feed one CopyCounter:

    ObsArray         an ndarray subclass for the path's numpy arrays (the slot's views, the
                     replays' storage): its copy(), fancy indexing (a __getitem__ whose
                     result shares no memory with it), slice assignment (__setitem__ of
                     frames) and every numpy function dispatched on it (__array_function__:
                     concatenate, stack, take, ...) that returns frames of its own, or
                     copies them into other memory (copyto), count,
                     and what numpy makes of it stays an ObsArray, followed further;
    numpy_wrapped()  np.array, np.asarray and np.ascontiguousarray, which numpy does not
                     dispatch on their argument, wrapped to count a result that shares no
                     memory with its argument;
    TorchCopies      a torch dispatch mode counting the aten ops that move frames into
                     memory of their own (copy_, clone, _to_copy, cat, stack, index_select,
                     index, gather, take, ...): the bytes of frames they write.

A torch dispatch mode is per thread: `in_thread(fn)` runs fn under the same mode, for the
threads a batch source starts."""
from __future__ import annotations

import threading
from contextlib import contextmanager

import numpy as np
import torch
from torch.utils._python_dispatch import TorchDispatchMode


class CopyCounter:
    def __init__(self, obs_shape: tuple, obs_dtype):
        self.obs_shape = tuple(obs_shape)
        self.np_dtype = np.dtype(obs_dtype)
        self.torch_dtype = torch.from_numpy(np.zeros(0, self.np_dtype)).dtype
        self.lock = threading.Lock()
        self.bytes = 0
        self.by_op: dict[str, int] = {}          # op -> bytes of frames it wrote

    def is_frames(self, value) -> bool:
        if isinstance(value, np.ndarray):
            dtype = value.dtype == self.np_dtype
        elif isinstance(value, torch.Tensor):
            dtype = value.dtype == self.torch_dtype
        else:
            return False
        return dtype and tuple(value.shape[-len(self.obs_shape):]) == self.obs_shape and value.ndim > len(self.obs_shape)

    def add(self, op: str, nbytes: int) -> None:
        with self.lock:
            self.bytes += nbytes
            self.by_op[op] = self.by_op.get(op, 0) + nbytes


COUNTER: CopyCounter | None = None       # the counter ObsArray reports to (one test at a time)


def shares(a: np.ndarray, b) -> bool:
    return isinstance(b, np.ndarray) and np.may_share_memory(a.view(np.ndarray), b.view(np.ndarray))


class ObsArray(np.ndarray):
    """An ndarray that reports the frames copied out of it or into it to COUNTER."""

    def copy(self, order="C"):
        result = super().copy(order)
        if COUNTER is not None and COUNTER.is_frames(result):
            COUNTER.add("numpy copy()", result.nbytes)
        return result

    def __getitem__(self, key):
        result = super().__getitem__(key)
        if COUNTER is not None and COUNTER.is_frames(result) and not shares(result, self):
            COUNTER.add("numpy fancy index", result.nbytes)
        return result

    def __setitem__(self, key, value):
        super().__setitem__(key, value)
        if COUNTER is not None and COUNTER.is_frames(value):
            COUNTER.add("numpy slice assignment", np.asarray(value).nbytes)

    def __array_function__(self, func, types, args, kwargs):
        result = super().__array_function__(func, types, args, kwargs)
        if func is np.copyto and COUNTER is not None:
            destination, source = (*args, *kwargs.values())[:2]
            if COUNTER.is_frames(np.asarray(destination)) and not shares(np.asarray(destination), source):
                COUNTER.add("numpy copyto", np.asarray(destination).nbytes)
            return result
        if COUNTER is not None and isinstance(result, np.ndarray) and COUNTER.is_frames(result):
            inputs = [a for a in (*args, *kwargs.values()) if isinstance(a, np.ndarray)]
            if not any(shares(result, a) for a in inputs):
                COUNTER.add(f"numpy {func.__name__}", result.nbytes)
            return result.view(ObsArray)          # followed further (numpy returns a plain ndarray)
        return result


@contextmanager
def numpy_wrapped(monkeypatch, counter: CopyCounter):
    """np.array, np.asarray and np.ascontiguousarray count a copy of frames."""
    def wrap(name):
        original = getattr(np, name)

        def counted(a, *args, **kwargs):
            result = original(a, *args, **kwargs)
            if isinstance(a, np.ndarray) and counter.is_frames(result):
                if not shares(result, a):
                    counter.add(f"numpy {name}", result.nbytes)
                if isinstance(a, ObsArray):
                    return result.view(ObsArray)  # followed further
            return result
        monkeypatch.setattr(np, name, counted)
    for name in ("array", "asarray", "ascontiguousarray"):
        wrap(name)
    yield


# aten ops that write data into memory of their own (an out= variant writes into its argument).
COPYING = {"copy_", "clone", "_to_copy", "cat", "stack", "index_select", "index", "gather", "take",
           "contiguous", "_unsafe_view", "masked_select", "repeat", "narrow_copy", "index_put_", "_index_put_impl_",
           "slice_scatter", "select_scatter", "as_strided_scatter", "lift_fresh_copy"}


class TorchCopies(TorchDispatchMode):
    """Counts, per aten op, the bytes of frames written by the COPYING ops."""

    def __init__(self, counter: CopyCounter):
        super().__init__()
        self.counter = counter

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        result = func(*args, **kwargs)
        name = func.overloadpacket.__name__
        if name in COPYING:
            # In place: its first argument (index_put_: the values it puts); else its result.
            written = args[2] if name.startswith(("index_put", "_index_put")) else args[0] if name.endswith("_") \
                else result
            if isinstance(written, torch.Tensor) and self.counter.is_frames(written):
                self.counter.add(f"aten {name}", written.numel() * written.element_size())
        return result


def in_thread(fn, mode_of):
    """fn, run under the mode mode_of() gives (a fresh one per thread over the same counter)."""
    def run(*args, **kwargs):
        with mode_of():
            return fn(*args, **kwargs)
    return run
