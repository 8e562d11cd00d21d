"""Ape-X's replay: prioritized transitions read out of whole stored trajectories.

Storage stays per trajectory (TrajectoryStore: each trajectory's T+1 observations are
stored once, LZ4-packed per step with --use_replay_compression), and each of its T steps is
one item of the PrioritizedSampler (leaf = position * T + t). A sampled leaf (position, t)
becomes one column of an n-step transition batch, read straight from the storage:

    obs          [2, B, ...]  obs[t] and the bootstrap observation obs[min(t + n, T)]
    action       [1, B]       action[t]
    reward       [n, B]       reward[t + i]            (i = 0..n-1; 0 past the trajectory)
    done         [n, B]       done[t + i]              (False past the trajectory)
    trunc_value  [n, B]       trunc_value[t + i]       (the actor's value of a truncated
                                                       episode's final observation)
    valid        [n, B]       t + i < T: the window is cut at the trajectory's end, where
                              obs[T] bootstraps after T - t steps instead of n
    weight       [1, B]       importance weight, normalised by the batch's largest

so a transition never needs a neighbouring trajectory, and its observation frames are
never copied per transition. herd/ops/returns.py turns the window into the n-step return.
An episode end inside the window stops it there (done); the learner then bootstraps from
trunc_value alone (0 for a terminal state).

One gather for a store on the host or a device (transition_batch, torch indexing): on a
GPU learner the store is on its device, and the batch and the sampler's priorities live on its
device; on a CPU learner the host storage's arrays are indexed as tensors. The sampled
leaves come back to the host once per batch ([n] int64, with their probabilities): the
keys, generations and policy versions are numpy."""
from __future__ import annotations

import numpy as np
import torch

from herd.replay.prioritized import PrioritizedSampler
from herd.replay.replay import Replay, ReplayKeys, kept
from herd.store import TrajectoryStore

WINDOW_FIELDS = ("reward", "done", "trunc_value")


def transition_batch(storage: TrajectoryStore, positions: np.ndarray, steps: np.ndarray,
                     n_step: int) -> dict[str, torch.Tensor]:
    """The n-step transitions starting at step steps[b] of stored trajectory positions[b]
    (host [B] int64): tensors on the storage's device, gathered by torch indexing from its
    [time, capacity, ...] columns (a host storage's numpy arrays seen as tensors, no copy;
    its observations LZ4-unpacked per step where compressed)."""
    T = storage.unroll_length
    columns = torch.from_numpy(np.asarray(positions, dtype=np.int64)).to(storage.device, non_blocking=True)  # [B]
    starts = torch.from_numpy(np.asarray(steps, dtype=np.int64)).to(storage.device, non_blocking=True)      # [B]
    window = starts[None, :] + torch.arange(n_step, device=storage.device)[:, None]   # [n, B]
    valid = window < T
    rows = window.clamp(max=T - 1)
    batch = {"action": storage.column("action")[starts, columns][None], "valid": valid}
    for name in WINDOW_FIELDS:
        values = storage.column(name)[rows, columns.expand_as(rows)]                  # [n, B]
        batch[name] = torch.where(valid, values, torch.zeros((), dtype=values.dtype, device=values.device))
    bootstrap = (starts + n_step).clamp(max=T)
    batch["obs"] = torch.stack([storage.obs_at(columns, starts), storage.obs_at(columns, bootstrap)])  # [2, B, ...]
    return batch


class TransitionReplay(Replay):
    def __init__(self, name: str, storage: TrajectoryStore,
                 sampler: PrioritizedSampler, n_step: int):
        if sampler.steps != storage.unroll_length:
            raise ValueError(f"the sampler has {sampler.steps} leaves per trajectory, the storage "
                             f"{storage.unroll_length} steps")
        super().__init__(name, storage, sampler, on_policy=False)
        self.n_step = n_step

    @property
    def items_per_trajectory(self) -> int:
        return self.storage.unroll_length

    def add(self, trajectory: dict[str, np.ndarray], version: int) -> None:
        # The actors' initial priorities (Ape-X); a layout without them gets the max rule.
        position = self.sampler.add(trajectory.get("priority"))
        self.storage.write(position, trajectory, version)
        self.generation[position] += 1

    def draw(self, n: int, rng: np.random.Generator):
        """n transitions (see the module doc), read now (a transition batch is its own
        gather); their policy versions [n], keys (leaf + generation of its trajectory) and
        probabilities [n]."""
        leaves, probabilities = self.sampler.sample(n, rng)
        positions, steps = np.divmod(leaves, self.storage.unroll_length)
        keys = ReplayKeys(leaves, self.generation[positions].copy())
        weight = self.sampler.importance_weights(probabilities).astype(np.float32)[None]      # [1, n]
        batch = transition_batch(self.storage, positions, steps, self.n_step)
        batch["weight"] = torch.from_numpy(weight).to(self.storage.device, non_blocking=True)
        return batch, self.storage.version[positions], keys, probabilities

    def update(self, keys: ReplayKeys, values) -> int:
        """As Replay.update, with the generation of each leaf's trajectory. values [n]: numpy,
        or a device tensor that the device sampler takes without reading it back."""
        current = self.generation[keys.positions // self.storage.unroll_length] == keys.generations
        self.stale_updates += int(np.count_nonzero(~current))
        if current.any():
            self.sampler.update(keys.positions[current], kept(values, current))
        return int(np.count_nonzero(current))
