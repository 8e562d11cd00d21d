"""Categorical-distribution helpers on raw logits.

Everything goes through log_softmax rather than softmax-then-log: log_softmax subtracts
the max logit internally, so very confident policies (logits of +-50) give finite
log-probabilities instead of log(0) = -inf and NaN gradients.

Shapes: logits are [..., A] (usually [T, B, A]); results drop the action axis ([T, B]).
"""
from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor


def action_log_probs(logits: Tensor, actions: Tensor) -> Tensor:
    """log pi(a | x) for the taken actions.  logits [..., A], actions [...] int64 -> [...]."""
    log_probs = F.log_softmax(logits, dim=-1)
    return log_probs.gather(-1, actions.long().unsqueeze(-1)).squeeze(-1)


def entropy(logits: Tensor) -> Tensor:
    """H(pi) = -sum_a pi(a) log pi(a).  logits [..., A] -> [...]."""
    log_probs = F.log_softmax(logits, dim=-1)
    # exp(log_probs) instead of softmax(): one log_softmax is shared by both factors.
    return -(log_probs.exp() * log_probs).sum(-1)


def kl_divergence(p_logits: Tensor, q_logits: Tensor) -> Tensor:
    """KL(p || q) = sum_a p(a) (log p(a) - log q(a)).  [..., A] x [..., A] -> [...].

    Note the argument order: the first distribution is the one expectations are taken
    under.  LASER's relevance test is KL(target || behaviour); CLEAR's policy cloning is
    KL(behaviour || target)."""
    p_log = F.log_softmax(p_logits, dim=-1)
    q_log = F.log_softmax(q_logits, dim=-1)
    return (p_log.exp() * (p_log - q_log)).sum(-1)
