"""The action distributions against torch.distributions and closed forms: the Gaussian's
log-probability, entropy and KL, sampling, and the categorical one against torch.distributions and its softmax."""
import math

import pytest
import torch
from torch.distributions import Independent, Normal, kl_divergence as torch_kl

from herd.ops.distributions import Categorical, DiagGaussian, get_distribution

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


def test_categorical_matches_torch_distributions():
    """Catches a wrong log-probability, entropy or KL (a sign, a missing log-softmax, the
    KL's arguments swapped): each is compared with torch.distributions' own Categorical,
    not with the functions herd's Categorical calls."""
    from torch.distributions import Categorical as TorchCategorical
    g = torch.Generator().manual_seed(4)
    logits, other = torch.randn(T, B, A, generator=g) * 2, torch.randn(T, B, A, generator=g) * 2
    actions = torch.randint(A, (T, B), generator=g)
    p, q = TorchCategorical(logits=logits), TorchCategorical(logits=other)
    torch.testing.assert_close(Categorical.log_prob(logits, actions), p.log_prob(actions))
    torch.testing.assert_close(Categorical.entropy(logits), p.entropy())
    torch.testing.assert_close(Categorical.kl(logits, other), torch_kl(p, q))
    assert torch.all(Categorical.kl(logits, logits).abs() < 1e-6)
    assert Categorical.join(*Categorical.split(logits)) is logits


def test_categorical_sampling_frequencies_follow_the_softmax():
    """Catches a sampler that ignores the logits, samples from the logits themselves or
    from the wrong axis: 40,000 draws per row, each action's frequency within 0.015 of its
    softmax probability (6 standard deviations: sqrt(p (1 - p) / N) <= 0.0025), and the
    generator decides the draws."""
    logits = torch.tensor([[2.0, 0.0, -1.0, 0.5], [-3.0, 1.0, 1.0, 0.0]])
    rows = logits.repeat_interleave(40000, 0)                                  # [2 N, A]
    drawn = Categorical.sample(rows, torch.Generator().manual_seed(5))         # [2 N]
    assert drawn.shape == (80000,) and torch.equal(drawn, Categorical.sample(rows, torch.Generator().manual_seed(5)))
    for row in range(2):
        counts = torch.bincount(drawn[row * 40000:(row + 1) * 40000], minlength=A).double()
        torch.testing.assert_close(counts / 40000, torch.softmax(logits[row].double(), -1), atol=0.015, rtol=0)


def test_unknown_distribution_is_one_line():
    with pytest.raises(ValueError, match="unknown action distribution 'beta'"):
        get_distribution("beta")
