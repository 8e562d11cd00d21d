"""V-trace against a slow, literal numpy transcription of the IMPALA paper's definition.

The reference uses the DOUBLE SUM (paper eq. 1), not the backward recursion the
implementation uses, so agreement checks the recursion's algebra too:

    v_s = V(x_s) + sum_{t=s}^{T-1} (prod_{i=s}^{t-1} gamma_i c_i) delta_t
    delta_t = rho_t (r_t + gamma_t V(x_{t+1}) - V(x_t)),   V(x_T) = bootstrap

with per-step discounts gamma_i (0 at episode ends), truncated at the end of the unroll.
"""
import numpy as np
import pytest
import torch

import herd.vtrace
from herd.ops import distributions
from herd.ops.vtrace import VTraceFromLogitsReturns, VTraceReturns, from_importance_weights, from_logits


def _clip(x, threshold):
    return x if threshold is None else np.minimum(threshold, x)


def reference_vtrace(log_rhos, discounts, rewards, values, bootstrap, rho_bar, pg_rho_bar, c_bar):
    """Literal paper definition, float64 numpy, O(T^3 B) loops on purpose."""
    T, B = log_rhos.shape
    rhos = np.exp(log_rhos)
    rho = _clip(rhos, rho_bar)
    c = _clip(rhos, c_bar)
    pg_rho = _clip(rhos, pg_rho_bar)
    V = np.concatenate([values, bootstrap[None]], axis=0)      # [T+1, B], V[T] = bootstrap
    vs = np.zeros((T + 1, B))
    for b in range(B):
        for s in range(T):
            total = V[s, b]
            for t in range(s, T):
                weight = 1.0
                for i in range(s, t):                           # empty product at t = s
                    weight *= discounts[i, b] * c[i, b]
                delta = rho[t, b] * (rewards[t, b] + discounts[t, b] * V[t + 1, b] - V[t, b])
                total += weight * delta
            vs[s, b] = total
        vs[T, b] = bootstrap[b]
    pg_adv = pg_rho * (rewards + discounts * vs[1:] - values)
    return vs[:T], pg_adv


def random_inputs(T, B, seed, log_rho_scale=1.5, dtype=np.float64):
    rng = np.random.default_rng(seed)
    # Scale 1.5 puts many rhos well above 1 (clipping bites) and many far below.
    log_rhos = rng.normal(scale=log_rho_scale, size=(T, B))
    done = rng.random((T, B)) < 0.2
    discounts = np.where(done, 0.0, 0.9 + 0.09 * rng.random((T, B)))
    rewards = rng.normal(size=(T, B))
    values = rng.normal(size=(T, B))
    bootstrap = rng.normal(size=(B,))
    return [a.astype(dtype) for a in (log_rhos, discounts, rewards, values, bootstrap)]


def run_torch(arrays, **thresholds):
    return from_importance_weights(*(torch.from_numpy(a) for a in arrays), **thresholds)


CASES = [(1, 1), (1, 4), (5, 1), (7, 3), (20, 5)]
THRESHOLDS = [
    dict(clip_rho_threshold=1.0, clip_pg_rho_threshold=1.0, clip_c_threshold=1.0),
    dict(clip_rho_threshold=2.0, clip_pg_rho_threshold=0.5, clip_c_threshold=0.8),
    dict(clip_rho_threshold=None, clip_pg_rho_threshold=None, clip_c_threshold=None),
]


@pytest.mark.parametrize("T,B", CASES)
@pytest.mark.parametrize("thresholds", THRESHOLDS)
def test_matches_paper_double_sum_float64(T, B, thresholds):
    arrays = random_inputs(T, B, seed=T * 100 + B)
    got = run_torch(arrays, **thresholds)
    ref_vs, ref_adv = reference_vtrace(*arrays, thresholds["clip_rho_threshold"],
                                       thresholds["clip_pg_rho_threshold"], thresholds["clip_c_threshold"])
    np.testing.assert_allclose(got.vs.numpy(), ref_vs, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(got.pg_advantages.numpy(), ref_adv, rtol=1e-10, atol=1e-10)


def test_matches_paper_double_sum_float32():
    arrays = random_inputs(15, 4, seed=7, dtype=np.float32)
    got = run_torch(arrays)
    assert got.vs.dtype == torch.float32
    ref_vs, ref_adv = reference_vtrace(*(a.astype(np.float64) for a in arrays), 1.0, 1.0, 1.0)
    np.testing.assert_allclose(got.vs.numpy(), ref_vs, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got.pg_advantages.numpy(), ref_adv, rtol=1e-5, atol=1e-5)


def test_default_thresholds_clip_and_none_does_not():
    # The inputs make clipping matter, so a missing clamp (or a clamp where None was asked)
    # changes the answer: check the two settings actually differ.
    arrays = random_inputs(10, 3, seed=3, log_rho_scale=2.0)
    clipped = run_torch(arrays)
    unclipped = run_torch(arrays, clip_rho_threshold=None, clip_pg_rho_threshold=None, clip_c_threshold=None)
    assert not torch.allclose(clipped.vs, unclipped.vs)
    ref_vs, _ = reference_vtrace(*arrays, 1.0, 1.0, 1.0)
    np.testing.assert_allclose(clipped.vs.numpy(), ref_vs, atol=1e-10)


def test_episode_end_stops_bootstrapping():
    # One column, discount 0 at step 1: vs_1 = r_1 exactly when on-policy, whatever follows.
    log_rhos = torch.zeros(3, 1, dtype=torch.float64)
    discounts = torch.tensor([[0.9], [0.0], [0.9]], dtype=torch.float64)
    rewards = torch.tensor([[1.0], [2.0], [3.0]], dtype=torch.float64)
    values = torch.tensor([[10.0], [20.0], [30.0]], dtype=torch.float64)
    bootstrap = torch.tensor([100.0], dtype=torch.float64)
    vs = from_importance_weights(log_rhos, discounts, rewards, values, bootstrap).vs
    np.testing.assert_allclose(vs[:, 0].numpy(), [1.0 + 0.9 * 2.0, 2.0, 3.0 + 0.9 * 100.0])


def n_step_returns(discounts, rewards, bootstrap):
    """Forward-written n-step bootstrapped return to the end of the unroll."""
    T, B = rewards.shape
    out = np.zeros((T, B))
    for s in range(T):
        g, scale = 0.0, 1.0
        for t in range(s, T):
            g += scale * rewards[t]
            scale = scale * discounts[t]
        out[s] = g + scale * bootstrap
    return out


def test_on_policy_reduces_to_n_step_returns():
    _, discounts, rewards, values, bootstrap = random_inputs(12, 4, seed=11)
    log_rhos = np.zeros_like(rewards)
    got = run_torch((log_rhos, discounts, rewards, values, bootstrap))
    expected = n_step_returns(discounts, rewards, bootstrap)
    np.testing.assert_allclose(got.vs.numpy(), expected, atol=1e-10)
    # On-policy the advantage is the one-step-bootstrapped n-step advantage.
    next_vs = np.concatenate([expected[1:], bootstrap[None]], 0)
    np.testing.assert_allclose(got.pg_advantages.numpy(), rewards + discounts * next_vs - values, atol=1e-10)


def test_outputs_carry_no_gradient():
    arrays = random_inputs(6, 2, seed=5, dtype=np.float32)
    tensors = [torch.from_numpy(a).requires_grad_(True) for a in arrays]
    got = from_importance_weights(*tensors)
    assert isinstance(got, VTraceReturns)
    assert not got.vs.requires_grad and not got.pg_advantages.requires_grad


def test_rejects_mismatched_shapes():
    log_rhos, discounts, rewards, values, bootstrap = (torch.from_numpy(a) for a in random_inputs(4, 3, seed=1))
    with pytest.raises(ValueError, match="bootstrap"):
        from_importance_weights(log_rhos, discounts, rewards, values, bootstrap[None])
    with pytest.raises(ValueError, match="rewards"):
        from_importance_weights(log_rhos, discounts, rewards[:, :1], values, bootstrap)


def test_from_logits_consistent_with_importance_weights():
    T, B, A = 8, 3, 5
    gen = torch.Generator().manual_seed(0)
    behaviour = torch.randn(T, B, A, generator=gen, dtype=torch.float64) * 2
    target = torch.randn(T, B, A, generator=gen, dtype=torch.float64).requires_grad_(True)
    actions = torch.randint(A, (T, B), generator=gen)
    _, discounts, rewards, values, bootstrap = (torch.from_numpy(a) for a in random_inputs(T, B, seed=2))
    thresholds = dict(clip_rho_threshold=1.5, clip_pg_rho_threshold=1.2, clip_c_threshold=0.9)

    got = from_logits(behaviour, target, actions, discounts, rewards, values, bootstrap, **thresholds)
    assert isinstance(got, VTraceFromLogitsReturns)

    # Independent log-probs: log of the normalised softmax, gathered by a python loop.
    def probs(logits):
        return torch.softmax(logits.detach(), -1)

    def pick(p):
        return torch.tensor([[float(p[t, b, actions[t, b]]) for b in range(B)] for t in range(T)],
                            dtype=torch.float64)

    torch.testing.assert_close(got.target_action_log_probs.detach(), pick(probs(target)).log())
    torch.testing.assert_close(got.behaviour_action_log_probs, pick(probs(behaviour)).log())
    torch.testing.assert_close(got.log_rhos.detach(), (pick(probs(target)) / pick(probs(behaviour))).log())

    direct = from_importance_weights(got.log_rhos.detach(), discounts, rewards, values, bootstrap, **thresholds)
    torch.testing.assert_close(got.vs, direct.vs)
    torch.testing.assert_close(got.pg_advantages, direct.pg_advantages)
    # Log-probs keep their graph (for the pg loss); the targets do not.
    assert got.target_action_log_probs.requires_grad and not got.vs.requires_grad


def test_public_module_reexports():
    assert herd.vtrace.from_importance_weights is from_importance_weights
    assert herd.vtrace.from_logits is from_logits
    assert herd.vtrace.VTraceReturns is VTraceReturns
    assert herd.vtrace.VTraceFromLogitsReturns is VTraceFromLogitsReturns


def test_distribution_helpers():
    gen = torch.Generator().manual_seed(1)
    p_logits = torch.randn(4, 3, 6, generator=gen, dtype=torch.float64)
    q_logits = torch.randn(4, 3, 6, generator=gen, dtype=torch.float64)
    p, q = torch.softmax(p_logits, -1), torch.softmax(q_logits, -1)
    torch.testing.assert_close(distributions.entropy(p_logits), -(p * p.log()).sum(-1))
    torch.testing.assert_close(distributions.kl_divergence(p_logits, q_logits), (p * (p / q).log()).sum(-1))
    # KL is asymmetric and zero against itself; entropy of uniform is log(A).
    assert not torch.allclose(distributions.kl_divergence(p_logits, q_logits),
                              distributions.kl_divergence(q_logits, p_logits))
    torch.testing.assert_close(distributions.kl_divergence(p_logits, p_logits), torch.zeros(4, 3, dtype=torch.float64))
    torch.testing.assert_close(distributions.entropy(torch.zeros(2, 6)), torch.full((2,), float(np.log(6))))
    # Extreme logits stay finite (log_softmax, not log(softmax)).
    extreme = torch.tensor([[200.0, -200.0]])
    assert torch.isfinite(distributions.kl_divergence(extreme, -extreme)).all()
    assert torch.isfinite(distributions.action_log_probs(extreme, torch.tensor([1]))).all()


@pytest.mark.parametrize("T,B", [(6, 3), (20, 5), (80, 2)])
def test_steps_dropped_by_the_mask_match_the_double_sum(T, B):
    """LASER drops a step by giving it log_rho = -inf (rho = c = 0). Catches a closed form
    that mishandles a zero inside the product of traces (or an episode end beside it)."""
    arrays = random_inputs(T, B, seed=T + B)
    rng = np.random.default_rng(T)
    arrays[0] = np.where(rng.random((T, B)) < 0.25, -np.inf, arrays[0])
    got = run_torch(arrays)
    ref_vs, ref_adv = reference_vtrace(*arrays, 1.0, 1.0, 1.0)
    np.testing.assert_allclose(got.vs.numpy(), ref_vs, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(got.pg_advantages.numpy(), ref_adv, rtol=1e-10, atol=1e-10)


def test_the_number_of_operations_does_not_grow_with_the_unroll():
    """V-trace has no loop over time steps. The per-step Python loop launched 3 ops per
    step (165 more at T=60 than at T=5); the closed form's count grows only by what aten
    does inside cumprod and the batched matmul for a larger input (16 here), so fewer
    than one op per extra step is allowed. Catches a return of the loop."""
    from torch.profiler import ProfilerActivity, profile

    def ops_for(T):
        inputs = [torch.from_numpy(a) for a in random_inputs(T, 4, seed=1)]
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            from_importance_weights(*inputs)
        return sum(e.count for e in prof.key_averages())

    assert ops_for(60) - ops_for(5) < 60 - 5


def gae(rewards, values, bootstrap, discounts, lam):
    """Generalised advantage estimation (Schulman et al. 2016), a loop over time:
    A_t = delta_t + gamma_t lambda A_{t+1}, delta_t = r_t + gamma_t V_{t+1} - V_t."""
    T = rewards.shape[0]
    advantages = torch.zeros_like(rewards)
    following = torch.zeros_like(bootstrap)
    for t in reversed(range(T)):
        next_value = bootstrap if t == T - 1 else values[t + 1]
        delta = rewards[t] + discounts[t] * next_value - values[t]
        following = delta + discounts[t] * lam * following
        advantages[t] = following
    return advantages


@pytest.mark.parametrize("lam", [0.0, 0.5, 0.95, 1.0])
def test_vtrace_with_lambda_on_policy_is_gae(lam):
    """On on-policy data (log rho = 0) with c-bar >= 1, vs_t - V(x_t) is GAE(lambda)'s
    advantage, episode ends included; the negative control: lambda left out of the
    traces gives GAE(1), far from GAE(lambda) for lambda < 1."""
    g = torch.Generator().manual_seed(7)
    T, B = 12, 5
    rewards = torch.randn(T, B, generator=g, dtype=torch.float64)
    values = torch.randn(T, B, generator=g, dtype=torch.float64)
    bootstrap = torch.randn(B, generator=g, dtype=torch.float64)
    discounts = 0.99 * (torch.rand(T, B, generator=g) > 0.2).to(torch.float64)
    log_rhos = torch.zeros(T, B, dtype=torch.float64)
    vs = from_importance_weights(log_rhos, discounts, rewards, values, bootstrap, lambda_=lam).vs
    expected = gae(rewards, values, bootstrap, discounts, lam)
    torch.testing.assert_close(vs - values, expected, rtol=0, atol=1e-6)
    if lam < 1:
        without = from_importance_weights(log_rhos, discounts, rewards, values, bootstrap).vs
        assert (without - values - expected).abs().max() > 1e-2
