"""IMPACT's circular buffer (Luo et al. 2020, section 3.2) as a sampler: it holds the last
N batches and serves each one K times, so every fresh trajectory is trained on K times
without a uniform replay's random re-draws.

Positions form N slots of `share` trajectories each (slot j holds positions
j*share .. (j+1)*share - 1); the replay's storage is N * share trajectories. Trajectories
fill the slots in ring order; a slot becomes a batch once all its `share` positions are
written, with K uses. sample(share) serves one batch, chosen at random among those with
uses left (as the paper's learner draws from its buffer), its columns in write order; a
batch is evicted after its K-th use, or when it is the oldest and its slot is needed for
a new batch (its unused passes are then lost, and counted in `evicted_unused`).

The buffer is on-policy in the mixer's sense (herd/replay/mixer.py): a batch is ready when
one batch with uses waits (`available()` counts the positions of the batches with uses
left), and `room()` (how many trajectories can come before a batch with uses would be
overwritten) makes a prefetching writer, and so the actors, wait rather than evict.
Every sample must ask for exactly one batch (`share` positions): the registry builds it
with the replay's share of the batch.

`served` tells which batch the last sample() served and whether that was its last pass:
IMPACT computes the target network's outputs for a batch once (herd/losses/impact.py), and
the learner publishes its weights after a batch's last pass only (herd/replay/mixer.py's
MixedBatch.reuse_key and last_pass)."""
from __future__ import annotations

import numpy as np

from herd.replay.samplers import Sampler


class CircularSampler(Sampler):
    def __init__(self, num_batches: int, share: int, iterations: int):
        if num_batches < 1 or share < 1 or iterations < 1:
            raise ValueError(f"a circular buffer needs num_batches, share and iterations >= 1, got "
                             f"{num_batches}, {share}, {iterations}")
        self.num_batches, self.share, self.iterations = num_batches, share, iterations
        self.uses_left = np.zeros(num_batches, dtype=np.int64)   # [N] 0: empty, being filled or used up
        self.written = np.zeros(num_batches, dtype=np.int64)     # [N] positions of each slot written
        self.filling = 0                                         # the slot new trajectories go to
        self.filled_slots = 0                                    # slots ever written (stored())
        self.evicted_unused = 0                                  # batches overwritten with uses left
        self.served: tuple[int, bool] | None = None     # (slot, whether it was the last pass) of the last sample

    @property
    def capacity(self) -> int:
        return self.num_batches * self.share

    def add(self) -> int:
        slot = self.filling
        if self.written[slot] == 0:
            # A new batch starts here: whatever the slot held (the oldest batch) is gone.
            self.evicted_unused += int(self.uses_left[slot] > 0)
            self.uses_left[slot] = 0
            self.filled_slots = min(self.filled_slots + 1, self.num_batches)
        position = slot * self.share + int(self.written[slot])
        self.written[slot] += 1
        if self.written[slot] == self.share:        # the batch is complete: servable K times
            self.uses_left[slot] = self.iterations
            self.written[slot] = 0
            self.filling = (slot + 1) % self.num_batches
        return position

    def available(self) -> int:
        return int(np.count_nonzero(self.uses_left)) * self.share

    def room(self, capacity: int) -> int:
        """Trajectories that can be written before a batch with uses left is overwritten:
        the rest of the slot being filled, then every following slot with none left
        (its own slots: `capacity` is theirs)."""
        free = 0
        for k in range(self.num_batches):
            slot = (self.filling + k) % self.num_batches
            if k == 0 and self.written[slot] > 0:
                free += self.share - int(self.written[slot])
            elif self.uses_left[slot] > 0:
                break
            else:
                free += self.share
        return free

    def stored(self) -> int:
        return self.filled_slots * self.share

    def sample(self, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        if n != self.share:
            raise ValueError(f"the circular buffer serves whole batches of {self.share} trajectories, asked for {n}")
        servable = np.flatnonzero(self.uses_left)
        if len(servable) == 0:
            raise ValueError("the circular buffer holds no batch with uses left")
        slot = int(servable[rng.integers(len(servable))]) if len(servable) > 1 else int(servable[0])
        self.uses_left[slot] -= 1
        self.served = (slot, bool(self.uses_left[slot] == 0))
        positions = np.arange(slot * self.share, (slot + 1) * self.share, dtype=np.int64)
        return positions, np.full(n, 1.0 / len(servable))

    def update(self, positions: np.ndarray, values: np.ndarray) -> None:
        pass  # every batch is served K times whatever the learner found

    def state_dict(self) -> dict:
        return {"uses_left": self.uses_left.copy(), "written": self.written.copy(), "filling": self.filling,
                "filled_slots": self.filled_slots, "evicted_unused": self.evicted_unused}

    def load_state_dict(self, state: dict) -> None:
        uses_left, written = np.asarray(state["uses_left"]), np.asarray(state["written"])
        if uses_left.shape != (self.num_batches,) or written.shape != (self.num_batches,):
            raise ValueError(f"the saved circular buffer holds {uses_left.shape[0]} batches, this one "
                             f"{self.num_batches}: resume with the same capacity")
        self.uses_left[:] = np.clip(uses_left, 0, self.iterations)
        self.written[:] = np.clip(written, 0, self.share - 1)
        self.filling = int(state["filling"]) % self.num_batches
        self.filled_slots = min(int(state["filled_slots"]), self.num_batches)
        self.evicted_unused = int(state["evicted_unused"])
