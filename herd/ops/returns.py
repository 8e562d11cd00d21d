"""n-step returns and the double-Q bootstrap of Ape-X (pure tensor math, no config).

An n-step window starting at step t holds, for i = 0..n-1: the reward r[t+i], whether the
episode ended after that step (done, terminated or truncated), the value of a truncated
episode's final observation (trunc_value, 0 where the episode did not end or terminated),
and whether step t+i exists at all (valid: windows are cut at the end of a stored
trajectory). With k the steps used,

    G = sum_{i<k} gamma^i r[t+i]  (+ gamma^k trunc_value[t+k-1] if the episode ended at step t+k-1)
    target = G + bootstrap_discount * Q(s[t+k])

where the window stops at the first episode end (bootstrap_discount = 0: a terminal state
is worth 0, a truncated one trunc_value, already in G) or after its last valid step
(bootstrap_discount = gamma^k)."""
from __future__ import annotations

import torch
from torch import Tensor


def n_step_returns(rewards: Tensor, dones: Tensor, trunc_values: Tensor, valid: Tensor,
                   gamma: float) -> tuple[Tensor, Tensor]:
    """Windows [n, B] (time first) -> (G [B], bootstrap_discount [B]). `valid` must be a
    prefix mask per column (True then False), as windows cut at a trajectory's end are."""
    rewards = rewards.float()
    returns = torch.zeros_like(rewards[0])
    discount = torch.ones_like(rewards[0])
    running = torch.ones_like(valid[0], dtype=torch.bool)     # the window has not stopped yet
    ended = torch.zeros_like(running)                         # it stopped at an episode end
    for i in range(rewards.shape[0]):                         # n is small (3): a loop over time only
        use = running & valid[i]
        returns = returns + torch.where(use, discount * rewards[i], 0.0)
        end = use & dones[i]
        returns = returns + torch.where(end, discount * gamma * trunc_values[i].float(), 0.0)
        discount = torch.where(use, discount * gamma, discount)
        ended = ended | end
        running = use & ~dones[i]
    return returns, torch.where(ended, 0.0, discount)


def double_q_bootstrap(online_next: Tensor, target_next: Tensor) -> Tensor:
    """Van Hasselt et al. 2016: the online network picks the action, the target network
    values it. [B, A], [B, A] -> [B]."""
    best = online_next.argmax(dim=-1, keepdim=True)
    return target_next.gather(-1, best).squeeze(-1)


def trajectory_windows(values: Tensor, n: int, fill: float | bool = 0) -> tuple[Tensor, Tensor]:
    """values [T, ...] -> (windows [n, T, ...] with windows[i, t] = values[t+i], valid [n, T]);
    steps past T are `fill` and invalid. The actor's view of every window of its trajectory."""
    T = values.shape[0]
    index = torch.arange(T)[None, :] + torch.arange(n)[:, None]          # [n, T]
    valid = index < T
    gathered = values[index.clamp(max=T - 1)]
    shape = valid.shape + (1,) * (values.dim() - 1)
    return torch.where(valid.view(shape), gathered, torch.tensor(fill, dtype=values.dtype)), valid


def trajectory_priorities(q_taken: Tensor, q_max: Tensor, bootstrap_q: Tensor, rewards: Tensor, dones: Tensor,
                          trunc_values: Tensor, gamma: float, n: int) -> Tensor:
    """Ape-X's initial priorities |n-step target - Q(s_t, a_t)| of every step of a
    trajectory [T, E], from the acting network's own estimates: q_taken [T, E] = Q(s_t, a_t),
    q_max [T, E] = max_a Q(s_t, a), bootstrap_q [E] = max_a Q(obs[T]). The tail's windows
    end at obs[T] after T - t steps."""
    T, E = q_taken.shape
    windows = [trajectory_windows(x, n)[0].reshape(n, T * E) for x in (rewards, dones, trunc_values)]
    valid = trajectory_windows(q_taken, n)[1][:, :, None].expand(n, T, E).reshape(n, T * E)
    returns, discount = n_step_returns(*windows, valid, gamma)
    next_values = torch.cat([q_max, bootstrap_q[None]])                  # [T+1, E]: Q of obs[0..T]
    bootstrap = next_values[torch.clamp(torch.arange(T) + n, max=T)].reshape(T * E)
    return (returns + discount * bootstrap - q_taken.reshape(T * E)).abs().view(T, E)
