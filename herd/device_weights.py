"""Weights from a GPU learner to an inference server on the same GPU, device to device.

SharedWeights (herd/weights.py) is the host path: learner -> pinned buffer -> shared memory
-> the server's pinned buffer -> its GPU, two trips over PCIe for weights that never had to
leave the device. Where the server runs on the learner's own CUDA device it reads them from
this board instead: two slots of the flat float32 parameters, [2, P], in the learner's
device memory, handed to the server process as a CUDA IPC handle (torch.multiprocessing's
pickling; the learner keeps the board alive for the run). On a CPU the slots are shared
memory, so the same protocol runs, and is tested, with CPU tensors and real processes.

Protocol (one writer, the learner's publisher; any number of readers):

    writer   slot t = the one not holding the newest version;
             sequence[t] += 1 (odd: being written); copy params -> slots[t] (on the
             publisher's side stream); wait for the copy's event; versions[t] = v;
             sequence[t] += 1 (even); newest = t
    reader   s = newest; q = sequence[s] (odd: lapped by the writer, read again);
             v = versions[s]; copy slots[s] -> its own buffer (its stream), wait for it;
             keep it only if sequence[s] is still q, else read again

The writer never writes the newest slot, so a reader is only turned back when the writer
published twice during its copy. The re-check compares the slot's sequence, not the
published version: the writer starts overwriting a slot (v + 2's copy, enqueued) before it
publishes v + 2, so "no v + 2 published yet" would not prove the slot untouched.
Publishes are not numbered v, v + 1, ... (the publisher skips versions while a copy is in
flight), so slots alternate by write, not by version parity.

As in herd/weights.py, the checks rely on each side's loads and stores reaching memory in
program order (x86-64). On CUDA the writer's host store that opens a write precedes the
enqueue of its copy, and a reader's re-check follows its own copy's completion, so a copy
that overlapped a write is always seen.
"""
from __future__ import annotations

from typing import Callable, Sequence

import torch
import torch.multiprocessing as mp
from torch.nn.utils import vector_to_parameters

from herd.weights import copy_parts


def same_cuda_device(learner: torch.device, server: torch.device) -> tuple[bool, str]:
    """Whether a server on `server` can take the weights from a board on `learner` device
    to device, and why (for the log). Called in the learner's process: its "cuda" means its
    current device; a server process starts fresh, so its "cuda" means cuda:0."""
    learner, server = torch.device(learner), torch.device(server)
    if learner.type != "cuda" or server.type != "cuda":
        where = "the learner" if learner.type != "cuda" else "the server"
        return False, f"{where} is not on a CUDA device (learner {learner}, server {server})"
    mine = learner.index if learner.index is not None else (
        torch.cuda.current_device() if torch.cuda.is_available() else 0)
    theirs = server.index if server.index is not None else 0
    if mine != theirs:
        return False, f"the learner is on cuda:{mine}, the server on cuda:{theirs}"
    return True, f"the learner and the server share cuda:{mine}"


class DeviceWeightBoard:
    """Two slots of the flat parameters on the learner's device; see the module docstring."""

    def __init__(self, numel: int, device: torch.device | str, context=None):
        context = context or mp.get_context("spawn")
        self.slots = torch.zeros(2, numel, dtype=torch.float32, device=device)      # [2, P]
        if self.slots.device.type == "cpu":
            self.slots.share_memory_()            # CUDA tensors cross as IPC handles instead
        self._newest = context.Value("q", 0, lock=False)                  # the slot of the newest version
        self._sequence = context.Array("q", [0, 0], lock=False)           # per slot: odd while written
        self._versions = context.Array("q", [-1, -1], lock=False)         # per slot: -1, nothing yet
        self.retries = 0      # this process's reads turned back by the re-check (tests read it)

    @classmethod
    def for_model(cls, model: torch.nn.Module, context=None) -> "DeviceWeightBoard":
        params = list(model.parameters())
        return cls(sum(p.numel() for p in params), params[0].device, context)

    @property
    def device(self) -> torch.device:
        return self.slots.device

    @property
    def version(self) -> int:
        """The newest published version (-1: none yet)."""
        return int(self._versions[self._newest.value])

    # The writer: one process (the learner), one write at a time.

    def begin(self, flat: torch.Tensor | Sequence[torch.Tensor]) -> int:
        """Opens the slot not holding the newest version and enqueues flat [P] (or the
        parameters themselves, herd/weights.py copy_parts) into it (on CUDA on the current
        stream: the caller waits for it before finish). -> the slot."""
        slot = 1 - self._newest.value
        self._sequence[slot] += 1                                         # odd: readers keep off
        copy_parts(self.slots[slot], flat, non_blocking=True)
        return slot

    def finish(self, slot: int, version: int) -> None:
        """After the copy begun into `slot` completed: publishes it as `version`."""
        self._versions[slot] = version
        self._sequence[slot] += 1                                         # even: whole again
        self._newest.value = slot

    def publish_vector(self, flat: torch.Tensor | Sequence[torch.Tensor], version: int) -> None:
        """begin + wait + finish, blocking: the first publish, and CPU learners."""
        slot = self.begin(flat)
        if self.device.type == "cuda":
            wait_for_stream(torch.cuda.current_stream(self.device))
        self.finish(slot, version)

    # Readers: any process that was handed the board.

    def snapshot_into(self, out: torch.Tensor, stream=None, recheck: bool = True,
                      copy: Callable[[torch.Tensor, torch.Tensor, object], object] | None = None) -> int:
        """Copies the newest whole version into out [P] (on the board's device; on CUDA on
        `stream`, default the current one) and returns it; -1, out untouched, if nothing
        was published. For tests only: recheck=False, the negative control without the
        re-check, and copy(out, source, stream), which must return with the copy complete
        (a test's pauses halfway, so that a writer overlaps it deterministically)."""
        copy = copy or copy_and_wait
        while True:
            slot = self._newest.value
            sequence = self._sequence[slot]
            if sequence % 2:
                continue                          # lapped: the writer is in this slot now
            version = int(self._versions[slot])
            if version < 0:
                return -1
            copy(out, self.slots[slot], stream)
            if not recheck or self._sequence[slot] == sequence:
                return version
            self.retries += 1                     # overwritten while we copied: read the newest

    def pull(self, model: torch.nn.Module, have_version: int) -> int:
        """SharedWeights.pull's contract: loads newer weights into `model` (any device;
        the server's CUDA path, herd/inference/device.py, loads in place on its stream)."""
        if self.version in (have_version, -1):
            return have_version
        staged = torch.empty(self.slots.shape[1], dtype=torch.float32, device=self.device)   # [P]
        version = self.snapshot_into(staged)
        with torch.no_grad():
            vector_to_parameters(staged.to(next(model.parameters()).device), model.parameters())
        return version


def copy_and_wait(out: torch.Tensor, source: torch.Tensor, stream=None) -> None:
    """out <- source, complete when this returns (the re-check must follow the copy)."""
    if source.device.type != "cuda":
        out.copy_(source)
        return
    stream = stream or torch.cuda.current_stream(source.device)
    with torch.cuda.stream(stream):
        out.copy_(source, non_blocking=True)
    wait_for_stream(stream)


def wait_for_stream(stream) -> None:
    """Blocks until `stream`'s work so far is done; a blocking event sleeps, not spins."""
    done = torch.cuda.Event(blocking=True)
    done.record(stream)
    done.synchronize()
