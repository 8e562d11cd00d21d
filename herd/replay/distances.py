"""Distances between feature vectors, for elite and attentive replay.

Every function takes `current` and `stored`, both [T, C, F] (T steps, C candidate
trajectories, F features), and returns [C]: the per-step distance over the feature axis,
averaged over the T steps. Averaging (not summing) keeps distances comparable across
unroll lengths. All are pure torch and run on whatever device the inputs are on.

A smaller distance always means "closer": elite sampling prefers the smallest, elite
insertion evicts the largest.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

DISTANCES = ("ln_norm", "cos_dist", "kl_div")


def _check(current: Tensor, stored: Tensor) -> None:
    if current.dim() != 3 or current.shape != stored.shape:
        raise ValueError(f"distances take two [T, C, F] tensors of one shape, got {tuple(current.shape)} "
                         f"and {tuple(stored.shape)}")


def ln_norm(current: Tensor, stored: Tensor, p: float = 2) -> Tensor:
    """The p-norm of the per-step difference, mean over steps: [T, C, F] x2 -> [C]."""
    _check(current, stored)
    diff = current.float() - stored.float()
    return torch.linalg.vector_norm(diff, ord=p, dim=-1).mean(dim=0)


def cos_dist(current: Tensor, stored: Tensor) -> Tensor:
    """1 - cosine similarity, mean over steps: 0 for one direction, 2 for opposite ones.
    A zero vector has similarity 0 with anything (torch's eps guard), i.e. distance 1."""
    _check(current, stored)
    return (1.0 - F.cosine_similarity(current.float(), stored.float(), dim=-1, eps=1e-8)).mean(dim=0)


def kl_div(current: Tensor, stored: Tensor) -> Tensor:
    """KL(softmax(stored) || softmax(current)) over the feature axis, mean over steps.

    Features are unnormalised, so softmax turns each step's vector into a distribution.
    The stored (behaviour) side is the reference distribution P and the current model
    the approximation Q, the usual direction for "how far has the policy drifted from the
    data": it weighs the features the behaviour policy emphasised. log_softmax keeps it
    finite for any real inputs; the clamp removes tiny negative rounding."""
    _check(current, stored)
    log_p = F.log_softmax(stored.float(), dim=-1)
    log_q = F.log_softmax(current.float(), dim=-1)
    per_step = (log_p.exp() * (log_p - log_q)).sum(dim=-1).clamp_min(0.0)
    return per_step.mean(dim=0)


def distance(name: str, current: Tensor, stored: Tensor, p: float = 2) -> Tensor:
    """Dispatch by the `dist_function` key of a custom replay: [T, C, F] x2 -> [C]."""
    if name == "ln_norm":
        return ln_norm(current, stored, p)
    if name == "cos_dist":
        return cos_dist(current, stored)
    if name == "kl_div":
        return kl_div(current, stored)
    raise ValueError(f"unknown dist_function '{name}' (use one of {', '.join(DISTANCES)})")
