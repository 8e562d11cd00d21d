"""Rollouts copied into a store on a GPU (herd/store.py, a device learner's replays) from
the actors' slots, without holding the host up and without a copy on the host.

    slot (page-locked in place, herd/devices.py host_register)
      -- one asynchronous copy per field, on a stream of its own --> the replay's ring
      -- its event --> the slot goes back to its actor (release_done)

A slot's fields are C-contiguous (herd/store.py TrajectorySlots), so each crosses PCIe in
one transfer. The copy stream first waits for what the learner's stream has queued (a
gather may still read the positions being overwritten), and the learner's stream then
waits for the copy's event (a batch gathered later may read them): both on the device, no
host wait. Until the event has fired the slot is the copy's source, so its release is
deferred (release_after); on a CPU device the copy is done when put returns and nothing is
deferred."""
from __future__ import annotations

import threading
from collections import deque
from contextlib import contextmanager
from typing import Callable, Iterator

import torch


class DeviceCopies:
    def __init__(self, device: torch.device):
        self.device = device
        self.stream = torch.cuda.Stream(device) if device.type == "cuda" else None
        self.lock = threading.Lock()        # puts come from the learner's thread and batch workers
        self.latest = None                  # the event of the last copy queued
        self.waiting: deque = deque()       # (event, on_free), oldest first
        self.copies = 0                     # rollouts copied (what the tests count)

    @contextmanager
    def copying(self, rollout: bool = True) -> Iterator[None]:
        """Around one rollout's copies into a device store (TrajectoryStore.put), or
        (rollout=False, not counted) another copy a slot's release must wait for."""
        with self.lock:
            self.copies += rollout
        if self.stream is None:
            yield
            return
        learner = torch.cuda.current_stream(self.device)
        self.stream.wait_stream(learner)
        with torch.cuda.stream(self.stream):
            yield
            event = torch.cuda.Event()
            event.record(self.stream)
        learner.wait_event(event)
        with self.lock:
            self.latest = event

    def release_after(self, on_free: Callable[[], None]) -> bool:
        """on_free() once every copy queued so far has finished (True), or False: nothing
        is in flight (a CPU device), free the source now."""
        with self.lock:
            if self.latest is None:
                return False
            self.waiting.append((self.latest, on_free))
            return True

    def release_done(self) -> int:
        """Calls on_free for each copy finished, in order; returns how many."""
        released = 0
        while True:
            with self.lock:
                if not self.waiting or not self.waiting[0][0].query():
                    return released
                _, on_free = self.waiting.popleft()
            on_free()
            released += 1

    def pending(self) -> int:
        with self.lock:
            return len(self.waiting)
