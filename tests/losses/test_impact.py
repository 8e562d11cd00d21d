"""IMPACT's loss (herd/losses/impact.py) against a slow transcription of the paper's
formula, element by element in float64, with negative controls that show the comparison
can tell truncation, clipping and episode ends apart; and its state: the target network's
period, the adaptive KL coefficient and an exact resume."""
from __future__ import annotations

import copy
from types import SimpleNamespace

import pytest
import torch

from herd.losses.impact import ImpactLoss, ImpactLossWeights, impact_loss
from herd.models import ModelOutput

GAMMA = 0.9


def make_case(T=6, B=3, A=4, seed=0, spread=1.5):
    """A batch whose target-to-behaviour ratios reach well past 2 (the truncation) and whose
    learner-to-target ratios leave [0.6, 1.4] (the clipping), with terminated and truncated
    steps. Leaves with gradients: the learner's logits and values."""
    g = torch.Generator().manual_seed(seed)
    logits = (spread * torch.randn(T + 1, B, A, generator=g, dtype=torch.float64)).requires_grad_(True)
    value = torch.randn(T + 1, B, generator=g, dtype=torch.float64).requires_grad_(True)
    target = logits.detach() + spread * torch.randn(T + 1, B, A, generator=g, dtype=torch.float64)
    done = torch.rand(T, B, generator=g) < 0.25
    truncated = done & (torch.rand(T, B, generator=g) < 0.5)
    batch = {
        "action": torch.randint(A, (T, B), generator=g),
        "reward": torch.randn(T, B, generator=g, dtype=torch.float64),
        "done": done,
        "trunc_value": torch.where(truncated, torch.randn(T, B, generator=g, dtype=torch.float64), 0.0),
        "behaviour_logits": spread * torch.randn(T, B, A, generator=g, dtype=torch.float64),
        "behaviour_value": torch.zeros(T, B, dtype=torch.float64),
        "replayed": torch.zeros(B, dtype=torch.bool),
    }
    return batch, SimpleNamespace(logits=logits, value=value), target


def log_softmax_at(logits_row, action):
    return logits_row[action] - torch.logsumexp(logits_row, 0)


def slow_impact(batch, out, target, w: ImpactLossWeights, truncate=True, clip=True, episode_ends=True):
    """The paper's objective, one step at a time. The switches turn one ingredient off: the
    negative controls."""
    T, B = batch["reward"].shape
    pg_terms, value_terms, entropies = [], [], []
    for b in range(B):
        V = out.value[:, b].detach()
        # Per-step quantities: rho = pi_tgt / mu, learner ratio, discount, reward.
        rho, ratio, disc, rew = [], [], [], []
        for t in range(T):
            a = int(batch["action"][t, b])
            lp_tgt = log_softmax_at(target[t, b], a)
            lp_mu = log_softmax_at(batch["behaviour_logits"][t, b], a)
            lp_pi = log_softmax_at(out.logits[t, b], a)
            rho.append(torch.exp(lp_tgt - lp_mu))
            ratio.append(torch.exp(lp_pi - lp_tgt))
            end = bool(batch["done"][t, b]) and episode_ends
            disc.append(0.0 if end else GAMMA)
            r = batch["reward"][t, b]
            rew.append(r + GAMMA * batch["trunc_value"][t, b] if end else r)
        # V-trace targets: v_s = V_s + d_s + disc_s c_s (v_{s+1} - V_{s+1}), v_T = V_T.
        vs = [None] * (T + 1)
        vs[T] = V[T]
        for s in reversed(range(T)):
            rho_bar = min(float(rho[s]), w.rho_const)
            c = min(float(rho[s]), w.c_const)
            delta = rho_bar * (rew[s] + disc[s] * V[s + 1] - V[s])
            vs[s] = V[s] + delta + disc[s] * c * (vs[s + 1] - V[s + 1])
        for s in range(T):
            advantage = min(float(rho[s]), w.rho_const) * (rew[s] + disc[s] * vs[s + 1] - V[s])
            weight = min(float(rho[s]), w.importance_weight_clip) if truncate else float(rho[s])
            clipped = ratio[s].clamp(1 - w.clip_param, 1 + w.clip_param) if clip else ratio[s]
            pg_terms.append(torch.minimum(weight * ratio[s] * advantage, weight * clipped * advantage))
            value_terms.append(0.5 * (vs[s] - out.value[s, b]) ** 2)
            p = torch.softmax(out.logits[s, b], 0)
            entropies.append(-(p * torch.log_softmax(out.logits[s, b], 0)).sum())
    n = T * B
    return -sum(pg_terms) / n + w.value * sum(value_terms) / n - w.entropy * sum(entropies) / n


WEIGHTS = ImpactLossWeights(gamma=GAMMA, value=0.5, entropy=0.01, clip_param=0.3, importance_weight_clip=2.0)


def loss_and_grads(fn):
    batch, out, target = make_case()
    loss = fn(batch, out, target)
    loss.backward()
    return float(loss.detach()), out.logits.grad.clone(), out.value.grad.clone()


def herd_loss(batch, out, target):
    return impact_loss(batch, out, target, WEIGHTS)[0]


def test_loss_and_gradients_match_the_papers_formula():
    """Catches any departure from the objective: V-trace from the target's ratios, the
    truncated weight, the clipped minimum, the value and entropy terms, their means."""
    loss, logits_grad, value_grad = loss_and_grads(herd_loss)
    ref_loss, ref_logits_grad, ref_value_grad = loss_and_grads(lambda *case: slow_impact(*case, WEIGHTS))
    assert loss == pytest.approx(ref_loss, rel=1e-9, abs=1e-12)
    torch.testing.assert_close(logits_grad, ref_logits_grad, rtol=1e-8, atol=1e-12)
    torch.testing.assert_close(value_grad, ref_value_grad, rtol=1e-8, atol=1e-12)


@pytest.mark.parametrize("dropped", ["truncate", "clip", "episode_ends"])
def test_the_comparison_tells_each_ingredient_apart(dropped):
    """Negative controls: the same case without truncation, without clipping or without
    episode ends gives another loss, so the match above is no accident of the case."""
    loss, _, _ = loss_and_grads(herd_loss)
    other, _, _ = loss_and_grads(lambda *case: slow_impact(*case, WEIGHTS, **{dropped: False}))
    assert abs(loss - other) > 1e-3


def test_clipped_steps_give_no_policy_gradient_where_the_clip_binds():
    """Catches a surrogate without the minimum: a step whose ratio is already past 1 + eps
    in the direction its advantage pushes must not pull further (zero policy gradient)."""
    batch, out, target = make_case(T=1, B=1, A=3, seed=3)
    with torch.no_grad():
        out.value.zero_()
        batch["done"][:] = True                   # advantage = reward (terminal, V = 0)
        batch["trunc_value"].zero_()
        batch["reward"][:] = 1.0                  # positive advantage
        a = int(batch["action"][0, 0])
        target[0, 0] = out.logits[0, 0].detach() - 3.0 * torch.nn.functional.one_hot(torch.tensor(a), 3)
    weights = ImpactLossWeights(gamma=GAMMA, value=0.0, entropy=0.0, clip_param=0.2)
    loss, metrics = impact_loss(batch, out, target, weights)
    loss.backward()
    assert float(metrics["mean_ratio"]) > 1.2 and float(metrics["clip_fraction"]) == 1.0
    assert out.logits.grad.abs().max() == 0
    # Control: the same step inside the clip range gets a gradient.
    batch, out, _ = make_case(T=1, B=1, A=3, seed=3)
    with torch.no_grad():
        batch["done"][:] = True
        batch["reward"][:] = 1.0
    loss, metrics = impact_loss(batch, out, out.logits.detach().clone(), weights)
    loss.backward()
    assert float(metrics["clip_fraction"]) == 0.0 and out.logits.grad.abs().max() > 0


def test_metrics_are_detached_zero_dim_tensors():
    """Catches a metric read to the host inside the update (float(), .item()): the loss
    contract says detached 0-dim tensors on the loss's device."""
    batch, out, target = make_case()
    _, metrics = impact_loss(batch, out, target, WEIGHTS)
    assert metrics and all(torch.is_tensor(v) and v.dim() == 0 and not v.requires_grad for v in metrics.values())


class TinyPolicy(torch.nn.Module):
    """Observations [T+1, B, 2] -> logits [T+1, B, 3], value [T+1, B]."""

    def __init__(self):
        super().__init__()
        self.policy = torch.nn.Linear(2, 3)
        self.value = torch.nn.Linear(2, 1)

    def forward(self, obs):
        return ModelOutput(self.policy(obs), self.value(obs).squeeze(-1), obs)


def tiny_batch(seed: int, T=4, B=2) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {"obs": torch.randn(T + 1, B, 2, generator=g), "action": torch.randint(3, (T, B), generator=g),
            "reward": torch.randn(T, B, generator=g), "done": torch.zeros(T, B, dtype=torch.bool),
            "trunc_value": torch.zeros(T, B), "behaviour_logits": torch.randn(T, B, 3, generator=g),
            "behaviour_value": torch.zeros(T, B), "replayed": torch.zeros(B, dtype=torch.bool)}


def train(model, loss_fn, optimizer, seeds):
    losses = []
    for seed in seeds:
        batch = tiny_batch(seed)
        loss, metrics = loss_fn(batch, model(batch["obs"]))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(float(metrics["loss"]))
    return losses


def same_weights(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))


def test_the_target_network_syncs_on_its_period_and_only_then():
    """Catches a target that follows the learner every update (no target at all) or never
    syncs: it equals the learner as it was before update k * period, and stays fixed between."""
    torch.manual_seed(0)
    model = TinyPolicy()
    loss_fn = ImpactLoss(model, WEIGHTS, target_update_period=3)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    snapshots = []
    for update in range(1, 8):
        before = copy.deepcopy(model)
        train(model, loss_fn, optimizer, [update])
        snapshots.append((update, before, copy.deepcopy(loss_fn.target)))
    for update, before, target in snapshots:
        if update == 1 or update % 3 == 0:            # the first update starts from the learner
            assert same_weights(target, before)       # the learner before this update's step
        else:
            assert not same_weights(target, before)
    # Between syncs the target does not move.
    assert same_weights(snapshots[3][2], snapshots[4][2]) and not same_weights(snapshots[2][2], snapshots[1][2])


def test_the_target_outputs_are_computed_once_per_stored_batch():
    """Catches a target network run on every pass over a batch the circular buffer serves
    K times (the paper computes its outputs once per batch), outputs recomputed after a
    target sync between passes, and a cache that serves one batch's outputs for another."""
    torch.manual_seed(0)
    model = TinyPolicy()
    loss_fn = ImpactLoss(model, WEIGHTS, target_update_period=2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    first_key, second_key = ((0, 0, 1),), ((0, 1, 1),)        # (replay, slot, generation)
    passes = [(first_key, 0), (first_key, 0), (second_key, 1), (first_key, 0), (second_key, 1), (None, 2)]
    ran, first_logits = [], None
    for index, (key, seed) in enumerate(passes):
        batch = tiny_batch(seed)
        out = model(batch["obs"])
        if index == 3:
            # After the sync at update 2 the target's own outputs have moved on; this pass
            # must still train against the outputs of batch 0's first pass.
            with torch.no_grad():
                assert not torch.allclose(loss_fn.target(batch["obs"]).logits, first_logits)
                expected, _ = impact_loss(batch, out, first_logits, WEIGHTS)
        loss_fn.expect_batch(key)
        before = loss_fn.target_passes
        loss, _ = loss_fn(batch, out)
        ran.append(loss_fn.target_passes - before)
        if index == 0:
            first_logits = loss_fn.target_cache[((0, 0),)][1].clone()
        if index == 3:
            assert float(loss) == pytest.approx(float(expected), abs=1e-6)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    assert ran == [1, 0, 1, 0, 0, 1]           # once per stored batch, and for the batch seen once


def test_the_kl_coefficient_adapts_both_ways():
    """Catches a fixed or wrongly signed adaptive KL coefficient (x1.5 above 2 x target,
    x0.5 below half of it), and a coefficient that forgets itself across calls."""
    torch.manual_seed(0)
    model = TinyPolicy()
    far = ImpactLoss(model, ImpactLossWeights(use_kl_loss=True, kl_target=1e-6), target_update_period=100)
    near = ImpactLoss(model, ImpactLossWeights(use_kl_loss=True, kl_target=10.0), target_update_period=100)
    with torch.no_grad():
        for loss_fn in (far, near):
            loss_fn(tiny_batch(0), model(tiny_batch(0)["obs"]))       # the first call syncs the target
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(5)))   # off the target
        for _ in range(2):
            far(tiny_batch(1), model(tiny_batch(1)["obs"]))
            near(tiny_batch(1), model(tiny_batch(1)["obs"]))
    # The first call's KL is 0 (target == learner): both halve once.
    assert float(far.kl_coeff) == pytest.approx(0.5 * 1.5 ** 2)
    assert float(near.kl_coeff) == pytest.approx(1.0 * 0.5 ** 3)


def test_a_resumed_loss_continues_exactly():
    """Catches a checkpoint without the target network, its update count or the KL
    coefficient: a run resumed from the loss's state_dict gives the same losses, bit for
    bit, as one that never stopped (the sync falls on the same update)."""
    weights = ImpactLossWeights(gamma=GAMMA, use_kl_loss=True)
    torch.manual_seed(0)
    model = TinyPolicy()
    loss_fn = ImpactLoss(model, weights, target_update_period=3)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.3)
    train(model, loss_fn, optimizer, range(4))
    saved = copy.deepcopy({"model": model.state_dict(), "loss": loss_fn.state_dict(),
                           "optimizer": optimizer.state_dict()})
    straight = train(model, loss_fn, optimizer, range(4, 9))

    torch.manual_seed(1)
    resumed_model = TinyPolicy()
    resumed_model.load_state_dict(saved["model"])
    resumed = ImpactLoss(resumed_model, weights, target_update_period=3)
    resumed.load_state_dict(saved["loss"])
    resumed_optimizer = torch.optim.SGD(resumed_model.parameters(), lr=0.3)
    resumed_optimizer.load_state_dict(saved["optimizer"])
    assert train(resumed_model, resumed, resumed_optimizer, range(4, 9)) == straight
    # Control: without the loss state the resumed run syncs at other updates and differs.
    torch.manual_seed(1)
    fresh_model = TinyPolicy()
    fresh_model.load_state_dict(saved["model"])
    fresh_optimizer = torch.optim.SGD(fresh_model.parameters(), lr=0.3)
    fresh_optimizer.load_state_dict(saved["optimizer"])
    assert train(fresh_model, ImpactLoss(fresh_model, weights, 3), fresh_optimizer, range(4, 9)) != straight
