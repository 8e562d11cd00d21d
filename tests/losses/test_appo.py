"""APPO's arithmetic (herd/losses/appo.py) against a slow transcription of the formulas,
step by step in float64: V-trace with lambda over the target network's outputs, the
truncated importance weights, the batch-normalised advantages, the clipped surrogate and
the clipped value loss; with negative controls that show the comparison can tell lambda,
normalisation and both clippings apart. Then the loss's state: the target's syncs and an
exact resume."""
from __future__ import annotations

import copy

import pytest
import torch

from herd.losses.appo import AppoLoss, AppoLossWeights, appo_loss, stored_batch_targets
from herd.models import ModelOutput, build_model

GAMMA = 0.9


def make_case(T=6, B=3, A=4, seed=0, spread=1.5):
    """A stored batch with terminated and truncated steps, the target network's outputs over
    [T+1, B] and a learner's over [T, B] (leaves with gradients) whose ratios to the target
    leave [0.8, 1.2]."""
    g = torch.Generator().manual_seed(seed)
    f64 = dict(generator=g, dtype=torch.float64)
    target = ModelOutput(spread * torch.randn(T + 1, B, A, **f64), torch.randn(T + 1, B, **f64), None)
    logits = (target.logits[:T] + 0.5 * spread * torch.randn(T, B, A, **f64)).requires_grad_(True)
    value = (target.value[:T] + 0.5 * torch.randn(T, B, **f64)).requires_grad_(True)
    done = torch.rand(T, B, generator=g) < 0.25
    truncated = done & (torch.rand(T, B, generator=g) < 0.5)
    batch = {
        "action": torch.randint(A, (T, B), generator=g),
        "reward": torch.randn(T, B, **f64),
        "done": done,
        "trunc_value": torch.where(truncated, torch.randn(T, B, **f64), 0.0),
        "behaviour_logits": spread * torch.randn(T, B, A, **f64),
    }
    return batch, target, ModelOutput(logits, value, None)


def log_softmax_at(row, action):
    return row[action] - torch.logsumexp(row, 0)


def slow_targets(batch, target, w: AppoLossWeights, lam=None, normalize=None):
    """Per column, per step: rho = pi_old / mu, V-trace's recursion with c = lambda
    min(c-bar, rho), the advantage rho-bar (r + gamma vs' - V), then the batch's mean and
    (unbiased) std. Returns lists indexed [t][b]."""
    lam = w.vtrace_lambda if lam is None else lam
    normalize = w.normalize_advantages if normalize is None else normalize
    T, B = batch["reward"].shape
    adv = [[None] * B for _ in range(T)]
    vs_all = [[None] * B for _ in range(T)]
    weight = [[None] * B for _ in range(T)]
    for b in range(B):
        V = target.value[:, b]
        rho, disc, rew = [], [], []
        for t in range(T):
            a = int(batch["action"][t, b])
            rho.append(float(torch.exp(log_softmax_at(target.logits[t, b], a)
                                       - log_softmax_at(batch["behaviour_logits"][t, b], a))))
            end = bool(batch["done"][t, b])
            disc.append(0.0 if end else GAMMA)
            r = batch["reward"][t, b]
            rew.append(r + GAMMA * batch["trunc_value"][t, b] if end else r)
        vs = [None] * (T + 1)
        vs[T] = V[T]
        for s in reversed(range(T)):
            delta = min(rho[s], w.rho_const) * (rew[s] + disc[s] * V[s + 1] - V[s])
            vs[s] = V[s] + delta + disc[s] * lam * min(rho[s], w.c_const) * (vs[s + 1] - V[s + 1])
        for s in range(T):
            adv[s][b] = min(rho[s], w.rho_const) * (rew[s] + disc[s] * vs[s + 1] - V[s])
            vs_all[s][b] = vs[s]
            weight[s][b] = min(rho[s], w.importance_weight_clip)
    if normalize:
        flat = torch.stack([a for row in adv for a in row])
        mean, std = flat.mean(), flat.std()
        adv = [[(a - mean) / (std + 1e-8) for a in row] for row in adv]
    return adv, vs_all, weight


def slow_loss(batch, target, out, w: AppoLossWeights, clip=True, value_clip=None, **target_switches):
    T, B = batch["reward"].shape
    adv, vs, weight = slow_targets(batch, target, w, **target_switches)
    value_clip = w.value_clip if value_clip is None else value_clip
    pg, values, entropies = [], [], []
    for b in range(B):
        for t in range(T):
            a = int(batch["action"][t, b])
            ratio = torch.exp(log_softmax_at(out.logits[t, b], a) - log_softmax_at(target.logits[t, b], a))
            clipped = ratio.clamp(1 - w.clip_param, 1 + w.clip_param) if clip else ratio
            pg.append(torch.minimum(weight[t][b] * ratio * adv[t][b], weight[t][b] * clipped * adv[t][b]))
            error = (vs[t][b] - out.value[t, b]) ** 2
            if value_clip > 0:
                old = target.value[t, b]
                moved = old + (out.value[t, b] - old).clamp(-value_clip, value_clip)
                error = torch.maximum(error, (vs[t][b] - moved) ** 2)
            values.append(0.5 * error)
            p = torch.softmax(out.logits[t, b], 0)
            entropies.append(-(p * torch.log_softmax(out.logits[t, b], 0)).sum())
    return (-torch.stack(pg).mean() + w.value * torch.stack(values).mean()
            - w.entropy * torch.stack(entropies).mean())


def fast_loss(batch, target, out, w: AppoLossWeights):
    stored = {**batch, **stored_batch_targets(batch, target, w)}
    loss, metrics = appo_loss(stored, out, w)
    return loss, metrics


def grads(loss, out):
    return torch.autograd.grad(loss, (out.logits, out.value))


WEIGHTS = AppoLossWeights(gamma=GAMMA, value=0.5, entropy=0.01, vtrace_lambda=0.8, clip_param=0.2,
                          importance_weight_clip=1.5, normalize_advantages=True, value_clip=0.3)


@pytest.mark.parametrize("weights", [
    WEIGHTS,
    AppoLossWeights(gamma=GAMMA, vtrace_lambda=1.0, normalize_advantages=False, value_clip=0.0, clip_param=0.1),
    AppoLossWeights(gamma=GAMMA, vtrace_lambda=0.0, c_const=2.0, rho_const=2.0, clip_param=0.3),
], ids=["lambda-0.8-normalised-value-clip", "lambda-1-raw", "lambda-0"])
def test_the_loss_and_its_gradients_match_the_slow_transcription(weights):
    batch, target, out = make_case()
    fast, _ = fast_loss(batch, target, out, weights)
    slow = slow_loss(batch, target, out, weights)
    # The stored batch's targets are float32 (as a bf16 network's are made), the rest float64.
    torch.testing.assert_close(fast, slow, rtol=1e-6, atol=1e-7)
    for f, s in zip(grads(fast, out), grads(slow, out)):
        torch.testing.assert_close(f, s, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("switch", [dict(lam=1.0), dict(normalize=False), dict(clip=False), dict(value_clip=0.0)],
                         ids=["lambda", "normalisation", "surrogate-clip", "value-clip"])
def test_negative_controls_each_ingredient_changes_the_loss(switch):
    """The transcription with one ingredient left out is far from herd's loss: the
    comparison above would catch herd leaving it out."""
    batch, target, out = make_case()
    fast, _ = fast_loss(batch, target, out, WEIGHTS)
    changed = slow_loss(batch, target, out, WEIGHTS, **switch)
    assert (fast - changed).abs() > 1e-3


def test_the_advantages_are_normalised_over_the_stored_batch():
    batch, target, _ = make_case(T=8, B=5)
    advantage = stored_batch_targets(batch, target, WEIGHTS)["advantage"]
    assert abs(float(advantage.mean())) < 1e-6 and abs(float(advantage.std()) - 1) < 1e-5
    raw = stored_batch_targets(batch, target, AppoLossWeights(gamma=GAMMA, normalize_advantages=False))["advantage"]
    assert abs(float(raw.std()) - 1) > 0.05


def test_rewards_are_divided_by_the_return_scale_and_bootstraps_are_not():
    """With a return scale s, the targets are those of the rewards / s (truncation
    bootstraps are the network's values, already in its units): checked against the
    targets of a batch whose rewards were divided by hand."""
    batch, target, _ = make_case()
    w = AppoLossWeights(gamma=GAMMA, normalize_advantages=False)
    scaled = stored_batch_targets(batch, target, w, return_scale=4.0)
    by_hand = stored_batch_targets({**batch, "reward": batch["reward"] / 4.0}, target, w)
    torch.testing.assert_close(scaled["vs"], by_hand["vs"])
    unscaled = stored_batch_targets(batch, target, w)
    assert (scaled["vs"] - unscaled["vs"]).abs().max() > 1e-2


def tiny_model(seed=0):
    torch.manual_seed(seed)
    return build_model("mlp", (5,), "float32", 3, 8, hidden_sizes=(16,))


def test_the_target_syncs_every_period_batches_and_is_the_learner_after_a_sync():
    model = tiny_model()
    loss = AppoLoss(model, AppoLossWeights(), target_update_period=3)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)                       # loaded after the loss was built
    loss.begin_batch()
    assert all(torch.equal(a, b) for a, b in zip(loss.target.parameters(), model.parameters()))
    for updates in range(1, 11):
        with torch.no_grad():
            for p in model.parameters():
                p.add_(0.01)                  # the update
        loss.end_batch()
        loss.begin_batch()
        synced = all(torch.equal(a, b) for a, b in zip(loss.target.parameters(), model.parameters()))
        assert synced == (updates % 3 == 0)
        assert loss.target_syncs == updates // 3


def test_the_state_resumes_exactly():
    model = tiny_model()
    w = AppoLossWeights(use_kl_loss=True, normalize_returns=True)
    loss = AppoLoss(model, w, target_update_period=2, kl_coeff=0.7)
    loss.begin_batch()
    with torch.no_grad():
        loss.kl_coeff.mul_(1.5)
        loss.return_second_moment.fill_(3.0)
    loss.end_batch()
    state = copy.deepcopy(loss.state_dict())
    other = AppoLoss(tiny_model(seed=1), w, target_update_period=2)
    other.load_state_dict(state)
    assert other.stored_batches == 1 and other.target_syncs == 0
    assert float(other.kl_coeff) == pytest.approx(1.05) and float(other.return_scale) == pytest.approx(3 ** 0.5)
    assert all(torch.equal(a, b) for a, b in zip(other.target.parameters(), loss.target.parameters()))
