"""Action distributions: categorical helpers on raw logits, and (below) the two
distribution objects every policy-side computation goes through (Categorical, DiagGaussian).

Everything goes through log_softmax rather than softmax-then-log: log_softmax subtracts
the max logit internally, so very confident policies (logits of +-50) give finite
log-probabilities instead of log(0) = -inf and NaN gradients.

Shapes: logits are [..., A] (usually [T, B, A]); results drop the action axis ([T, B]).
"""
from __future__ import annotations

import math

import torch
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


# ---------------------------------------------------------------------------------------
# Action distributions: one object per kind of action space, so that V-trace's log-rho,
# the entropy bonus, CLEAR's cloning KL, LASER's mask, elite replay's kl_div and the
# actors' sampling are written once for both. Each works on the policy head's output
# `params` [..., P] (a network's `logits` field): P = A logits for Categorical, P = 2A for
# DiagGaussian (mean and log-std side by side). Results drop the last axis ([T, B]).

LOG_2PI = math.log(2.0 * math.pi)


class Categorical:
    """Discrete actions [...] int64 drawn from softmax(logits): the functions above, as
    they are, so that discrete IMPALA computes the same through this class as without it."""
    name = "categorical"
    param_names = ("logits",)           # trajectory field behaviour_logits [T, A]
    action_dtype = "int64"

    @staticmethod
    def action_shape(num_actions: int) -> tuple:
        return ()

    @staticmethod
    def param_size(num_actions: int) -> int:
        return num_actions

    @staticmethod
    def split(params: Tensor) -> tuple[Tensor, ...]:
        return (params,)

    @staticmethod
    def join(*parts: Tensor) -> Tensor:
        return parts[0]

    @staticmethod
    def log_prob(params: Tensor, actions: Tensor) -> Tensor:
        return action_log_probs(params, actions)

    @staticmethod
    def entropy(params: Tensor) -> Tensor:
        return entropy(params)

    @staticmethod
    def kl(p: Tensor, q: Tensor) -> Tensor:
        return kl_divergence(p, q)

    @staticmethod
    def sample(params: Tensor, generator: torch.Generator | None) -> Tensor:
        """params [n, A] -> actions [n] int64."""
        return torch.multinomial(torch.softmax(params, dim=-1), 1, generator=generator).squeeze(1)

    @staticmethod
    def mode(params: Tensor) -> Tensor:
        return params.argmax(dim=-1)


class DiagGaussian:
    """Continuous actions [..., A] float32 from N(mean, diag(exp(log_std)^2)).

    params [..., 2A] = cat(mean, log_std). The actions are the unbounded samples: the
    environment clips them to its bounds (herd.envs.wrappers.RescaleClipAction), and the
    log-probability is that of the unclipped sample, so log pi - log mu (V-trace), the
    entropy and the KL terms are all exact closed forms of the Gaussian."""
    name = "gaussian"
    param_names = ("mean", "log_std")   # trajectory fields behaviour_mean, behaviour_log_std [T, A]
    action_dtype = "float32"

    @staticmethod
    def action_shape(num_actions: int) -> tuple:
        return (num_actions,)

    @staticmethod
    def param_size(num_actions: int) -> int:
        return 2 * num_actions

    @staticmethod
    def split(params: Tensor) -> tuple[Tensor, Tensor]:
        mean, log_std = params.chunk(2, dim=-1)
        return mean, log_std

    @staticmethod
    def join(*parts: Tensor) -> Tensor:
        return torch.cat(parts, dim=-1)

    @staticmethod
    def log_prob(params: Tensor, actions: Tensor) -> Tensor:
        """sum_i log N(a_i; mu_i, sigma_i).  params [..., 2A], actions [..., A] -> [...]."""
        mean, log_std = DiagGaussian.split(params)
        z = (actions.to(mean.dtype) - mean) * torch.exp(-log_std)
        return (-0.5 * z.pow(2) - log_std - 0.5 * LOG_2PI).sum(-1)

    @staticmethod
    def entropy(params: Tensor) -> Tensor:
        """sum_i (log sigma_i + (1 + log 2 pi) / 2).  [..., 2A] -> [...]."""
        _, log_std = DiagGaussian.split(params)
        return (log_std + 0.5 * (1.0 + LOG_2PI)).sum(-1)

    @staticmethod
    def kl(p: Tensor, q: Tensor) -> Tensor:
        """KL(p || q) = sum_i log(s_q/s_p) + (s_p^2 + (m_p - m_q)^2) / (2 s_q^2) - 1/2."""
        p_mean, p_log_std = DiagGaussian.split(p)
        q_mean, q_log_std = DiagGaussian.split(q)
        ratio = torch.exp(2.0 * (p_log_std - q_log_std))                      # s_p^2 / s_q^2
        gap = (p_mean - q_mean).pow(2) * torch.exp(-2.0 * q_log_std)           # (m_p - m_q)^2 / s_q^2
        return (q_log_std - p_log_std + 0.5 * (ratio + gap - 1.0)).sum(-1)

    @staticmethod
    def sample(params: Tensor, generator: torch.Generator | None) -> Tensor:
        """params [n, 2A] -> actions [n, A] float32."""
        mean, log_std = DiagGaussian.split(params)
        noise = torch.randn(mean.shape, generator=generator, dtype=mean.dtype, device=mean.device)
        return mean + torch.exp(log_std) * noise

    @staticmethod
    def mode(params: Tensor) -> Tensor:
        return DiagGaussian.split(params)[0]


DISTRIBUTIONS = {"categorical": Categorical, "gaussian": DiagGaussian}


def get_distribution(name: str):
    try:
        return DISTRIBUTIONS[name]
    except KeyError:
        raise ValueError(f"unknown action distribution '{name}' (use one of {', '.join(DISTRIBUTIONS)})") from None
