"""Adam on a CPU learner steps through aten's fused kernel (herd/learner/optim.py
GuardedAdam._fused_cpu_step); elsewhere through the foreach kernels. Both are the same
optimizer: the same weights and state over many steps, skipped steps included, and a
state of another memory layout (a checkpoint of a channels-last learner) laid out as the
parameter before the kernel, which walks every tensor in memory order."""
from __future__ import annotations

import copy

import pytest
import torch

from herd.learner.optim import GuardedAdam


def twins(shapes, channels_last: bool = False):
    torch.manual_seed(0)
    weights = [torch.randn(shape) for shape in shapes]
    if channels_last:
        weights = [w.contiguous(memory_format=torch.channels_last) if w.dim() == 4 else w for w in weights]
    return [[w.clone() for w in weights] for _ in range(2)]


def adam_step(optimizer, params, grads, ok: bool, lr: torch.Tensor):
    """Gradients in their parameters' layouts, as autograd gives them."""
    for p, g in zip(params, grads):
        p.grad = torch.empty_like(p).copy_(g)
    return optimizer.step(torch.tensor(ok), lr)


SHAPES = [(8, 4, 3, 3), (8,), (16, 72), (16,), (3, 16)]


@pytest.mark.parametrize("channels_last", [False, True], ids=["contiguous", "channels-last"])
def test_the_fused_step_equals_the_foreach_step(channels_last):
    """60 steps, every 7th skipped with NaN and inf gradients: weights and state within
    float32 rounding of each other, and the skipped steps change neither."""
    fused_params, foreach_params = twins(SHAPES, channels_last)
    fused = GuardedAdam(fused_params, lr=1e-2)
    foreach = GuardedAdam(foreach_params, lr=1e-2, fused_on_cpu=False)
    lr = torch.tensor(1e-2)
    g = torch.Generator().manual_seed(1)
    calls = []
    original = torch._fused_adam_

    def recording(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    torch._fused_adam_ = recording
    try:
        for i in range(60):
            ok = i % 7 != 6
            grads = [torch.randn(shape, generator=g) for shape in SHAPES]
            if not ok:
                grads[0].fill_(float("nan"))
                grads[1][0] = float("inf")
            before = [p.clone() for p in fused_params]
            applied = [bool(adam_step(opt, params, grads, ok, lr))
                       for opt, params in ((fused, fused_params), (foreach, foreach_params))]
            assert applied == [ok, ok]
            if not ok:
                assert all(torch.equal(b, p) for b, p in zip(before, fused_params))
    finally:
        torch._fused_adam_ = original
    assert len(calls) == 60                  # the fused path ran (skipped steps return inside the kernel)
    for a, b in zip(fused_params, foreach_params):     # float32 rounding in another order, over 60 steps
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    for p, q in zip(fused_params, foreach_params):
        for name in ("exp_avg", "exp_avg_sq", "step"):
            torch.testing.assert_close(fused.state[p][name], foreach.state[q][name], rtol=1e-5, atol=1e-7)
    assert float(fused.state[fused_params[0]]["step"]) == 60 - 60 // 7


def test_a_state_of_another_layout_is_laid_out_as_its_parameter():
    """A contiguous state (an NCHW learner's checkpoint) loaded for a channels-last
    parameter: the next fused step equals the foreach step. Without the relayout the
    kernel would pair elements of different positions (checked: off by far more than
    rounding)."""
    fused_params, foreach_params = twins(SHAPES, channels_last=True)
    source = GuardedAdam([p.clone(memory_format=torch.contiguous_format) for p in fused_params], lr=1e-2)
    g = torch.Generator().manual_seed(2)
    grads = [torch.randn(shape, generator=g) for shape in SHAPES]
    lr = torch.tensor(1e-2)
    adam_step(source, source.param_groups[0]["params"], grads, True, lr)
    state = source.state_dict()
    assert state["state"][0]["exp_avg"].is_contiguous()
    fused = GuardedAdam(fused_params, lr=1e-2)
    foreach = GuardedAdam(foreach_params, lr=1e-2, fused_on_cpu=False)
    fused.load_state_dict(copy.deepcopy(state))     # loading shares the tensors: one copy each
    foreach.load_state_dict(copy.deepcopy(state))
    assert fused.state[fused_params[0]]["exp_avg"].stride() == fused_params[0].stride()
    adam_step(fused, fused_params, grads, True, lr)
    adam_step(foreach, foreach_params, grads, True, lr)
    for a, b in zip(fused_params, foreach_params):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_mismatched_layouts_in_the_kernel_would_be_wrong():
    """The negative control of the relayout: aten's fused kernel given a channels-last
    parameter and contiguous moments moves the weights differently from the same step in
    matching layouts, so the layout check is needed."""
    def step(moment_format):
        torch.manual_seed(0)
        p = torch.randn(8, 4, 3, 3).contiguous(memory_format=torch.channels_last)
        grad = torch.randn(8, 4, 3, 3).contiguous(memory_format=torch.channels_last)
        m = torch.randn(8, 4, 3, 3).contiguous(memory_format=moment_format)
        v = torch.rand(8, 4, 3, 3).contiguous(memory_format=moment_format)
        torch._fused_adam_([p], [grad], [m], [v], [], [torch.tensor(3.0)], lr=torch.tensor(0.1), beta1=0.9,
                           beta2=0.999, weight_decay=0.0, eps=1e-8, amsgrad=False, maximize=False)
        return p
    assert float((step(torch.channels_last) - step(torch.contiguous_format)).abs().max()) > 1e-2
