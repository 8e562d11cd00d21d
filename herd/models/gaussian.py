"""The policy head for continuous (Box) actions: a diagonal Gaussian whose mean depends on
the state and whose log standard deviation is one learned parameter per action dimension.

Why state-independent: the exploration noise then changes only as fast as the policy
gradient moves one vector, the same in every state, so it can neither collapse in states
the agent rarely visits nor blow up where the value estimate is poor; V-trace's importance
ratios between an actor's policy and the learner's stay well conditioned for the same
reason. It is the usual choice of on-policy methods on MuJoCo (TRPO, PPO) and costs A
parameters. Actions live in a normalised space where [-1, 1] spans the Box's bounds
(herd.envs.wrappers.RescaleClipAction), so one initial log-std suits every task.
"""
from __future__ import annotations

import torch
from torch import Tensor, nn

# log sigma is kept within [LOG_STD_MIN, LOG_STD_MAX]: below, log-probabilities of the
# behaviour policy's own samples grow without bound (and rho with them); above, nearly
# every sample is clipped at the action bounds.
LOG_STD_MIN, LOG_STD_MAX = -5.0, 2.0


class GaussianPolicyHead(nn.Module):
    """torso [N, H] -> params [N, 2A] = cat(mean, log_std): what herd.ops.distributions.
    DiagGaussian reads, in the network's `logits` field."""

    def __init__(self, torso_size: int, num_actions: int, initial_log_std: float = -1.0):
        super().__init__()
        self.mean = nn.Linear(torso_size, num_actions)
        # Small initial means (the gain of the categorical head's logits): the first
        # actions are centred in the bounds, their spread set by log_std alone.
        nn.init.orthogonal_(self.mean.weight, 0.01)
        nn.init.zeros_(self.mean.bias)
        self.log_std = nn.Parameter(torch.full((num_actions,), float(initial_log_std)))

    def forward(self, torso: Tensor) -> Tensor:
        mean = self.mean(torso)                                                    # [N, A]
        log_std = self.log_std.clamp(LOG_STD_MIN, LOG_STD_MAX).to(mean.dtype).expand_as(mean)
        return torch.cat([mean, log_std], dim=-1)                                  # [N, 2A]
