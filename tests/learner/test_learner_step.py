"""What one Learner.step does with the gradient, checked against the gradient computed
here by hand: clipping by the global norm (--gradient_clip_by_norm_threshold), the
grad_norm it reports, and torch.compile's fallback to the plain model."""
import copy
import functools
import logging

import pytest
import torch

from impala_testing import impala_batch
from herd.learner.learner import Learner, build_scheduler
from herd.learner.optim import GuardedSGD
from herd.losses.impala import ImpalaLossWeights, impala_loss
from herd.models import build_model

T, B, A = 5, 4, 3
LOSS = functools.partial(impala_loss, weights=ImpalaLossWeights())


def new_model():
    torch.manual_seed(0)
    return build_model("mlp", (4,), "float32", A, 8, hidden_sizes=(16,))


def sgd_learner(model, clip: float, **options) -> Learner:
    """Plain SGD at lr 1 with a constant schedule: a parameter moves by exactly -gradient."""
    opt = GuardedSGD(model.parameters(), lr=1.0)
    return Learner(model, opt, build_scheduler(opt, 1.0, 1.0, 1), LOSS, clip, **options)


def reference_gradient(model, batch) -> dict:
    """The loss's gradient [per parameter] for `model` on `batch`, with no learner involved."""
    twin = copy.deepcopy(model)
    out = twin(batch["obs"])
    loss, _ = LOSS(batch, type(out)(*(field.float() for field in out)))
    loss.backward()
    # A parameter the loss does not reach (the feature layer) has no gradient: it stays put.
    return {name: p.grad.clone() if p.grad is not None else torch.zeros_like(p) for name, p in twin.named_parameters()}


def moved(model, before: dict) -> dict:
    return {name: before[name] - p.detach() for name, p in model.named_parameters()}


@pytest.mark.parametrize("clip", [0.0, 0.05, 1e6])
def test_the_update_is_the_gradient_clipped_to_the_threshold_and_its_norm_is_reported(clip):
    """Catches clipping that is not applied (or applied per tensor, or when switched off
    with 0), and a grad_norm that reports the clipped norm or another norm than the
    gradient's global L2 norm before clipping."""
    model, batch = new_model(), impala_batch(T, B, A, seed=3)
    gradient = reference_gradient(model, batch)
    norm = float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in gradient.values()])))
    assert norm > 0.05                                       # the 0.05 case really clips
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    metrics = sgd_learner(model, clip).step(batch).metrics
    assert float(metrics["grad_norm"]) == pytest.approx(norm, rel=1e-4)
    scale = min(1.0, clip / norm) if clip > 0 else 1.0
    for name, step in moved(model, before).items():
        torch.testing.assert_close(step, scale * gradient[name], rtol=1e-4, atol=1e-7, msg=name)
    if clip == 0.05:                                          # the step itself has the threshold's norm
        total = torch.linalg.vector_norm(torch.cat([s.flatten() for s in moved(model, before).values()]))
        assert float(total) == pytest.approx(0.05, rel=1e-3)


def test_a_compile_that_fails_falls_back_to_the_plain_model_once(monkeypatch, caplog):
    """Catches a learner whose failing torch.compile ends the run, retries the compile at
    every update, or gives another update than the plain model: the compiled forward here
    raises as an inductor without a C compiler would."""
    calls = []

    def broken_compile(model, *args, **kwargs):
        def forward(*inputs):
            calls.append(1)
            raise RuntimeError("compiler not found\nmore detail")
        return forward
    monkeypatch.setattr(torch, "compile", broken_compile)
    batch = impala_batch(T, B, A, seed=4)
    plain, compiled = new_model(), new_model()
    expected = sgd_learner(plain, 40.0).step(batch).metrics
    learner = sgd_learner(compiled, 40.0, compile_model=True)
    with caplog.at_level(logging.WARNING, logger="herd"):
        metrics = learner.step(batch).metrics
        learner.step(batch)
    assert calls == [1], "the failing compiled forward was tried again"
    warnings = [r.getMessage() for r in caplog.records if "torch.compile failed" in r.getMessage()]
    assert warnings == ["torch.compile failed (RuntimeError: compiler not found): the learner runs uncompiled"]
    assert float(metrics["loss"]) == float(expected["loss"])
    second = sgd_learner(new_model(), 40.0)
    second.step(batch)
    second.step(batch)
    for (name, a), b in zip(compiled.named_parameters(), second.model.parameters()):
        assert torch.equal(a, b), name
