"""Mixes replays into batches: each replay gives its share of every batch.

Pacing: with a queue, a batch is ready when the queue holds its share of fresh
trajectories (each is used once), so training keeps pace with the actors. Without one,
one batch is allowed per `batch_size / replay_ratio` fresh items (replay_ratio: items
sampled per item added, 1 by default), and the ratio holds the other way too: while the
learner is LAG_BATCHES batches or more behind it, `lagging()` says so and the learner
takes no rollout until it has trained (its actors wait). So a slow learner (a slow CPU, a
busy machine) trains as many times per environment step as a fast one, and a run learns
the same per step on any machine. Items are trajectories, or transitions where a replay
samples those (Ape-X: each trajectory adds T)."""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from herd.replay.replay import Replay
from herd.replay.slot_queue import SlotQueue
from herd.store import Gather, TrajectorySlots, read_now

# How far (in batches) a learner without a queue may fall behind its replay ratio before
# its actors wait: enough that the actors rarely stop, few enough that the ratio holds.
LAG_BATCHES = 4


@dataclass
class MixedBatch:
    data: dict | Gather             # field -> [time, B, ...], or a device store's read still to make
    replayed: np.ndarray            # [B] bool: the column came from an off-policy replay
    versions: np.ndarray            # [B] the policy versions that made the columns
    probabilities: np.ndarray       # [B] the chance each column had of being drawn from its replay
    keys: list                      # (replay index, columns slice, ReplayKeys): for update()
    # Where every column comes from a replay that serves stored batches several times (the
    # circular buffer): ((replay index, slot, generation), ...), the same on every pass over
    # the same stored data, so work on it can be kept (IMPACT's target outputs). Else None.
    reuse_key: tuple | None = None
    # False while a batch will be served again: the learner publishes its weights once per
    # batch, after its last pass (IMPACT), not after every pass.
    last_pass: bool = True
    # The observations are a view lent by the queue (ReplayMixer.lends): give_back(keys)
    # once the learner's step has read them.
    lent: bool = False


def concat_columns(parts: list) -> "np.ndarray | torch.Tensor":
    """The replays' shares joined on the batch axis: [time, B, ...]. Host arrays stay numpy;
    if any share is a device tensor (device storage), all go to its device and join there.
    One share is returned as it is: every replay's read is a fresh copy already."""
    if len(parts) == 1:
        return parts[0]
    tensors = [p for p in parts if isinstance(p, torch.Tensor)]
    if not tensors:
        return np.concatenate(parts, axis=1)
    device = tensors[0].device
    return torch.cat([torch.as_tensor(p).to(device, non_blocking=True) for p in parts], dim=1)


def join_parts(parts: list, lent: bool) -> "dict | Gather":
    """The replays' shares as one batch. Shares not read yet (Gather: every trajectory
    replay's) are joined by their positions and read once, straight into the batch; where
    the batch was lent by a device store (the GPU learner's queue), the read is left to
    the learner's step. Shares read already (transition batches, a host queue's lent
    view) are joined as data (field -> [time, B, ...])."""
    if all(isinstance(part, Gather) for part in parts):
        joined = Gather.join(parts)
        return joined if lent else joined.read()
    parts = [read_now(part) for part in parts]
    return {name: concat_columns([part[name] for part in parts]) for name in parts[0]}


class ReplayMixer:
    def __init__(self, replays: list[Replay], shares: list[int], fill_in_factor: float, seed: int,
                 replay_ratio: float | None = None, lends: bool = False):
        """lends: the batches go to a learner in this process that gives each back after
        its step (herd/learner/batches.py): a replay that can lends them (the on-policy
        queue; herd/training.py build_mixer asks it where the queue is the only replay):
        on the host the observations read in place, the one copy being the queue's write;
        on a GPU learner's device the read deferred to the learner (herd/store.py Gather),
        which gathers straight into its step's inputs. The others read copies as ever."""
        self.replays = replays
        self.shares = shares
        self.batch_size = sum(shares)
        # A replay must hold its share and the fill-in fraction of its capacity to train.
        self.fill_targets = [
            share if r.on_policy else max(share, math.ceil(fill_in_factor * r.item_capacity))
            for r, share in zip(replays, shares)
        ]
        self.has_queue = any(r.on_policy for r in replays)
        self.items_per_add = max(r.items_per_trajectory for r in replays)
        self.batch_cost = self.batch_size if replay_ratio is None else max(1, round(self.batch_size / replay_ratio))
        self.credit = 0  # fresh items not yet paid for by a batch (no-queue pacing)
        self.rng = np.random.default_rng(seed)
        self.lends = lends

    def add(self, trajectory: dict[str, np.ndarray], version: int) -> None:
        for replay in self.replays:
            replay.add(trajectory, version)
        self.credit += self.items_per_add

    def add_rollout(self, rollout: dict[str, np.ndarray], version: int) -> None:
        """A rollout's n trajectories, field -> [time, n, ...] (Replay.add_rollout)."""
        for replay in self.replays:
            replay.add_rollout(rollout, version)
        self.credit += self.items_per_add * rollout["action"].shape[1]

    def read_slots(self, slots: TrajectorySlots) -> bool:
        """A lending mixer whose only replay is the queue reads fresh rollouts where the
        actors wrote them, in `slots` (herd/replay/slot_queue.py), if those can always make
        a batch; True if it does from now on (keep() then takes rollouts in place)."""
        queue = self.replays[0]
        if not (self.lends and len(self.replays) == 1 and isinstance(queue, SlotQueue) and queue.storage.on_host
                and SlotQueue.fits(self.batch_size, slots.capacity, slots.envs_per_slot)):
            return False
        queue.read_slots(slots)
        return True

    def keep(self, start: int, n: int, version: int, on_free, overwrite: bool = True) -> bool:
        """A rollout in the slots' positions start .. start + n - 1, taken where it is (True:
        on_free() once it is trained on or dropped), or not (False: add_rollout copies it).
        overwrite: SlotQueue.keep's."""
        queue = self.replays[0]
        if not (isinstance(queue, SlotQueue) and queue.keep(start, n, version, on_free, overwrite)):
            return False
        self.credit += n
        return True

    def slots_full(self) -> bool:
        """The queue reads the actors' slots and holds its capacity: take no rollout now."""
        queue = self.replays[0]
        return isinstance(queue, SlotQueue) and queue.full()

    def warmed_up(self) -> bool:
        """Every off-policy replay holds its fill-in share."""
        return all(r.available() >= target for r, target in zip(self.replays, self.fill_targets) if not r.on_policy)

    def can_add(self, n: int) -> bool:
        """Adding n trajectories now loses no unused fresh one. During warm-up the queue may
        overwrite its oldest: training has not started, and the replays keep filling."""
        return not self.warmed_up() or all(r.room() >= n for r in self.replays if r.on_policy)

    def lagging(self) -> bool:
        """No queue, the replays are warmed up, and the learner is LAG_BATCHES batches or
        more behind the ratio: take no rollout until it has trained. (The warm-up's items
        count too: right after it the actors wait while the learner trains on them.)"""
        return not self.has_queue and self.credit >= LAG_BATCHES * self.batch_cost and self.warmed_up()

    def ready(self) -> bool:
        if not all(r.available() >= target for r, target in zip(self.replays, self.fill_targets)):
            return False
        return self.has_queue or self.credit >= self.batch_cost

    def sample(self) -> MixedBatch:
        parts, replayed, versions, probabilities, keys, passes = [], [], [], [], [], []
        column, lent = 0, False
        for index, (replay, share) in enumerate(zip(self.replays, self.shares)):
            if share == 0:
                continue
            if self.lends:
                data, version, replay_keys, chance, replay_lent = replay.lend(share, self.rng)
                lent = lent or replay_lent
            else:
                data, version, replay_keys, chance = replay.draw(share, self.rng)
            parts.append(data)
            replayed.append(np.full(share, not replay.on_policy))
            versions.append(version)
            probabilities.append(chance)
            keys.append((index, slice(column, column + share), replay_keys))
            served = replay.batch_pass(replay_keys)
            if served is not None:
                passes.append((index, served))
            column += share
        if not self.has_queue:
            self.credit -= self.batch_cost
        batch = join_parts(parts, lent)
        reusable = len(passes) == len(keys)       # no fresh or re-drawn column in this batch
        reuse_key = tuple((index, p.slot, p.generation) for index, p in passes) if reusable else None
        return MixedBatch(batch, np.concatenate(replayed), np.concatenate(versions), np.concatenate(probabilities),
                          keys, reuse_key=reuse_key, last_pass=all(p.last for _, p in passes), lent=lent)

    def give_back(self, mixed: MixedBatch) -> None:
        """The learner's step has read a batch whose observations were lent: their
        positions may be written again."""
        if mixed.lent:
            for index, _, replay_keys in mixed.keys:
                self.replays[index].give_back(replay_keys)

    def update(self, keys: list, values: np.ndarray) -> int:
        """values [B] for the columns of a batch that sample() returned with `keys`; items
        overwritten since are skipped (see Replay.update). Returns how many were applied.
        A tensor stays a tensor (sliced where it is): a device replay takes it without a host read."""
        values = values if isinstance(values, torch.Tensor) else np.asarray(values)
        applied = 0
        for index, columns, replay_keys in keys:
            applied += self.replays[index].update(replay_keys, values[columns])
        return applied

    def nbytes(self) -> int:
        """Memory the replays' stored data hold."""
        return sum(r.storage.nbytes() for r in self.replays)

    @property
    def stale_updates(self) -> int:
        return sum(r.stale_updates for r in self.replays)

    def state_dict(self) -> dict:
        return {"replays": [r.state_dict() for r in self.replays], "credit": self.credit,
                "rng": self.rng.bit_generator.state}

    def load_state_dict(self, state: dict, fresh: bool = True) -> None:
        """fresh=False leaves the on-policy (queue) replays empty: their capacity depends on
        the batch share, which changes when a run resumes with another --learner_count."""
        for replay, replay_state in zip(self.replays, state["replays"]):
            if fresh or not replay.on_policy:
                replay.load_state_dict(replay_state)
        self.credit = int(state["credit"])
        self.rng.bit_generator.state = state["rng"]
