"""An optimizer step with finite loss and gradients can still overflow the weights (a
huge but finite --lr): the learner must keep the previous weights, never publish or save
non-finite ones, and count the update as skipped."""
import functools

import pytest
import torch

from impala_testing import impala_batch
from herd.learner.learner import Learner, build_optimizer, build_scheduler
from herd.losses.impala import ImpalaLossWeights, impala_loss
from herd.models import build_model

T, B, A, OBS = 5, 4, 3, (6,)


def make_learner(lr: float, optimizer: str = "adam") -> Learner:
    torch.manual_seed(0)
    model = build_model(network="mlp", obs_shape=OBS, obs_dtype="float32", num_actions=A, feature_size=8,
                        use_feature_layer=True, hidden_sizes=(16,))
    opt = build_optimizer(optimizer, model.parameters(), lr, 0.01)
    return Learner(model, opt, build_scheduler(opt, lr, 1e-5, 100),
                   functools.partial(impala_loss, weights=ImpalaLossWeights()), 40.0)


@pytest.mark.parametrize("optimizer,fused", [("rmsprop", False), ("adam", True), ("adam", False)],
                         ids=["rmsprop", "adam-fused", "adam-foreach"])
def test_an_update_that_overflows_the_weights_is_undone(optimizer, fused):
    # RMSprop's first step is lr * g / (0.1 |g|): 1e39, beyond float32, from a finite lr;
    # Adam's bound (about 320 lr) is beyond it too. Adam on a CPU runs aten's fused kernel
    # unless told otherwise (herd/learner/optim.py): both paths are checked.
    learner = make_learner(lr=1e38, optimizer=optimizer)
    if optimizer == "adam":
        learner.optimizer.fused_on_cpu = fused
    before = {k: v.clone() for k, v in learner.model.state_dict().items()}
    metrics = learner.step(impala_batch(T, B, A, OBS, seed=1)).metrics
    assert metrics["skipped"] == 1.0 and torch.isfinite(torch.tensor(metrics["grad_norm"]))
    after = learner.model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    # The optimizer's state holds no overflowed values that would poison later steps.
    for state in learner.optimizer.state.values():
        assert all(torch.isfinite(v).all() for v in state.values() if torch.is_tensor(v) and v.is_floating_point())
    assert learner.scheduler.last_epoch == 0     # a skipped update does not advance the schedule


def test_a_normal_update_is_kept():
    learner = make_learner(lr=1e-3)
    before = {k: v.clone() for k, v in learner.model.state_dict().items()}
    metrics = learner.step(impala_batch(T, B, A, OBS, seed=1)).metrics
    assert metrics["skipped"] == 0.0 and learner.scheduler.last_epoch == 1
    after = learner.model.state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before)
    assert all(torch.isfinite(v).all() for v in after.values())


def test_a_skipped_step_with_non_finite_gradients_changes_nothing():
    """Gradients holding NaN and inf (a loss that overflowed) with ok False: each optimizer
    leaves its weights and state bit for bit as they were, and its next step equals the
    step of a twin that never saw the bad one."""
    for name in ("rmsprop", "adam"):
        torch.manual_seed(0)
        weights = [torch.randn(3, 4), torch.randn(5)]
        twins = [[w.clone() for w in weights] for _ in range(2)]
        optimizers = [build_optimizer(name, params, 1e-2, 0.01) for params in twins]
        lr = torch.tensor(1e-2)

        def step(optimizer, params, grads, ok):
            for p, g in zip(params, grads):
                p.grad = g.clone()
            return optimizer.step(torch.tensor(ok), lr)

        good = [torch.randn(3, 4), torch.randn(5)]
        for optimizer, params in zip(optimizers, twins):
            step(optimizer, params, good, True)
        before = [p.clone() for p in twins[0]]
        state_before = {i: {k: v.clone() for k, v in s.items()} for i, s in enumerate(optimizers[0].state.values())}
        bad = [torch.full((3, 4), float("nan")), torch.tensor([1.0, float("inf"), -float("inf"), 2.0, 0.5])]
        assert not bool(step(optimizers[0], twins[0], bad, False)), name
        assert all(torch.equal(b, p) for b, p in zip(before, twins[0])), name
        for i, s in enumerate(optimizers[0].state.values()):
            assert all(torch.equal(state_before[i][k], v) for k, v in s.items()), (name, i)
        for optimizer, params in zip(optimizers, twins):
            step(optimizer, params, good, True)
        assert all(torch.equal(a, b) for a, b in zip(*twins)), name
