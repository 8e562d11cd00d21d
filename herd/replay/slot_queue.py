"""The on-policy queue, read where the actors wrote it.

A CPU learner whose only replay is the queue (herd/replay/mixer.py `lends`) trains each
fresh trajectory once, soon. Copying it out of the actor's slot into the queue's own store
would be its one copy; reading it in the slot instead leaves none where a batch is one run
of positions inside one slot (a lent view, herd/store.py TrajectorySlots.lend), and one
gather where it is not. The slot then stays with the learner until every trajectory in it has been trained
on (or dropped, as the queue's ring drops the oldest unused trajectory when more arrive
than its capacity): the batch source then calls the rollout's `on_free` (the backend gives
the slot back to its actor). The queue holds as many trajectories as its own store would,
so where it reads them does not change the policy lag.

`read_slots(slots)` switches the queue to the actors' slots (herd/store.py TrajectorySlots,
the local backend's: herd/learner/loop.py RolloutSource.slots). Until then, and while
trajectories loaded from a checkpoint or copied before the switch wait in the queue's own
store, rollouts are copied (keep() says no), so nothing is lost and the order stays first
in, first out. A checkpoint saves the waiting trajectories in the queue's own format: a
run resumes them whether or not its queue reads slots.

The learner must always be able to form a batch from what the slots hold, so the switch
needs slots for a batch share and one rollout beside it (SlotQueue.fits); with fewer the
queue keeps copying (and run_loop's log line saying that it reads the slots is absent)."""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Callable

import numpy as np

from herd.replay.replay import Replay, ReplayKeys
from herd.replay.samplers import FifoSampler
from herd.store import TrajectorySlots, TrajectoryStore


@dataclass(frozen=True)
class SlotKeys(ReplayKeys):
    """Keys of a batch read from the actors' slots (positions of their store); `gathered`:
    the batch buffer it was gathered into (None: lent as a view), reused once given back."""
    gathered: dict | None = None


@dataclass
class Held:
    """One rollout kept in its slot: freed once `remaining` of its trajectories are trained on."""
    on_free: Callable[[], None]
    remaining: int


class SlotQueue(Replay):
    def __init__(self, storage: TrajectoryStore, share: int):
        super().__init__("queue", storage, FifoSampler(storage.capacity), on_policy=True)
        self.share = share
        self.slots: TrajectorySlots | None = None       # the actors' slots, once read_slots() switched to them
        self.waiting: deque[int] = deque()              # its positions not yet sampled, oldest first
        self.versions = np.zeros(0, dtype=np.int64)     # [slot positions] the policy that acted
        self.holds: dict[int, Held] = {}                # slot position -> the rollout it belongs to
        self.buffers: list[dict] = []                   # batch buffers given back, for the next gathers

    @staticmethod
    def fits(share: int, capacity: int, rollout_size: int) -> bool:
        """Slots of `capacity` positions can always make a batch share: whatever the queue
        holds without being able to serve is less than a share plus the one rollout it is
        part way through, so with that much room an actor always has a slot to fill."""
        return capacity >= share + rollout_size

    def read_slots(self, slots: TrajectorySlots) -> None:
        self.slots = slots
        self.versions = np.full(slots.capacity, -1, dtype=np.int64)

    def copying(self) -> bool:
        """Rollouts are copied: no slots yet, or the own store still holds trajectories
        (loaded, or copied before the switch) that come first."""
        return self.slots is None or self.sampler.available() > 0 or bool(self.sampler.lent)

    def keep(self, start: int, n: int, version: int, on_free: Callable[[], None], overwrite: bool = True) -> bool:
        """The rollout in slot positions start .. start + n - 1 joins the queue where it is
        (True: on_free() is called once all n are trained on or dropped); False: copy it
        (add_rollout). overwrite: beyond the queue's capacity the oldest waiting
        trajectories are dropped, as its ring would overwrite them (False: the caller keeps
        the queue within it by taking no rollout while it is full)."""
        if self.copying():
            return False
        held = Held(on_free, n)
        for position in range(start, start + n):
            self.holds[position] = held
            self.waiting.append(position)
        self.versions[start:start + n] = version
        while overwrite and len(self.waiting) > self.storage.capacity:
            self.release(self.waiting.popleft())
        return True

    def full(self) -> bool:
        """Reading the slots and holding as many waiting trajectories as its capacity."""
        return not self.copying() and len(self.waiting) >= self.storage.capacity

    def release(self, position: int) -> None:
        """A slot position trained on (or dropped): its rollout's slot is freed with its last one."""
        held = self.holds.pop(position)
        held.remaining -= 1
        if held.remaining == 0:
            held.on_free()

    def add_rollout(self, rollout: dict[str, np.ndarray], version: int) -> None:
        if self.waiting:
            # Behind trajectories read in the slots: they would be served out of order.
            raise RuntimeError("a queue reading the actors' slots takes rollouts in place (keep)")
        super().add_rollout(rollout, version)

    def available(self) -> int:
        return self.sampler.available() + len(self.waiting)     # one of the two is 0

    def room(self) -> int:
        """Own store: as the FIFO's; in the slots, what is left of the capacity."""
        return self.storage.capacity - len(self.waiting) if not self.copying() else super().room()

    def lend(self, n: int, rng: np.random.Generator):
        if not self.waiting:
            return super().lend(n, rng)
        positions = np.array([self.waiting.popleft() for _ in range(n)], dtype=np.int64)
        data = self.slots.lend(positions)               # a view where the positions are one run in a slot
        gathered = None
        if data is None:
            # Else the one gather, into a batch buffer kept for the next (a fresh allocation
            # of a batch's frames costs more than the copy: its pages are faulted in anew).
            data = gathered = self.slots.read(positions, out=self.buffers.pop() if self.buffers else None)
        keys = SlotKeys(positions, np.zeros(n, dtype=np.int64), gathered)
        return data, self.versions[positions].copy(), keys, np.ones(n), True

    def draw(self, n: int, rng: np.random.Generator):
        if self.waiting:
            raise RuntimeError("a queue reading the actors' slots lends its batches (ReplayMixer(lends=True))")
        return super().draw(n, rng)

    def give_back(self, keys: ReplayKeys) -> None:
        if not isinstance(keys, SlotKeys):
            super().give_back(keys)
            return
        for position in keys.positions.tolist():
            self.release(position)
        if keys.gathered is not None:
            self.buffers.append(keys.gathered)          # the step has read it: the next gather's

    def update(self, keys: ReplayKeys, values) -> int:
        return 0 if isinstance(keys, SlotKeys) else super().update(keys, values)

    def load_state_dict(self, state: dict) -> None:
        """A queue saved with another capacity (an older herd's queue, or another batch
        share or number of batches prepared ahead) holds what matters in its waiting
        trajectories: they are added in order, oldest first, to this queue's ring (beyond
        its capacity the oldest drop, as its ring would drop them)."""
        if len(state.get("generation", ())) in (0, self.storage.capacity):
            super().load_state_dict(state)
            return
        filled = len(state["storage"]["version"])
        saved = TrajectoryStore(self.storage.layout, max(filled, 1))
        saved.load_state_dict(state["storage"])
        for position in state["sampler"]["pending"]:
            self.add({name: array[:, position] for name, array in saved.arrays.items()}, int(saved.version[position]))

    def state_dict(self) -> dict:
        """The waiting trajectories in the queue's own format (at most its capacity, the
        newest: what its ring would have kept)."""
        if not self.waiting:
            return super().state_dict()
        capacity = self.storage.capacity
        positions = np.array(list(self.waiting)[-capacity:], dtype=np.int64)
        k = len(positions)
        saved = TrajectoryStore(self.storage.layout, k)
        saved.put(0, self.slots.read(positions), 0)
        saved.version[:] = self.versions[positions]
        return {"storage": saved.state_dict(k),
                "sampler": {"ring": {"next": k % capacity, "filled": k}, "pending": list(range(k))},
                "generation": np.zeros(capacity, dtype=np.int64)}
