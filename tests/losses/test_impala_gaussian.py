"""The IMPALA loss with continuous actions: V-trace's log-rho, the entropy bonus, CLEAR's
policy cloning and LASER's mask all computed with the diagonal Gaussian
(herd.ops.distributions.DiagGaussian), checked against torch.distributions."""
from types import SimpleNamespace

import pytest
import torch
from torch.distributions import Independent, Normal, kl_divergence

from herd.losses.impala import ImpalaLossWeights, impala_loss, vtrace_targets
from herd.ops.distributions import DiagGaussian
from herd.ops.vtrace import from_importance_weights

T, B, A = 6, 4, 3


def normal(params):
    mean, log_std = params.chunk(2, -1)
    return Independent(Normal(mean, log_std.exp()), 1)


def gaussian_case(seed=0, replayed=None):
    g = torch.Generator().manual_seed(seed)
    params = torch.cat([torch.randn(T + 1, B, A, generator=g), 0.3 * torch.randn(T + 1, B, A, generator=g)], -1)
    out = SimpleNamespace(logits=params.requires_grad_(True), value=torch.randn(T + 1, B, generator=g).requires_grad_(True),
                          features=None)
    batch = {
        "action": torch.randn(T, B, A, generator=g) * 2.0,         # unclipped samples may leave [-1, 1]
        "reward": torch.randn(T, B, generator=g),
        "done": torch.rand(T, B, generator=g) < 0.2,
        "trunc_value": torch.zeros(T, B),
        "behaviour_mean": torch.randn(T, B, A, generator=g),
        "behaviour_log_std": 0.3 * torch.randn(T, B, A, generator=g),
        "behaviour_value": torch.randn(T, B, generator=g),
        "replayed": torch.zeros(B, dtype=torch.bool) if replayed is None else torch.tensor(replayed),
    }
    return batch, out


def behaviour(batch):
    return torch.cat([batch["behaviour_mean"], batch["behaviour_log_std"]], -1)


def test_vtrace_log_rhos_are_the_gaussian_log_ratio():
    batch, out = gaussian_case()
    w = ImpalaLossWeights(gamma=0.9)
    targets = vtrace_targets(batch, out, w, DiagGaussian)
    expected = normal(out.logits[:-1].detach()).log_prob(batch["action"]) - normal(behaviour(batch)).log_prob(batch["action"])
    torch.testing.assert_close(targets.log_rhos, expected)
    discounts = 0.9 * (~batch["done"]).float()
    reference = from_importance_weights(expected, discounts, batch["reward"], out.value[:-1].detach(),
                                        out.value[-1].detach())
    torch.testing.assert_close(targets.vs, reference.vs)
    torch.testing.assert_close(targets.pg_advantages, reference.pg_advantages)


def test_loss_terms_and_gradients_with_gaussian_actions():
    batch, out = gaussian_case(replayed=[True, False, True, False])
    w = ImpalaLossWeights(use_policy_cloning=True, use_value_cloning=True, entropy=0.01)
    loss, metrics = impala_loss(batch, out, w, DiagGaussian)
    target = normal(out.logits[:-1].detach())
    assert metrics["entropy"] == pytest.approx(float(target.entropy().mean()), rel=1e-5)
    replayed = batch["replayed"]
    cloning = kl_divergence(normal(behaviour(batch)[:, replayed]), normal(out.logits[:-1].detach()[:, replayed]))
    assert metrics["policy_cloning_loss"] == pytest.approx(float(cloning.mean()), rel=1e-5)
    loss.backward()
    grad = out.logits.grad
    assert (grad[:-1, :, :A].abs().sum(-1) > 0).all()          # the means of every step
    assert (grad[:-1, :, A:].abs().sum(-1) > 0).all()          # and the log-stds
    assert (grad[-1] == 0).all()                               # the bootstrap step is a target


def test_on_policy_gaussian_has_unit_rhos_and_no_cloning_gap():
    batch, out = gaussian_case(replayed=[True, True, False, False])
    mean, log_std = out.logits[:-1].detach().chunk(2, -1)
    batch["behaviour_mean"], batch["behaviour_log_std"] = mean.clone(), log_std.clone()
    _, metrics = impala_loss(batch, out, ImpalaLossWeights(use_policy_cloning=True), DiagGaussian)
    assert metrics["mean_rho"] == pytest.approx(1.0)
    assert metrics["policy_cloning_loss"] == pytest.approx(0.0, abs=1e-6)


def test_laser_mask_drops_the_steps_whose_gaussian_kl_is_large():
    batch, out = gaussian_case()
    mean, log_std = out.logits[:-1].detach().chunk(2, -1)
    batch["behaviour_mean"], batch["behaviour_log_std"] = mean.clone(), log_std.clone()
    batch["behaviour_mean"][2, 1] += 10.0                           # one step far off-policy: KL >> 1
    w = ImpalaLossWeights(use_kl_mask=True, kl_div_threshold=0.3)
    targets = vtrace_targets(batch, out, w, DiagGaussian)
    expected = torch.ones(T, B, dtype=torch.bool)
    expected[2, 1] = False
    assert torch.equal(targets.keep, expected)
    assert float(targets.pg_advantages[2, 1]) == 0.0


def test_wrong_parameter_width_is_one_clear_error():
    batch, out = gaussian_case()
    batch["behaviour_log_std"] = batch["behaviour_log_std"][..., :1]
    with pytest.raises(ValueError, match="behaviour policy's parameters must be"):
        impala_loss(batch, out, ImpalaLossWeights(), DiagGaussian)
