"""The action distributions against torch.distributions and closed forms: the Gaussian's
log-probability, entropy and KL, sampling, and the categorical object being exactly the
functions discrete IMPALA used before it existed."""
import math

import pytest
import torch
from torch.distributions import Independent, Normal, kl_divergence as torch_kl

from herd.ops.distributions import (Categorical, DiagGaussian, action_log_probs, entropy, get_distribution,
                                    kl_divergence)

T, B, A = 5, 3, 4


def gaussian(seed: int):
    g = torch.Generator().manual_seed(seed)
    mean = torch.randn(T, B, A, generator=g)
    log_std = torch.randn(T, B, A, generator=g) * 0.7
    return torch.cat([mean, log_std], -1), Independent(Normal(mean, log_std.exp()), 1)


def test_gaussian_log_prob_entropy_and_kl_match_torch():
    p, p_ref = gaussian(0)
    q, q_ref = gaussian(1)
    actions = p_ref.sample(torch.Size())                                      # [T, B, A]
    assert DiagGaussian.log_prob(p, actions).shape == (T, B)
    torch.testing.assert_close(DiagGaussian.log_prob(p, actions), p_ref.log_prob(actions))
    torch.testing.assert_close(DiagGaussian.entropy(p), p_ref.entropy())
    torch.testing.assert_close(DiagGaussian.kl(p, q), torch_kl(p_ref, q_ref))
    assert torch.all(DiagGaussian.kl(p, p).abs() < 1e-6)


def test_gaussian_kl_closed_form_in_one_dimension():
    # KL(N(0, 1) || N(1, 2^2)) = log 2 + (1 + 1) / 8 - 1/2
    p = torch.tensor([0.0, 0.0])
    q = torch.tensor([1.0, math.log(2.0)])
    assert float(DiagGaussian.kl(p, q)) == pytest.approx(math.log(2.0) + 2 / 8 - 0.5, abs=1e-6)


def test_gaussian_sampling_follows_the_generator_and_the_parameters():
    params = torch.tensor([[2.0, -1.0, math.log(0.5), math.log(3.0)]]).expand(20000, 4)   # A = 2
    first = DiagGaussian.sample(params, torch.Generator().manual_seed(3))
    again = DiagGaussian.sample(params, torch.Generator().manual_seed(3))
    assert first.shape == (20000, 2) and torch.equal(first, again)
    torch.testing.assert_close(first.mean(0), torch.tensor([2.0, -1.0]), atol=0.06, rtol=0)
    torch.testing.assert_close(first.std(0), torch.tensor([0.5, 3.0]), atol=0.06, rtol=0)
    assert torch.equal(DiagGaussian.mode(params[:1]), torch.tensor([[2.0, -1.0]]))


def test_split_and_join_are_inverse():
    params, _ = gaussian(2)
    mean, log_std = DiagGaussian.split(params)
    assert mean.shape == log_std.shape == (T, B, A)
    assert torch.equal(DiagGaussian.join(mean, log_std), params)
    assert DiagGaussian.param_size(A) == 2 * A and DiagGaussian.action_shape(A) == (A,)


def test_categorical_is_the_old_functions_bit_for_bit():
    g = torch.Generator().manual_seed(4)
    logits, other = torch.randn(T, B, A, generator=g), torch.randn(T, B, A, generator=g)
    actions = torch.randint(A, (T, B), generator=g)
    assert torch.equal(Categorical.log_prob(logits, actions), action_log_probs(logits, actions))
    assert torch.equal(Categorical.entropy(logits), entropy(logits))
    assert torch.equal(Categorical.kl(logits, other), kl_divergence(logits, other))
    flat = logits[0]
    expected = torch.multinomial(torch.softmax(flat, -1), 1, generator=torch.Generator().manual_seed(5)).squeeze(1)
    assert torch.equal(Categorical.sample(flat, torch.Generator().manual_seed(5)), expected)
    assert Categorical.join(*Categorical.split(logits)) is logits


def test_unknown_distribution_is_one_line():
    with pytest.raises(ValueError, match="unknown action distribution 'beta'"):
        get_distribution("beta")
