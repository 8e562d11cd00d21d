"""A replay is storage + sampler (Dopamine's composition); the on-policy queue is one too.

Keys. `sample` hands out a key per trajectory: its position and the position's
generation (how many trajectories were written there). Batches are prepared ahead in
other threads, so by the time the learner answers with new values for a batch
(`update`, the priorities of prioritized replay) some of its positions may hold newer
trajectories: an update whose generation no longer matches is dropped and counted in
`stale_updates`, never applied to the newcomer."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from herd.replay.elite import EliteSampler, model_scorers
from herd.store import Gather, TrajectoryStore, read_now
from herd.trajectory import env_columns


@dataclass(frozen=True)
class BatchPass:
    """One serving of a stored batch by a replay that serves whole batches several times."""
    slot: int                        # where the batch is stored
    generation: int                  # writes to the slot's first position: tells its batches apart
    last: bool                       # its last pass: the buffer will not serve it again


@dataclass(frozen=True)
class ReplayKeys:
    positions: np.ndarray            # [n] int64
    generations: np.ndarray          # [n] int64: writes to each position when it was sampled


def kept(values, current: np.ndarray):
    """values [n] (numpy, or a tensor: indexed where it is, no host read) where current [n] holds."""
    if isinstance(values, torch.Tensor):
        return values[torch.from_numpy(np.flatnonzero(current)).to(values.device)]
    return np.asarray(values)[current]


class Replay:
    def __init__(self, name: str, storage: TrajectoryStore, sampler, on_policy: bool):
        self.name = name
        self.storage = storage
        self.sampler = sampler
        self.on_policy = on_policy  # fresh data: no CLEAR cloning terms on it
        self.generation = np.zeros(storage.capacity, dtype=np.int64)
        self.stale_updates = 0      # updates dropped because their item was overwritten since

    @property
    def items_per_trajectory(self) -> int:
        """Items a stored trajectory makes: 1 here (batches of trajectories); a transition
        replay (herd/replay/transitions.py) samples each of its T steps on its own."""
        return 1

    @property
    def item_capacity(self) -> int:
        return self.storage.capacity * self.items_per_trajectory

    def add(self, trajectory: dict[str, np.ndarray], version: int) -> None:
        position = self.sampler.add()
        self.storage.write(position, trajectory, version)
        self.generation[position] += 1

    def add_rollout(self, rollout: dict[str, np.ndarray], version: int) -> None:
        """A rollout's trajectories, field -> [time, n, ...], added in order. A ring-order
        sampler's n positions are taken first and, where they are one ascending run (all
        but where the ring wraps), written with one copy per field; otherwise each
        trajectory is added on its own (elite's add scores what is stored)."""
        n = rollout["action"].shape[1]
        if self.sampler.ring_order:
            positions = np.array([self.sampler.add() for _ in range(n)], dtype=np.int64)
            start = int(positions[0])
            if np.array_equal(positions, np.arange(start, start + n)):
                self.storage.write_run(start, rollout, version)
                self.generation[positions] += 1
                return
            for e, position in enumerate(positions.tolist()):
                self.storage.write(position, {name: array[:, e] for name, array in rollout.items()}, version)
                self.generation[position] += 1
            return
        for trajectory in env_columns(rollout):
            self.add(trajectory, version)

    def available(self) -> int:
        return self.sampler.available()

    def room(self) -> int:
        """Trajectories that can be added before an unused one is overwritten (the
        sampler's room in this storage: the circular buffer counts whole batches)."""
        return self.sampler.room(self.storage.capacity)

    def sample(self, n: int, rng: np.random.Generator) -> tuple[dict[str, np.ndarray], np.ndarray, ReplayKeys,
                                                              np.ndarray]:
        """n trajectories, field -> [time, n, ...]; the policy versions that made them [n];
        their keys; the probabilities [n] they were drawn with."""
        data, versions, keys, probabilities = self.draw(n, rng)
        return read_now(data), versions, keys, probabilities

    def draw(self, n: int, rng: np.random.Generator) -> tuple["Gather | dict", np.ndarray, ReplayKeys, np.ndarray]:
        """sample() with the read not made yet (a Gather of the drawn positions): the mixer
        joins the shares of a batch and reads them once, into the batch."""
        positions, probabilities = self.sampler.sample(n, rng)
        keys = ReplayKeys(positions, self.generation[positions].copy())
        return self.storage.gather(positions), self.storage.version[positions], keys, probabilities

    def lend(self, n: int, rng: np.random.Generator) -> tuple["dict | Gather", np.ndarray, ReplayKeys, np.ndarray,
                                                             bool]:
        """draw(n, rng) with the observations lent where the sampler and the storage can
        (the on-policy queue in host memory, a batch that is one run of positions): a view
        the learner's step reads in place, its positions kept from new writes until
        give_back(keys). The last element says whether they were lent."""
        if not self.sampler.lends:
            return (*self.draw(n, rng), False)              # a subclass's own draw(): transitions
        positions, probabilities = self.sampler.sample(n, rng)
        keys = ReplayKeys(positions, self.generation[positions].copy())
        data = self.storage.lend(positions)
        lent = data is not None
        if lent:
            self.sampler.lend(positions)
        else:
            data = self.storage.gather(positions)           # read by the mixer, into the batch
        return data, self.storage.version[positions], keys, probabilities, lent

    def give_back(self, keys: ReplayKeys) -> None:
        """The learner has finished with a batch from lend(): its positions may be written."""
        self.sampler.give_back(keys.positions)

    def batch_pass(self, keys: ReplayKeys) -> BatchPass | None:
        """For a sampler that serves whole stored batches several times (the circular
        buffer: its `served` is set), which batch the last sample() gave (its `keys`)
        and which pass it was; None for every other replay."""
        served = self.sampler.served
        if served is None:
            return None
        slot, last = served
        return BatchPass(slot, int(keys.generations[0]), last)

    def update(self, keys: ReplayKeys, values: np.ndarray) -> int:
        """Passes values [n] for sampled items to the sampler, except for items overwritten
        since they were sampled; returns how many were applied."""
        current = self.generation[keys.positions] == keys.generations
        self.stale_updates += int(np.count_nonzero(~current))
        if current.any():
            self.sampler.update(keys.positions[current], kept(values, current))
        return int(np.count_nonzero(current))

    def attach_model(self, model: torch.nn.Module, device, bf16: bool = False) -> None:
        """Gives an elite/attentive replay the learner's model to score trajectories with
        (see herd/replay/elite.py); every other replay ignores it. Call once, before the
        replay fills: the scorers keep a reference, so later weight updates are seen.
        `bf16`: score under bfloat16 autocast, as a bf16 learner computes."""
        if isinstance(self.sampler, EliteSampler):
            off_policy, attentive = model_scorers(self.storage, model, torch.device(device),
                                                  self.sampler.dist_function, self.sampler.p, self.sampler.score_steps,
                                                  bf16=bf16)
            self.sampler.set_scorer(off_policy)
            self.sampler.set_attentive_scorer(attentive)

    def state_dict(self) -> dict:
        return {"storage": self.storage.state_dict(self.sampler.stored()), "sampler": self.sampler.state_dict(),
                "generation": self.generation.copy()}

    def load_state_dict(self, state: dict) -> None:
        self.storage.load_state_dict(state["storage"])
        self.sampler.load_state_dict(state["sampler"])
        if "generation" in state:
            self.generation[:] = state["generation"]
