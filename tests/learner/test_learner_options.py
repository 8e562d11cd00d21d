"""The learner's speed options change how it computes, not what: bf16 autocast follows
the float32 gradient, torch.compile gives the same update and the same checkpoint keys; and the shape of the
LR schedule."""
import copy
import functools

import pytest
import torch

from impala_testing import impala_batch
from herd.learner.learner import Learner, build_optimizer, build_scheduler
from herd.losses.impala import ImpalaLossWeights, impala_loss
from herd.models import build_model

T, B, A = 5, 4, 6


def learner(model, **options) -> Learner:
    optimizer = build_optimizer("rmsprop", model.parameters(), 0.0008, 0.01)
    return Learner(model, optimizer, build_scheduler(optimizer, 0.0008, 1e-5, 100), functools.partial(impala_loss, weights=ImpalaLossWeights()), 40.0, **options)


def gradient(l: Learner, data) -> torch.Tensor:
    before = copy.deepcopy(l.model.state_dict())
    l.step(data)
    after = l.model.state_dict()
    return torch.cat([(after[k] - before[k]).flatten() for k in before if after[k].is_floating_point()])


def test_bf16_update_follows_the_float32_update():
    torch.manual_seed(0)
    model = build_model("nature_cnn", (4, 84, 84), "uint8", A, None)
    data = impala_batch(T, B, A, (4, 84, 84), "uint8")
    fp32 = gradient(learner(copy.deepcopy(model)), data)
    bf16 = learner(copy.deepcopy(model), precision="bf16")
    step16 = gradient(bf16, data)
    assert torch.nn.functional.cosine_similarity(fp32, step16, dim=0) > 0.99
    assert 0.9 < step16.norm() / fp32.norm() < 1.1
    assert all(p.dtype == torch.float32 for p in bf16.model.parameters())   # weights stay float32


def test_compiled_learner_gives_the_same_update_and_plain_checkpoint_keys():
    torch.manual_seed(0)
    model = build_model("mlp", (4,), "float32", A, 8, hidden_sizes=(16,))
    data = impala_batch(T, B, A, (4,), "float32")
    eager, compiled = learner(copy.deepcopy(model)), learner(copy.deepcopy(model), compile_model=True)
    for _ in range(2):
        metrics_eager, metrics_compiled = eager.step(data).metrics, compiled.step(data).metrics
        assert abs(metrics_eager["loss"] - metrics_compiled["loss"]) < 1e-4
    for (name, a), (name_c, b) in zip(eager.model.state_dict().items(), compiled.model.state_dict().items()):
        assert name == name_c and torch.allclose(a, b, atol=1e-5)


@pytest.mark.parametrize("power, halfway", [(1.0, 0.5), (2.0, 0.25)])
def test_lr_decay_power(power, halfway):
    """lr_end + (lr - lr_end) * (1 - progress) ** power, then flat at lr_end."""
    optimizer = build_optimizer("rmsprop", [torch.nn.Parameter(torch.zeros(1))], 1.0, 0.01)
    scheduler = build_scheduler(optimizer, 1.0, 0.01, 100, power)
    lrs = []
    for _ in range(120):
        lrs.append(float(scheduler.lr))
        scheduler.step(torch.tensor(True))
        scheduler.step(torch.tensor(False))          # a skipped update does not advance the schedule
    assert lrs[0] == 1.0 and lrs[50] == pytest.approx(0.01 + 0.99 * halfway)
    assert lrs[100] == lrs[119] == pytest.approx(0.01)
    assert scheduler.last_epoch == 120
