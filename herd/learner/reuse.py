"""Sample reuse inside one learner update (PPO's epochs and minibatches, on the V-trace
path): a stored batch [T+1, B] is trained for `passes` passes, each a fresh shuffle of its
B trajectories cut into `minibatches` minibatches of B / minibatches columns, one gradient
step each. herd/learner/learner.py runs the steps; a StoredBatchLoss (herd/losses/appo.py)
computes what every minibatch trains against once per stored batch.

The shuffle is drawn on the learner's device (torch.rand(...).argsort(): a CUDA graph
replays it with fresh random numbers), so the whole multi-pass update makes no host read
and can be captured as one graph."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch
from torch import Tensor


class StoredBatchLoss(Protocol):
    def begin_batch(self) -> None:
        """On the host before a stored batch's update (never inside a captured graph)."""

    def prepare(self, batch: dict[str, Tensor]) -> dict[str, Tensor]:
        """The stored batch with what its minibatches train against ([T, B] fields)."""

    def __call__(self, minibatch: dict[str, Tensor], out) -> tuple[Tensor, dict[str, Tensor]]:
        """One minibatch step's loss and metrics."""

    def end_batch(self) -> None:
        """On the host after a stored batch's update."""


@dataclass(frozen=True)
class Reuse:
    passes: int          # K: passes over each stored batch
    minibatches: int     # M: minibatches per pass (each B / M trajectories)

    @property
    def steps(self) -> int:
        """Gradient steps per stored batch."""
        return self.passes * self.minibatches

    def minibatch_size(self, batch_size: int) -> int:
        if batch_size % self.minibatches:
            raise ValueError(f"a batch of {batch_size} trajectories does not split into {self.minibatches} "
                             "equal minibatches")
        return batch_size // self.minibatches

    def column_orders(self, batch_size: int, device: torch.device) -> list[Tensor]:
        """For each pass, a permutation of the batch's columns [B] (int64, on device)."""
        return [torch.rand(batch_size, device=device).argsort() for _ in range(self.passes)]


def take_columns(batch: dict[str, Tensor], columns: Tensor) -> dict[str, Tensor]:
    """The minibatch of `columns` [b] of a stored batch: every field is time-major
    ([T(+1), B, ...], taken along dim 1) but "replayed", which is [B]."""
    return {name: tensor.index_select(0 if tensor.dim() == 1 else 1, columns) for name, tensor in batch.items()}
