"""network "constant" (herd/models/constant.py): one learnt policy and value for every
observation, no network to compute; what it does not take is refused in one line."""
import pytest
import torch

from herd.models import ConstantPolicy, action_distribution_of, build_model


def test_the_same_outputs_for_every_observation_and_its_two_parameters_learn():
    model = build_model("constant", (4, 84, 84), "uint8", 6, None)
    assert isinstance(model, ConstantPolicy) and action_distribution_of(model) == "categorical"
    out = model(torch.randint(0, 256, (3, 5, 4, 84, 84), dtype=torch.uint8))
    assert out.logits.shape == (3, 5, 6) and out.value.shape == (3, 5) and out.features.shape == (3, 5, 1)
    assert torch.equal(out.logits, torch.zeros(3, 5, 6))                     # uniform at the start
    other = model(torch.zeros((3, 5, 4, 84, 84), dtype=torch.uint8))
    assert torch.equal(out.logits, other.logits) and torch.equal(out.value, other.value)
    # A gradient step moves the policy towards an action: a loss reaches its parameters.
    loss = -torch.log_softmax(out.logits, -1)[..., 2].mean() + out.value.square().mean()
    loss.backward()
    assert model.logits.grad[2] < 0 and sum(p.numel() for p in model.parameters()) == 7


@pytest.mark.parametrize("option", [dict(lstm_size=8), dict(head="dueling_q"),
                                    dict(action_distribution="gaussian"), dict(normalize_observations=True)])
def test_what_the_constant_policy_cannot_use_is_refused(option):
    with pytest.raises(ValueError, match=f"network constant .* takes no {next(iter(option))}"):
        build_model("constant", (4,), "float32", 2, None, **option)


def test_on_atari_the_constant_policy_runs_without_the_frame_normaliser():
    from herd.config import resolve
    from herd_testing import kind_of
    assert resolve({"env": "PongNoFrameskip-v4", "network": "constant"}, env_kind=kind_of).continuous \
        .normalize_observations is False
    assert resolve({"env": "PongNoFrameskip-v4"}, env_kind=kind_of).continuous.normalize_observations is True
