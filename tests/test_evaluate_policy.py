"""Test mode's two ways to act: sampling from the policy (the default) or its argmax."""
import numpy as np
import torch

from herd.evaluate import act
from herd.models import ModelOutput


class FixedLogits(torch.nn.Module):
    """Every observation gets logits [1.0, 0.9, -5]: action 0 is the most probable, not certain."""

    action_distribution = "categorical"    # no herd Heads inside: declared (herd.models.base)

    def forward(self, obs):
        T, B = obs.shape[:2]
        logits = torch.tensor([1.0, 0.9, -5.0]).expand(T, B, 3)
        return ModelOutput(logits, torch.zeros(T, B), torch.zeros(T, B, 1))


def test_greedy_takes_the_most_probable_action_and_sampling_does_not_always():
    obs = np.zeros((500, 2), dtype=np.float32)
    torch.manual_seed(0)
    assert (act(FixedLogits(), obs, greedy=True) == 0).all()
    sampled = act(FixedLogits(), obs)
    share_of_1 = float(np.mean(sampled == 1))
    # softmax([1, .9, -5]) gives action 1 a probability of 0.475: 500 draws land far from 0.
    assert 0.38 < share_of_1 < 0.57
