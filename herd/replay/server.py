"""A replay mixer that other processes write into and sample from at the same time: the
inside of the Ray backend's replay server (herd/backends/ray_replay.py wraps it in a Ray
actor; this module knows nothing of Ray, so it is tested as plain Python).

Three kinds of calls, each kind from its own thread of the server:

    writes    add_rollout(views, version), update(keys, values), state_dict, load_state_dict
    samples   sample(timeout): waits (up to timeout) until the mixer's pacing allows a batch;
              says too whether the learner lags the replay ratio (it then sends no rollout
              until a later answer says it caught up)
    control   stats()

One lock keeps the mixer consistent; a condition wakes a waiting sample() when a write
makes a batch ready. Pacing is the mixer's own (replay_ratio items sampled per item added),
so a learner that asks for batches faster than the actors fill the replay simply waits, as
it does with the replay in its own process.

Every batch carries a sequence number, and state_dict says how many batches were drawn
before it: the learner drops the batches it was still to train on that were drawn before a
checkpoint (at most the few it keeps requested ahead), because the saved sampler has
counted them (pacing credit, beta's progress) and a run resumed from that checkpoint never
sees them either. So a run that goes on after a save and a run resumed from it continue
from the same replay state."""
from __future__ import annotations

import threading
import time

import numpy as np

from herd.replay.mixer import MixedBatch, ReplayMixer


class ReplayService:
    def __init__(self, mixer: ReplayMixer):
        self.mixer = mixer
        self.lock = threading.Lock()
        self.changed = threading.Condition(self.lock)   # notified by every write
        self.drawn = 0                  # batches sampled so far: the next batch's sequence number
        self.rollouts = self.transitions = self.rollout_bytes = 0
        self.batch_bytes = 0
        self.loaded_trajectories = 0    # stored trajectories a checkpoint brought

    def add_rollout(self, views: dict[str, np.ndarray], version: int) -> int:
        """views: field -> [time, E, ...] (read-only is fine: the storage copies). Returns
        the transitions (steps) added."""
        steps = views["action"].shape[0] * views["action"].shape[1]
        with self.changed:
            self.mixer.add_rollout(views, version)
            self.rollouts += 1
            self.transitions += steps
            self.rollout_bytes += sum(array.nbytes for array in views.values())
            self.changed.notify_all()
        return steps

    def sample(self, timeout: float) -> tuple[int, MixedBatch | None, bool]:
        """(sequence number, batch, lagging) as soon as the pacing allows a batch, or
        (-1, None, lagging) after `timeout` seconds without (the caller asks again).
        lagging: the learner is behind the replay ratio after this draw (mixer.lagging())."""
        deadline = time.monotonic() + timeout
        with self.changed:
            while not self.mixer.ready():
                left = deadline - time.monotonic()
                if left <= 0:
                    return -1, None, self.mixer.lagging()
                self.changed.wait(left)
            mixed = self.mixer.sample()
            sequence = self.drawn
            self.drawn += 1
            lagging = self.mixer.lagging()
        self.batch_bytes += sum(array.nbytes for array in mixed.data.values())
        return sequence, mixed, lagging

    def update(self, keys: list, values: np.ndarray) -> int:
        """The learner's new priorities [B] for a batch's keys; stale keys are dropped (see
        herd/replay/replay.py). Returns how many were applied."""
        with self.changed:
            applied = self.mixer.update(keys, values)
            self.changed.notify_all()
        return applied

    def state_dict(self) -> tuple[dict, int]:
        """(the mixer's state, the batches drawn before it)."""
        with self.changed:
            return self.mixer.state_dict(), self.drawn

    def load_state_dict(self, state: dict, fresh: bool = True) -> None:
        with self.changed:
            self.mixer.load_state_dict(state, fresh)
            self.loaded_trajectories = sum(len(r["storage"]["version"]) for r in state["replays"])
            self.changed.notify_all()

    def stats(self) -> dict:
        """Counters for the learner's summary and monitor, read without the lock (figures,
        not a state: a write may be half counted)."""
        return {"rollouts": self.rollouts, "transitions": self.transitions, "rollout_bytes": self.rollout_bytes,
                "batches": self.drawn, "batch_bytes": self.batch_bytes, "stale_priority_updates":
                self.mixer.stale_updates, "loaded_trajectories": self.loaded_trajectories,
                "nbytes": self.mixer.nbytes()}
