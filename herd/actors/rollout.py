"""Assembles an actor's trajectories in its shared-memory slots, one column per environment.

A slot holds one trajectory of T steps for each of the actor's E environments
(`[T+1, E, ...]`, see herd/trajectory.py). Every environment fills its own column at its
own pace, so asynchronous env backends, which return a different subset of environments
in each batch, need no lock-step: environment e's k-th trajectory goes into the k-th slot
the actor opened. A slot is delivered once all E columns are complete; in synchronous
mode exactly one slot is open at a time, in asynchronous mode an environment that runs
ahead opens the next one early.

An asynchronous backend may hand out an environment's first observation in any batch,
not only in start()'s: a row of an environment the writer has not seen yet is a first
observation, with no outcome to record.

Per environment and step t the writer stores obs[t] when the observation arrives,
action and the algorithm's step fields[t] (IMPALA: logits, value, features) when the policy has acted, and reward / done /
trunc_value[t] when the outcome arrives; obs[T] of one trajectory is obs[0] of the next.
Where an inference server records the steps itself (`recorded`, herd/inference/records.py),
the writer skips those fields (all but the bootstrap obs[T]) and tells the server, per row,
where they go (`places`).
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from herd.interfaces import EnvBatch, PolicyStep


class ActorStopped(Exception):
    """No slot will come: the actor is asked to stop."""


@dataclass
class OpenSlot:
    index: int
    views: dict                     # field -> numpy view [time, E, ...] of shared memory
    complete: int = 0               # columns (environments) whose trajectory is finished
    version: int = 2**62            # the oldest policy version that acted in it


@dataclass
class Delivery:
    """A completed slot, with what the learner needs to know about it."""
    slot: int
    version: int                    # oldest acting policy version
    steps: int                      # environment steps it holds (T * E)
    episodes: list = field(default_factory=list)   # (score, length) of games that ended


class RolloutWriter:
    def __init__(self, views_of: Callable[[int], dict], acquire: Callable[[], int], unroll_length: int,
                 num_envs: int, recorded: tuple = ()):
        """views_of(slot) -> the slot's numpy views; acquire() -> a free slot index of this
        actor (blocking; raises ActorStopped when the actor must stop); recorded: the
        fields the inference server records (obs: steps 0..T-1)."""
        self.recorded = frozenset(recorded)
        self.views_of, self.acquire = views_of, acquire
        self.T, self.E = unroll_length, num_envs
        self.step = np.zeros(num_envs, dtype=np.int64)   # per env: t of the step awaiting its outcome
        self.traj = np.zeros(num_envs, dtype=np.int64)   # per env: index k of its current trajectory
        self.seen = np.zeros(num_envs, dtype=np.bool_)   # per env: its first observation arrived
        self.open: deque[OpenSlot] = deque()
        self.base = 0                                     # trajectory index held by open[0]
        self.episodes: list = []                          # finished games not yet reported
        # Every batch so far held all E environments in order 0..E-1 (a synchronous
        # backend): they share one slot and step, and each write is one slice per field.
        # The first batch that does not ends it for good.
        self.lockstep = True
        self.all_envs = np.arange(num_envs)

    # -- slots ---------------------------------------------------------------------------
    def slot_for(self, env: int) -> OpenSlot:
        offset = int(self.traj[env]) - self.base
        while offset >= len(self.open):
            index = self.acquire()
            self.open.append(OpenSlot(index, self.views_of(index)))
        return self.open[offset]

    def opens_slot(self, env_ids: np.ndarray) -> bool:
        """Whether observe() of these environments would open a slot (acquire one) beyond
        those open now."""
        return bool(np.any(self.traj[env_ids] - self.base >= len(self.open)))

    def groups(self, env_ids: np.ndarray, rows: np.ndarray | None = None):
        """Rows (of the batch; all of them by default) that share a slot and a step:
        (rows, envs, slot, t, count). One group in sync mode, where rows and envs are the
        slice of all E (a copy per field instead of an indexed scatter)."""
        if self.lockstep:
            whole = len(env_ids) == self.E and (rows is None or len(rows) == self.E)
            if whole and np.array_equal(env_ids, self.all_envs):
                everything = slice(None)
                yield everything, everything, self.slot_for(0), int(self.step[0]), self.E
                return
            self.lockstep = False
        rows = np.arange(len(env_ids)) if rows is None else rows
        keys = (self.traj[env_ids[rows]] - self.base) * (self.T + 1) + self.step[env_ids[rows]]
        for key in np.unique(keys):
            group = rows[keys == key]
            envs = env_ids[group]
            yield group, envs, self.slot_for(int(envs[0])), int(self.step[envs[0]]), len(envs)

    # -- the three writes ----------------------------------------------------------------
    def observe(self, batch: EnvBatch) -> None:
        """obs[t] of the batch's environments (after start(), or after record_outcome);
        where the server records them, only the slots are opened."""
        for rows, envs, slot, t, _ in self.groups(batch.env_ids):
            if "obs" not in self.recorded:
                slot.views["obs"][t, envs] = batch.obs[rows]
        self.seen[batch.env_ids] = True

    def places(self, env_ids: np.ndarray) -> np.ndarray:
        """Where the server records these environments' current step (after observe()):
        [n, 2] int64, each row's obs place and step place (herd/inference/records.py)."""
        T, E = self.T, self.E
        places = np.empty((len(env_ids), 2), dtype=np.int64)
        for rows, envs, slot, t, _ in self.groups(np.asarray(env_ids)):
            columns = self.all_envs[envs]
            places[rows, 0] = (slot.index * (T + 1) + t) * E + columns
            places[rows, 1] = (slot.index * T + t) * E + columns
        return places

    def record_action(self, env_ids: np.ndarray, out: PolicyStep) -> None:
        for rows, envs, slot, t, _ in self.groups(env_ids):
            views = slot.views
            if "action" not in self.recorded:
                views["action"][t, envs] = out.actions[rows]
            for name, values in out.fields.items():
                if name in self.recorded:
                    continue
                if t < len(views[name]):          # a start_only field (LSTM state) holds step 0 only
                    views[name][t, envs] = values[rows]
            slot.version = min(slot.version, out.version)

    def record_outcome(self, batch: EnvBatch, truncated_values: dict) -> list[Delivery]:
        """The outcome of the last step of the batch's environments. truncated_values: row
        -> the policy's value of that row's final observation (episodes cut by a time
        limit). Returns the slots completed now. The batch's observations (the next step's,
        or obs[0] of the next slot) are written by observe(batch) afterwards: the caller
        hands the completed slots on first, because opening the next slot may wait for one
        of them to come back (an actor with a single slot)."""
        stepped = np.flatnonzero(self.seen[batch.env_ids])        # the other rows are first observations
        trunc_value = np.zeros(len(batch.env_ids), np.float32)    # [n]: 0 but where a time limit cut
        for row, value in truncated_values.items():
            trunc_value[row] = value
        for rows, envs, slot, t, count in self.groups(batch.env_ids, stepped):
            views = slot.views
            views["reward"][t, envs] = batch.reward[rows]
            views["done"][t, envs] = batch.done[rows]
            views["trunc_value"][t, envs] = trunc_value[rows]
            if t + 1 == self.T:
                views["obs"][self.T, envs] = batch.obs[rows]   # bootstrap observation
                slot.complete += count
        ids = batch.env_ids[stepped]
        self.step[ids] += 1
        wrapped = ids[self.step[ids] == self.T]
        self.step[wrapped] = 0
        self.traj[wrapped] += 1
        self.episodes.extend(batch.finished)
        return self.deliver_complete()

    def deliver_complete(self) -> list[Delivery]:
        delivered = []
        while self.open and self.open[0].complete == self.E:
            slot = self.open.popleft()
            self.base += 1
            delivered.append(Delivery(slot.index, slot.version, self.T * self.E, self.episodes))
            self.episodes = []
        return delivered


def truncated_values(policy, batch: EnvBatch) -> dict:
    """row -> the policy's value of the final observation of an episode cut by a time limit
    (a truncated episode bootstraps from it): record_outcome's truncated_values."""
    if not batch.truncated_obs:
        return {}
    rows = list(batch.truncated_obs)
    values = policy.value(np.stack([batch.truncated_obs[r] for r in rows]), batch.env_ids[rows])
    return dict(zip(rows, values.tolist()))
