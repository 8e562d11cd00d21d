"""The weight board: versioned policy weights, one writer (the learner) and any number of
readers in other processes (actors, inference servers, the evaluator).

One class, WeightBoard: `num_slots` slots of the flat float32 parameters [N, P], in host
shared memory or on a CUDA device (crossing to other processes as an IPC handle), under a
sequence lock per slot. Readers hold nothing, so a reader killed mid-read (kill -9, a
crashed env) cannot leave the writer waiting forever, as a shared lock could.

    writer   slot t = the slot after the newest (with one slot, the newest itself);
             sequence[t] += 1 (odd: being written); copy the parameters in (on CUDA on
             the caller's stream, waited for before finish); versions[t] = v;
             sequence[t] += 1 (even); newest = t
    reader   s = newest; q = sequence[s] (odd: being written, read again); v = versions[s];
             copy slot s out, complete; keep it only if sequence[s] is still q, else read again

Two boards are built from it:
- SharedWeights: one slot in host memory, holding the model's weights from the start
  (version 0). A CPU learner's own parameters can live in it (`adopt`): the optimizer then
  writes the weights where readers read them, inside `writing()` (the sequence odd while
  it writes), and a publish only moves the version: no copy per update. A GPU learner
  copies its parameters off the device into it, and only while some reader takes them
  from the host (herd/backends/local.py host_weight_store).
- DeviceWeightBoard (herd/device_weights.py): two slots on the learner's GPU for inference
  servers on that GPU, device to device; the writer never writes the newest slot, so a
  reader is only turned back when the writer published twice during its copy. Publishes
  are not numbered v, v + 1, ... (the publisher skips versions while a copy is in
  flight), so slots alternate by write, not by version parity.

The checks rely on each side's stores and loads reaching memory in program order, which
x86-64 guarantees (on CUDA the writer's host store that opens a write precedes the
enqueue of its copy, and a reader's re-check follows its own copy's completion). On a
weakly ordered CPU a pull could, rarely, mix two consecutive versions: harmless to the
learning maths, because every trajectory records the behaviour policy's own outputs
(logits, Q values) and the losses correct against those.

The one writer can die too (kill -9 inside its copy, or inside a CPU learner's optimizer
step under writing()), leaving a sequence odd for good. Each write names its writer's pid
first, so a reader that meets an odd sequence checks every WRITER_CHECK_S whether that
process still lives and, if not, raises PublisherGone (an actor, a server or the evaluator
then ends quietly: its run is gone); a writer still alive but stuck on the same odd sequence
for PUBLISH_DEADLINE_S ends the reader with an error instead of leaving it spinning."""
from __future__ import annotations

import os
import time
from contextlib import contextmanager
from typing import Callable, Iterator, Sequence

import numpy as np
import psutil
import torch
import torch.multiprocessing as mp
from torch.nn.utils import parameters_to_vector, vector_to_parameters

PUBLISH_DEADLINE_S = 30.0   # a publish is one memcpy (milliseconds): this long odd means its writer hangs
WRITER_CHECK_S = 0.05       # how often a reader held off by an odd sequence checks that its writer lives


class PublisherGone(RuntimeError):
    """The process that began the write a reader waits on died inside it: no version will
    come (its learner is gone)."""


def process_lives(pid: int) -> bool:
    """Whether process `pid` runs (a zombie, killed and not yet reaped, does not); pid 0:
    no write began yet, nothing to say."""
    if pid == 0:
        return True
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def flat_views(flat: torch.Tensor, parts: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """Views of flat [P], one per part and of its shape, laid end to end."""
    return [view.view(part.shape) for view, part in zip(flat.split([part.numel() for part in parts]), parts)]


class WeightBoard:
    """The sequence lock over slots of the flat weights; see the module docstring."""

    def __init__(self, numel: int, device: torch.device | str = "cpu", num_slots: int = 1, context=None):
        context = context or mp.get_context("spawn")
        self.slots = torch.zeros(num_slots, numel, dtype=torch.float32, device=device)      # [N, P]
        if self.slots.device.type == "cpu":
            self.slots.share_memory_()            # CUDA tensors cross as IPC handles instead
        self._newest = context.Value("q", 0, lock=False)                      # the slot of the newest version
        self._sequence = context.Array("q", [0] * num_slots, lock=False)       # per slot: odd while written
        self._versions = context.Array("q", [-1] * num_slots, lock=False)      # per slot: -1, nothing yet
        self._writer = context.Value("q", 0, lock=False)                      # pid of the last write's process
        self.retries = 0          # this process's reads turned back by the re-check (tests read it)
        self.adopted = False      # a learner's parameters are views of the one slot (adopt)
        self.views: dict[tuple, list[torch.Tensor]] = {}        # (slot, the parts' shapes) -> the slot's views for them
        self.host_views: dict[tuple, list[np.ndarray]] = {}     # the same as numpy arrays

    @property
    def device(self) -> torch.device:
        return self.slots.device

    @property
    def version(self) -> int:
        """The newest published version (-1: none yet)."""
        return int(self._versions[self._newest.value])

    def __getstate__(self) -> dict:
        """A reader's process gets the slots, not this process's cached views (copies once pickled)."""
        return {**self.__dict__, "views": {}, "host_views": {}}

    # The writer: one process (the learner), one write at a time.

    def begin(self, parts: torch.Tensor | Sequence[torch.Tensor] | Sequence[np.ndarray]) -> int:
        """Opens the next slot and copies the parameters into it: a flat vector [P], or
        tensors whose elements, laid end to end in order, make the P (a model's parameters:
        one copy each, straight in, where joining them first would copy every weight twice);
        on CUDA enqueued on the current stream (the caller waits for it before finish).
        Given as numpy arrays (a CPU learner's publisher), they are copied by numpy in this
        thread: torch with several threads (an fp32 CPU learner has one per core) splits
        each large copy over them, and with the actors busy on the other cores they wait
        for one another. -> the slot."""
        slot = (self._newest.value + 1) % self.slots.shape[0]
        self._writer.value = os.getpid()                                   # first: who a stuck reader asks after
        self._sequence[slot] += 1                                          # odd: readers keep off
        flat = self.slots[slot]
        if isinstance(parts, torch.Tensor):
            flat.copy_(parts, non_blocking=True)
        elif isinstance(parts[0], np.ndarray):
            for view, part in zip(self.host_views_for(slot, parts), parts):
                np.copyto(view, part)
        else:
            torch._foreach_copy_(self.views_for(slot, parts), list(parts), non_blocking=True)
        return slot

    def finish(self, slot: int, version: int) -> None:
        """After the copy begun into `slot` completed: publishes it as `version`."""
        self._versions[slot] = version
        self._sequence[slot] += 1                                          # even: whole again
        self._newest.value = slot

    def publish_vector(self, parts, version: int | None = None) -> int:
        """begin + wait + finish, blocking: the parameters (as begin takes them) published as
        `version`, or as the next version. Adopted parameters are not copied onto
        themselves: the version moves."""
        version = self.version + 1 if version is None else version
        if self.adopted:
            return self.publish_adopted(parts, version)
        slot = self.begin(parts)
        if self.device.type == "cuda":
            wait_for_stream(torch.cuda.current_stream(self.device))
        self.finish(slot, version)
        return version

    def publish(self, model: torch.nn.Module, version: int | None = None) -> int:
        """publish_vector of the model's parameters (off a GPU first onto a host board)."""
        if self.adopted:
            return self.publish_adopted(None, self.version + 1 if version is None else version)
        with torch.no_grad():
            vector = parameters_to_vector(model.parameters()).detach().to(self.device)
        return self.publish_vector(vector, version)

    def views_for(self, slot: int, parts: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """The slot's views for these parts, made once per slot: a learner publishes the
        same parameters every update."""
        key = (slot, *(part.shape for part in parts))
        if key not in self.views:
            self.views[key] = flat_views(self.slots[slot], parts)
        return self.views[key]

    def host_views_for(self, slot: int, parts: Sequence[np.ndarray]) -> list[np.ndarray]:
        """views_for() as numpy arrays."""
        key = (slot, *(part.shape for part in parts))
        if key not in self.host_views:
            tensors = [torch.from_numpy(part) for part in parts]
            self.host_views[key] = [view.numpy() for view in flat_views(self.slots[slot], tensors)]
        return self.host_views[key]

    # A CPU learner's parameters in the board itself.

    def adopt(self, model: torch.nn.Module) -> bool:
        """Makes the model's parameters views of the one slot, in the order and shapes
        readers load (their values kept), where the board is one slot in host memory and
        every parameter a float32 tensor contiguous in host memory (a CPU learner's): its
        optimizer then updates the weights in place, inside writing(), and a publish only
        moves the version. False, with the model unchanged, for any other model or board
        (a GPU learner's weights are copied off the device)."""
        params = list(model.parameters())
        if self.slots.shape[0] != 1 or self.device.type != "cpu" or not all(
                p.device.type == "cpu" and p.dtype == torch.float32 and p.is_contiguous() for p in params):
            return False
        if sum(p.numel() for p in params) != self.slots.shape[1]:
            raise ValueError(f"the model has {sum(p.numel() for p in params)} weights; this board holds "
                             f"{self.slots.shape[1]}")
        with torch.no_grad():
            for param, view in zip(params, flat_views(self.slots[0], params)):
                view.copy_(param)
                param.data = view
        self.adopted = True
        return True

    @contextmanager
    def writing(self) -> Iterator[None]:
        """Around every in-place write of adopted parameters (the learner's optimizer step):
        a reader whose copy overlaps it copies again."""
        self._writer.value = os.getpid()
        self._sequence[0] += 1
        try:
            yield
        finally:
            self._sequence[0] += 1

    def publish_adopted(self, parts, version: int) -> int:
        """publish_vector() for adopted parameters: they are already here, written under
        writing(); only the version moves. `parts` (the publisher's view of them) is not
        read."""
        if not self.adopted:
            raise RuntimeError("publish_adopted: no parameters were adopted; publish_vector copies them in")
        self._versions[0] = version
        return version

    # Readers: any process that was handed the board.

    def snapshot_into(self, out: torch.Tensor, stream=None, recheck: bool = True,
                      copy: Callable[[torch.Tensor, torch.Tensor, object], object] | None = None) -> int:
        """Copies the newest whole version into out [P] (any device; from a CUDA board on
        `stream`, default the current one) and returns it; -1, out untouched, if nothing
        was published. For tests only: recheck=False, the negative control without the
        re-check, and copy(out, source, stream), which must return with the copy complete
        (a test's pauses halfway, so that a writer overlaps it deterministically)."""
        copy = copy or copy_and_wait
        stuck, since, checked = None, 0.0, 0.0     # an odd sequence seen, since when, its writer last checked
        while True:
            slot = self._newest.value
            sequence = self._sequence[slot]
            if sequence % 2 == 0:
                version = int(self._versions[slot])
                if version < 0:
                    return -1
                copy(out, self.slots[slot], stream)
                if not recheck or self._sequence[slot] == sequence:
                    return version
                self.retries += 1         # overwritten while we copied: read the newest
                continue
            now = time.monotonic()
            if (slot, sequence) != stuck:
                stuck, since, checked = (slot, sequence), now, now
            elif now - since > PUBLISH_DEADLINE_S:
                raise RuntimeError(f"the weights' publisher stopped inside a publish (no progress for "
                                   f"{PUBLISH_DEADLINE_S:g} s): it hangs")
            elif now - checked > WRITER_CHECK_S:
                checked = now
                if not process_lives(self._writer.value):
                    raise PublisherGone(f"the weights' publisher (pid {self._writer.value}) died inside a publish")
            time.sleep(0)                 # being written (a memcpy): let it finish

    def snapshot(self) -> tuple[torch.Tensor, int]:
        """(a copy of the newest whole version on the board's device, its version)."""
        out = torch.empty(self.slots.shape[1], dtype=torch.float32, device=self.device)
        return out, self.snapshot_into(out)

    def pull(self, model: torch.nn.Module, have_version: int) -> int:
        """Loads the published weights into `model` (any device) if they are newer than
        have_version; returns the version it holds then."""
        if self.version in (have_version, -1):
            return have_version
        vector, version = self.snapshot()
        if version < 0:
            return have_version
        with torch.no_grad():
            vector_to_parameters(vector.to(next(model.parameters()).device), model.parameters())
        return version


class SharedWeights(WeightBoard):
    """The host board: one slot in shared memory, holding `model`'s weights as version 0."""

    def __init__(self, model: torch.nn.Module, context=None):
        vector = parameters_to_vector(model.parameters()).detach().cpu()
        super().__init__(vector.numel(), "cpu", 1, context)
        self.publish_vector(vector, 0)

    @property
    def flat(self) -> torch.Tensor:
        """The one slot: [P]."""
        return self.slots[0]


def copy_and_wait(out: torch.Tensor, source: torch.Tensor, stream=None) -> None:
    """out <- source, complete when this returns (the re-check must follow the copy)."""
    if source.device.type != "cuda" and out.device.type != "cuda":
        out.copy_(source)
        return
    device = source.device if source.device.type == "cuda" else out.device
    stream = stream or torch.cuda.current_stream(device)
    with torch.cuda.stream(stream):
        out.copy_(source, non_blocking=True)
    wait_for_stream(stream)


def wait_for_stream(stream) -> None:
    """Blocks until `stream`'s work so far is done; a blocking event sleeps, not spins."""
    done = torch.cuda.Event(blocking=True)
    done.record(stream)
    done.synchronize()
