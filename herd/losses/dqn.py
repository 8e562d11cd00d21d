"""Ape-X's loss: n-step double Q-learning with a target network, Huber loss weighted by
the prioritized replay's importance weights. Its |TD errors| go back to the replay as the
transitions' new priorities (the metric "priorities", see herd/learner/learner.py).

The batch is a transition batch (herd/replay/transitions.py): obs [2, B] (s_t and the
bootstrap observation s_{t+k}), action [1, B], the n-step window [n, B] and weight [1, B];
`out` is the online network over obs, with Q values in its logits field."""
from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import nn

from herd.losses.base import Loss
from herd.ops.returns import double_q_bootstrap, n_step_returns


class ApexLoss(Loss):
    """A loss with state: the target network and how many updates it has seen. The
    training session saves both with every checkpoint (state_dict), so a resumed run
    syncs its target network at the same updates as an uninterrupted one."""

    def __init__(self, model: nn.Module, gamma: float, target_update_period: int, huber_delta: float = 1.0):
        self.model = model
        self.target = copy.deepcopy(model).eval().requires_grad_(False)
        self.gamma = gamma
        self.target_update_period = target_update_period
        self.huber_delta = huber_delta
        self.calls = 0

    def targets(self, batch: dict, out) -> torch.Tensor:
        """The n-step double-Q targets [B] (no gradient)."""
        with torch.no_grad():
            target_next = self.target(batch["obs"][1:]).logits[0].float()          # [B, A]
            bootstrap = double_q_bootstrap(out.logits[1].detach(), target_next)
            returns, discount = n_step_returns(batch["reward"], batch["done"], batch["trunc_value"], batch["valid"],
                                               self.gamma)
            return returns + discount * bootstrap

    def __call__(self, batch: dict, out) -> tuple[torch.Tensor, dict]:
        q_taken = out.logits[0].gather(-1, batch["action"][0].long().unsqueeze(-1)).squeeze(-1)   # [B]
        target = self.targets(batch, out)
        weight = batch["weight"][0].float()
        loss = (weight * F.huber_loss(q_taken, target, reduction="none", delta=self.huber_delta)).mean()
        td = (target - q_taken).detach()
        self.calls += 1
        if self.calls % self.target_update_period == 0:
            # Synced before this update's optimizer step: the target lags by one update at
            # most, which the period (hundreds to thousands of updates) makes immaterial.
            self.target.load_state_dict(self.model.state_dict())
        # Detached tensors, read once per log interval (herd/learner/step_metrics.py).
        metrics = {"loss": loss.detach(), "td_error": td.abs().mean(),
                   "q_mean": q_taken.detach().mean(), "mean_weight": weight.mean(),
                   "priorities": td.abs()}
        return loss, metrics

    def state_dict(self) -> dict:
        return {"target": self.target.state_dict(), "calls": self.calls}

    def load_state_dict(self, state: dict) -> None:
        self.target.load_state_dict(state["target"])
        self.calls = int(state["calls"])
