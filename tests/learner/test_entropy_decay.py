"""--entropy_decay: IMPALA's entropy bonus follows the learning rate's schedule
(herd/learner/optim.py PolynomialSchedule.follow, wired in herd/training.py make_learner)."""
from __future__ import annotations

import copy

import pytest
import torch

from herd.errors import UserError
from herd.learner.autotune import StepConfig, synthetic_batch
from herd.learner.optim import PolynomialSchedule
from herd.models import build_model
from herd.plan import prepare
from herd.training import make_learner

FP32 = StepConfig("fp32", None)


def test_a_follower_is_its_value_times_the_rates_decay():
    schedule = PolynomialSchedule(0.0006, 1e-5, 100)
    bonus = schedule.follow(0.001)
    where = bonus.data_ptr()
    assert float(bonus) == pytest.approx(0.001)
    for applied in [True] * 30 + [False] * 10 + [True] * 20:          # skipped updates do not count
        schedule.step(torch.tensor(applied))
        assert float(bonus) == pytest.approx(0.001 * float(schedule.lr) / 0.0006, rel=1e-6)
    end = 1e-5 / 0.0006
    assert float(bonus) == pytest.approx(0.001 * (end + (1 - end) * 0.5), rel=1e-6)    # 50 of 100 applied
    schedule.load_state_dict({"last_epoch": 100})                   # a resumed run: recomputed at once
    assert float(bonus) == pytest.approx(0.001 * end, rel=1e-6)
    assert bonus.data_ptr() == where                                # in place: what the loss holds


def cartpole_learner(tmp_path, **options):
    plan = prepare({"env": "CartPole-v1", "results_dir": str(tmp_path), "lr_scheduler_steps": "100",
                    **{k: str(v) for k, v in options.items()}})
    return plan


def test_the_learners_bonus_decays_with_its_rate(tmp_path):
    """Halfway through its schedule, a learner with the decay and a bonus of 0.5 takes the
    step of one without it whose bonus is 0.5 x the rate's decay there."""
    decayed = cartpole_learner(tmp_path / "a", entropy_decay=True, entropy_loss_weight=0.5)
    torch.manual_seed(0)
    model = build_model(**decayed.model_kwargs)
    batch = synthetic_batch(decayed.layout, 4)
    batch["reward"] = torch.randn(batch["reward"].shape, generator=torch.Generator().manual_seed(1))
    end = decayed.cfg.train.lr_end_value / decayed.cfg.train.lr
    factor = end + (1 - end) * 0.5

    def moved(plan) -> torch.Tensor:
        learner = make_learner(plan, copy.deepcopy(model), FP32)
        learner.scheduler.load_state_dict({"last_epoch": 50})
        before = torch.cat([p.detach().flatten() for p in learner.model.parameters()])
        learner.step(batch)
        return torch.cat([p.detach().flatten() for p in learner.model.parameters()]) - before

    with_decay = moved(decayed)
    constant_equal = moved(cartpole_learner(tmp_path / "b", entropy_decay=False, entropy_loss_weight=0.5 * factor))
    undecayed = moved(cartpole_learner(tmp_path / "c", entropy_decay=False, entropy_loss_weight=0.5))
    assert with_decay.norm() > 0
    torch.testing.assert_close(with_decay, constant_equal, rtol=1e-4, atol=1e-7)
    assert (with_decay - undecayed).abs().max() > 1e-5             # the bonus did change the step


def test_the_decay_is_impalas_and_off_unless_asked(tmp_path):
    assert cartpole_learner(tmp_path / "a").cfg.loss.entropy_decay is False
    with pytest.raises(UserError, match="--entropy_decay is IMPALA's"):
        cartpole_learner(tmp_path / "b", algorithm="appo", entropy_decay=True)
