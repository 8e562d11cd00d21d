"""n-step returns, the double-Q bootstrap and the actors' initial priorities against
hand-computed cases and slow transcriptions of the formulas."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from herd.ops.returns import double_q_bootstrap, n_step_returns, trajectory_priorities, trajectory_windows

GAMMA = 0.9


def column(*steps):
    """steps: (reward, done, trunc_value, valid) per window step -> four tensors [n]."""
    r, d, v, ok = zip(*steps)
    return torch.tensor(r), torch.tensor(d), torch.tensor(v), torch.tensor(ok)


def test_n_step_returns_by_hand():
    cases = [  # (window, expected G, expected bootstrap discount)
        (column((1, False, 0, True), (2, False, 0, True), (3, False, 0, True)), 1 + 0.9 * 2 + 0.81 * 3, 0.729),
        # terminated after the second step: no bootstrap, the third reward is another episode's
        (column((1, False, 0, True), (2, True, 0, True), (3, False, 0, True)), 1 + 0.9 * 2, 0.0),
        # truncated after the first step, the actor valued the final observation at 10
        (column((1, True, 10, True), (2, False, 0, True), (3, False, 0, True)), 1 + 0.9 * 10, 0.0),
        # the trajectory ends after two steps: obs[T] bootstraps with gamma^2
        (column((1, False, 0, True), (2, False, 0, True), (0, False, 0, False)), 1 + 0.9 * 2, 0.81),
        # the window's last step ends the episode (terminal) and the tail is cut at once
        (column((0.5, True, 0, True), (0, False, 0, False), (0, False, 0, False)), 0.5, 0.0),
        # truncated on the window's last step: gamma^3 * trunc_value
        (column((1, False, 0, True), (1, False, 0, True), (1, True, 4, True)), 1 + 0.9 + 0.81 + 0.729 * 4, 0.0),
    ]
    stacked = [torch.stack([case[0][k] for case in cases], dim=1) for k in range(4)]
    returns, discount = n_step_returns(*stacked, GAMMA)
    assert returns.tolist() == pytest.approx([case[1] for case in cases])
    assert discount.tolist() == pytest.approx([case[2] for case in cases])


def test_double_q_bootstrap_against_a_slow_transcription():
    rng = torch.Generator().manual_seed(0)
    online, target = torch.randn(32, 5, generator=rng), torch.randn(32, 5, generator=rng)
    slow = []
    for b in range(32):
        best = max(range(5), key=lambda a: online[b, a].item())     # argmax_a Q_online(s', a)
        slow.append(target[b, best].item())                         # valued by the target network
    assert double_q_bootstrap(online, target).tolist() == pytest.approx(slow)
    assert not torch.equal(double_q_bootstrap(online, target), target.max(-1).values)   # not plain max


def test_trajectory_windows_shift_and_cut():
    windows, valid = trajectory_windows(torch.tensor([1.0, 2.0, 3.0, 4.0]), 3)
    assert windows.tolist() == [[1, 2, 3, 4], [2, 3, 4, 0], [3, 4, 0, 0]]
    assert valid.tolist() == [[True] * 4, [True, True, True, False], [True, True, False, False]]


def slow_priorities(q_taken, q_max, bootstrap_q, rewards, dones, trunc, gamma, n):
    """The Ape-X actor's priority per step, transcribed step by step."""
    T, E = q_taken.shape
    out = np.zeros((T, E))
    for e in range(E):
        for t in range(T):
            g, k, terminal = 0.0, 0, False
            while k < n and t + k < T:
                g += gamma ** k * rewards[t + k, e]
                if dones[t + k, e]:
                    g += gamma ** (k + 1) * trunc[t + k, e]
                    terminal = True
                    break
                k += 1
            if not terminal:
                value = q_max[t + k, e] if t + k < T else bootstrap_q[e]
                g += gamma ** k * value
            out[t, e] = abs(g - q_taken[t, e])
    return out


@pytest.mark.parametrize("n", [1, 3, 5])
def test_initial_priorities_against_a_slow_transcription(n):
    rng = np.random.default_rng(n)
    T, E = 7, 3
    q_taken, q_max = rng.normal(size=(T, E)), rng.normal(size=(T, E))
    rewards, bootstrap_q = rng.normal(size=(T, E)), rng.normal(size=E)
    dones = rng.random((T, E)) < 0.25
    trunc = np.where(dones & (rng.random((T, E)) < 0.5), rng.normal(size=(T, E)), 0.0)
    fast = trajectory_priorities(*(torch.tensor(x, dtype=torch.float64) for x in (q_taken, q_max, bootstrap_q,
                                                                                 rewards)),
                                 torch.tensor(dones), torch.tensor(trunc), GAMMA, n)
    assert fast.numpy() == pytest.approx(slow_priorities(q_taken, q_max, bootstrap_q, rewards, dones, trunc, GAMMA, n))
