"""The replay writer queue: rollouts waiting to be written into the replays.

Bounded by `replay_writer_queue_size` rollouts. When a rollout arrives at a full queue,
`discarding_strategy` decides what is lost: `keep_latest` drops the oldest waiting
rollout, `keep_oldest` drops the newcomer, `alternating` switches between the two so
neither old nor new data is systematically favoured. herd's default, `wait`, discards
nothing: the learner stops taking rollouts until there is room, so actors back off through
their slots (on a small machine, idle actors leave the cores to the learner)."""
from __future__ import annotations

import threading
from collections import deque

DISCARDING_STRATEGIES = ("wait", "keep_latest", "keep_oldest", "alternating")


class WriterQueue:
    def __init__(self, size: int, strategy: str):
        if strategy not in DISCARDING_STRATEGIES:
            raise ValueError(f"unknown discarding_strategy '{strategy}'")
        self.size = size
        self.strategy = strategy
        self.items: deque = deque()
        self.discarded = 0
        self.flip = False
        self.lock = threading.Lock()
        self.not_empty = threading.Condition(self.lock)
        self.poked = False          # new data reached the replays without this queue

    def has_room(self) -> bool:
        with self.lock:
            return len(self.items) < self.size

    def offer(self, item) -> None:
        """Queues `item`; on a full queue discards by the strategy (`wait`: callers check
        has_room() first, an item offered anyway is queued beyond the bound)."""
        with self.lock:
            if len(self.items) >= self.size and self.strategy != "wait":
                self.discarded += 1
                keep_latest = self.strategy == "keep_latest" or (self.strategy == "alternating" and self.flip)
                self.flip = not self.flip
                if not keep_latest:
                    return
                self.items.popleft()
            self.items.append(item)
            self.not_empty.notify()

    def wait_for_work(self, timeout: float) -> None:
        """Returns when an item waits, or poke() was called since the last return, or after
        `timeout` seconds."""
        with self.lock:
            if not self.items and not self.poked:
                self.not_empty.wait(timeout)
            self.poked = False

    def poke(self) -> None:
        """Wakes a wait_for_work: data went into the replays directly (a batch may be ready)."""
        with self.lock:
            self.poked = True
            self.not_empty.notify()

    def peek(self):
        with self.lock:
            return self.items[0] if self.items else None

    def pop(self):
        with self.lock:
            return self.items.popleft()
