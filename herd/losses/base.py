"""What the learner (herd/learner/learner.py) and its session (herd/learner/session.py) call
on every algorithm's loss: the loss itself, the hint of which stored batch comes next, and
the state a checkpoint carries. A loss with nothing to keep between updates (IMPALA's) is a
plain function wrapped in FunctionLoss; the losses with a target network subclass Loss."""
from __future__ import annotations

from typing import Callable

from torch import Tensor

# fn(batch: field -> tensor [T(+1), B, ...], model output over [T+1, B]) -> (scalar loss, metrics)
LossFn = Callable[[dict, object], tuple[Tensor, dict[str, Tensor]]]


class Loss:
    """The interface, with the defaults of a loss that keeps no state."""

    def __call__(self, batch: dict[str, Tensor], out) -> tuple[Tensor, dict[str, Tensor]]:
        raise NotImplementedError

    def expect_batch(self, reuse_key: tuple | None) -> None:
        """The next call's batch: a reuse key (herd/replay/mixer.py MixedBatch.reuse_key) of
        stored data served several times, or None for data seen once. Only a loss that keeps
        work per stored batch (IMPACT's target outputs) uses it."""

    def state_dict(self) -> dict | None:
        """What a checkpoint keeps of the loss (a target network, counters); None: nothing."""
        return None

    def load_state_dict(self, state: dict) -> None:
        """Restores what state_dict gave; a loss without state has nothing to restore."""


class FunctionLoss(Loss):
    """A stateless loss function as a Loss."""

    def __init__(self, fn: LossFn):
        self.fn = fn

    def __call__(self, batch: dict[str, Tensor], out) -> tuple[Tensor, dict[str, Tensor]]:
        return self.fn(batch, out)


def as_loss(loss_fn: Loss | LossFn) -> Loss:
    """loss_fn as a Loss: a function (IMPALA's, a test's) is wrapped."""
    return loss_fn if isinstance(loss_fn, Loss) else FunctionLoss(loss_fn)
