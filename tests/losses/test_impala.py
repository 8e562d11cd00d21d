import math
from types import SimpleNamespace

import pytest
import torch

from herd.losses.impala import ImpalaLossWeights, impala_loss, vtrace_targets

METRIC_KEYS = {"loss", "pg_loss", "value_loss", "entropy", "policy_cloning_loss", "value_cloning_loss",
               "kl_mask_fraction", "mean_rho", "advantage_mean"}


def make_case(T, B, A, seed=0, replayed=None):
    """Random batch + model output leaves (so .grad can be inspected)."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(T + 1, B, A, generator=g).requires_grad_(True)       # [T+1, B, A]
    value = torch.randn(T + 1, B, generator=g).requires_grad_(True)           # [T+1, B]
    batch = {
        "action": torch.randint(A, (T, B), generator=g),
        "reward": torch.randn(T, B, generator=g),
        "done": torch.rand(T, B, generator=g) < 0.2,
        "trunc_value": torch.zeros(T, B),
        "behaviour_logits": torch.randn(T, B, A, generator=g),
        "behaviour_value": torch.randn(T, B, generator=g),
        "replayed": torch.zeros(B, dtype=torch.bool) if replayed is None else torch.tensor(replayed),
    }
    return batch, SimpleNamespace(logits=logits, value=value, features=None)


def on_policy(batch, out):
    batch["behaviour_logits"] = out.logits[:-1].detach().clone()
    batch["behaviour_value"] = out.value[:-1].detach().clone()
    return batch


def test_gradients_flow_and_bootstrap_is_detached():
    batch, out = make_case(T=5, B=3, A=4, replayed=[True, False, True])
    w = ImpalaLossWeights(use_policy_cloning=True, use_value_cloning=True, use_kl_mask=True, kl_div_threshold=10.0)
    loss, metrics = impala_loss(batch, out, w)
    # Metrics are detached 0-dim tensors: a float() here would be a host read every update.
    assert set(metrics) == METRIC_KEYS
    assert all(torch.is_tensor(v) and v.dim() == 0 and not v.requires_grad for v in metrics.values())
    assert math.isfinite(metrics["loss"]) and metrics["loss"] == pytest.approx(float(loss.detach()))
    loss.backward()
    assert (out.logits.grad[:-1].abs().sum(-1) > 0).all()       # entropy alone touches every step
    assert (out.value.grad[:-1] != 0).all()
    # The last step only supplies the bootstrap, which is a target: no gradient through it.
    assert (out.logits.grad[-1] == 0).all() and (out.value.grad[-1] == 0).all()


def test_on_policy_pg_gradient_is_reinforce_with_baseline():
    # T=2, B=1, gamma 0.9, rewards (1, 2), V = (0.5, 0.3), bootstrap 1.0, no episode end.
    # Returns: G_1 = 2 + 0.9 * 1 = 2.9;  G_0 = 1 + 0.9 * 2.9 = 3.61.
    # Advantages r_t + gamma G_{t+1} - V_t:  A_0 = 3.61 - 0.5 = 3.11;  A_1 = 2.9 - 0.3 = 2.6.
    logits = torch.tensor([[[0.2, -0.4, 1.0]], [[0.0, 0.3, -0.2]], [[0.7, 0.1, 0.0]]], requires_grad=True)
    value = torch.tensor([[0.5], [0.3], [1.0]], requires_grad=True)
    batch = {"action": torch.tensor([[2], [0]]), "reward": torch.tensor([[1.0], [2.0]]),
             "done": torch.zeros(2, 1, dtype=torch.bool), "trunc_value": torch.zeros(2, 1),
             "replayed": torch.zeros(1, dtype=torch.bool)}
    out = SimpleNamespace(logits=logits, value=value, features=None)
    on_policy(batch, out)
    w = ImpalaLossWeights(gamma=0.9, value=0.0, entropy=0.0)
    loss, metrics = impala_loss(batch, out, w)
    loss.backward()

    advantages = torch.tensor([3.11, 2.6])
    probs = torch.softmax(logits.detach()[:2, 0], -1)
    onehot = torch.nn.functional.one_hot(torch.tensor([2, 0]), 3).float()
    # d(-mean_t log pi(a_t) A_t)/d logits_t = -(onehot - pi) A_t / T
    expected = -(onehot - probs) * advantages[:, None] / 2
    torch.testing.assert_close(logits.grad[:2, 0], expected)
    assert metrics["mean_rho"] == pytest.approx(1.0)
    assert metrics["advantage_mean"] == pytest.approx(float(advantages.mean()))


def test_truncated_step_bootstraps_from_trunc_value_terminated_does_not():
    # Columns: truncated (trunc_value 5), terminated, running.  Bootstrap V(x_T) = 100 must
    # only reach the running column.  On-policy, so vs is the plain return.
    batch, out = make_case(T=1, B=3, A=2)
    on_policy(batch, out)
    with torch.no_grad():
        out.value[-1] = 100.0
    batch["reward"] = torch.ones(1, 3)
    batch["done"] = torch.tensor([[True, True, False]])
    # NaN on the running column: trunc_value only matters where done (it should be 0 there).
    batch["trunc_value"] = torch.tensor([[5.0, 0.0, float("nan")]])
    vs = vtrace_targets(batch, out, ImpalaLossWeights(gamma=0.9)).vs
    torch.testing.assert_close(vs, torch.tensor([[1.0 + 0.9 * 5.0, 1.0, 1.0 + 0.9 * 100.0]]))


def test_truncation_mid_unroll_ignores_next_episode_value():
    batch, out = make_case(T=2, B=1, A=2)
    on_policy(batch, out)
    with torch.no_grad():
        out.value.copy_(torch.tensor([[0.0], [50.0], [100.0]]))
    batch["reward"] = torch.tensor([[1.0], [2.0]])
    batch["done"] = torch.tensor([[True], [False]])
    batch["trunc_value"] = torch.tensor([[3.0], [0.0]])
    vs = vtrace_targets(batch, out, ImpalaLossWeights(gamma=0.5)).vs
    torch.testing.assert_close(vs[:, 0], torch.tensor([1.0 + 0.5 * 3.0, 2.0 + 0.5 * 100.0]))


def cloning_only(**kw):
    return ImpalaLossWeights(policy_gradient=0.0, value=0.0, entropy=0.0,
                             use_policy_cloning=True, use_value_cloning=True, **kw)


def test_cloning_zero_when_behaviour_matches_on_replayed_columns():
    batch, out = make_case(T=4, B=2, A=3, replayed=[True, False])
    on_policy(batch, out)
    batch["behaviour_logits"][:, 1] += torch.randn(4, 3) * 3    # column 1 differs but is not replayed
    batch["behaviour_value"][:, 1] += 7.0
    loss, metrics = impala_loss(batch, out, cloning_only())
    assert metrics["policy_cloning_loss"] == pytest.approx(0.0, abs=1e-6)
    assert metrics["value_cloning_loss"] == pytest.approx(0.0, abs=1e-6)


def test_cloning_nonzero_and_only_on_replayed_columns():
    batch, out = make_case(T=4, B=3, A=3, replayed=[True, False, True])
    loss, metrics = impala_loss(batch, out, cloning_only(policy_cloning=1.0, value_cloning=1.0))
    mu = torch.softmax(batch["behaviour_logits"][:, [0, 2]], -1)
    pi = torch.softmax(out.logits.detach()[:-1, [0, 2]], -1)
    expected_pc = (mu * (mu.log() - pi.log())).sum(-1).mean()     # KL(behaviour || target)
    expected_vc = ((out.value.detach()[:-1, [0, 2]] - batch["behaviour_value"][:, [0, 2]]) ** 2).mean()
    assert metrics["policy_cloning_loss"] == pytest.approx(float(expected_pc), rel=1e-5)
    assert metrics["value_cloning_loss"] == pytest.approx(float(expected_vc), rel=1e-5)
    assert metrics["loss"] == pytest.approx(float(expected_pc + expected_vc), rel=1e-5)
    loss.backward()
    assert (out.logits.grad[:, 1] == 0).all() and (out.value.grad[:, 1] == 0).all()
    assert (out.logits.grad[:-1, [0, 2]] != 0).any() and (out.value.grad[:-1, [0, 2]] != 0).all()


def test_cloning_zero_without_replayed_columns():
    batch, out = make_case(T=3, B=2, A=3)                         # replayed all False
    loss, metrics = impala_loss(batch, out, cloning_only())
    assert metrics["policy_cloning_loss"] == 0.0 and metrics["value_cloning_loss"] == 0.0
    assert float(loss.detach()) == 0.0


def test_cloning_terms_not_in_loss_when_disabled():
    batch, out = make_case(T=3, B=2, A=3, replayed=[True, True])
    w = ImpalaLossWeights(policy_gradient=0.0, value=0.0, entropy=0.0)
    loss, metrics = impala_loss(batch, out, w)
    assert metrics["policy_cloning_loss"] > 0 and float(loss.detach()) == 0.0


def test_kl_mask_drops_exactly_steps_above_threshold():
    # Behaviour uniform over 2 actions; target logits (x, 0) give KL(target || uniform) =
    # log 2 - H(sigmoid(x)):  x=0 -> 0,  x=1 -> 0.111,  x=5 -> 0.653.  Threshold 0.3.
    xs = torch.tensor([[0.0, 5.0], [5.0, 1.0], [1.0, 0.0], [0.0, 5.0]])      # [T=4, B=2]
    p = torch.sigmoid(xs)
    kl = math.log(2) + p * p.log() + (1 - p) * (1 - p).log()
    expected_keep = kl <= 0.3
    assert expected_keep.tolist() == [[True, False], [False, True], [True, True], [True, False]]

    batch, out = make_case(T=4, B=2, A=2)
    with torch.no_grad():
        out.logits[:-1] = torch.stack([xs, torch.zeros_like(xs)], -1)
        out.value.copy_(torch.arange(10.0).reshape(5, 2))
    batch["behaviour_logits"] = torch.zeros(4, 2, 2)
    batch["done"] = torch.zeros(4, 2, dtype=torch.bool)
    w = ImpalaLossWeights(gamma=0.9, value=0.0, entropy=0.0, use_kl_mask=True, kl_div_threshold=0.3)

    targets = vtrace_targets(batch, out, w)
    assert torch.equal(targets.keep, expected_keep)
    values = out.value.detach()
    # Dropped steps: target is V itself and advantage 0.
    torch.testing.assert_close(targets.vs[~expected_keep], values[:-1][~expected_keep])
    assert (targets.pg_advantages[~expected_keep] == 0).all()
    # The trace is cut: column 0 step 0 (x=0, rho=1) precedes a dropped step -> one-step target.
    r = batch["reward"]
    assert float(targets.vs[0, 0]) == pytest.approx(float(r[0, 0] + 0.9 * values[1, 0]))

    loss, metrics = impala_loss(batch, out, w)
    assert metrics["kl_mask_fraction"] == pytest.approx(5 / 8)
    manual_pg = -(targets.target_action_log_probs * targets.pg_advantages).detach()[expected_keep].mean()
    assert metrics["pg_loss"] == pytest.approx(float(manual_pg), rel=1e-5)
    loss.backward()
    assert (out.logits.grad[:-1][~expected_keep] == 0).all()
    assert (out.logits.grad[:-1][expected_keep].abs().sum(-1) > 0).all()


def test_kl_mask_off_keeps_everything_and_all_masked_is_finite():
    batch, out = make_case(T=3, B=2, A=4)
    _, metrics = impala_loss(batch, out, ImpalaLossWeights())
    assert metrics["kl_mask_fraction"] == 1.0
    _, metrics = impala_loss(batch, out, ImpalaLossWeights(use_kl_mask=True, kl_div_threshold=0.0))
    assert metrics["kl_mask_fraction"] == 0.0
    assert metrics["pg_loss"] == 0.0 and metrics["value_loss"] == 0.0 and math.isfinite(metrics["loss"])


def test_single_step_single_column():
    batch, out = make_case(T=1, B=1, A=3, replayed=[True])
    w = ImpalaLossWeights(use_policy_cloning=True, use_value_cloning=True, use_kl_mask=True, kl_div_threshold=5.0)
    loss, metrics = impala_loss(batch, out, w)
    loss.backward()
    assert math.isfinite(metrics["loss"]) and out.logits.grad is not None


def test_rejects_wrong_output_length():
    batch, out = make_case(T=3, B=2, A=3)
    out.logits = out.logits[:-1]                                  # [T, B, A] instead of [T+1, ...]
    with pytest.raises(ValueError, match="T\\+1"):
        impala_loss(batch, out, ImpalaLossWeights())


def test_learns_two_armed_bandit():
    # One-step episodes: arm 0 pays 1 + noise, arm 1 pays 0.2 + noise.  Actions come from the
    # current policy, so the data is on-policy and only pg + baseline drive learning.
    torch.manual_seed(0)
    B = 32
    logits = torch.zeros(2, requires_grad=True)
    value = torch.zeros((), requires_grad=True)
    opt = torch.optim.Adam([logits, value], lr=0.05)
    w = ImpalaLossWeights(entropy=0.001)
    for _ in range(300):
        with torch.no_grad():
            actions = torch.distributions.Categorical(logits=logits).sample((1, B))   # [1, B]
            rewards = torch.where(actions == 0, 1.0, 0.2) + 0.3 * torch.randn(1, B)
        out = SimpleNamespace(logits=logits.expand(2, B, 2), value=value.expand(2, B), features=None)
        batch = {"action": actions, "reward": rewards, "done": torch.ones(1, B, dtype=torch.bool),
                 "trunc_value": torch.zeros(1, B), "behaviour_logits": logits.detach().expand(1, B, 2),
                 "behaviour_value": value.detach().expand(1, B), "replayed": torch.zeros(B, dtype=torch.bool)}
        loss, _ = impala_loss(batch, out, w)
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert float(torch.softmax(logits.detach(), -1)[0]) > 0.9
