"""Test mode's two ways to act: sampling from the policy (the default) or its argmax; how
the games are shared among the environments, and the progress bar."""
import io

import numpy as np
import torch

from herd.evaluation import ProgressBar, act, split_episodes
from herd.models import ModelOutput
from herd.models.base import DeclaredPolicy


class FixedLogits(torch.nn.Module, DeclaredPolicy):     # no herd Heads inside
    """Every observation gets logits [1.0, 0.9, -5]: action 0 is the most probable, not certain."""

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


def test_progress_bar_redraws_on_a_terminal_and_prints_lines_otherwise():
    class Terminal(io.StringIO):
        def isatty(self):
            return True

    log_file, terminal = io.StringIO(), Terminal()
    for stream in (log_file, terminal):
        bar = ProgressBar(4, stream)
        bar.last = 0.0                                     # as if the last line were long ago
        bar.update([10.0])
        bar.update([10.0, 20.0])                           # too soon after the previous line: skipped
        bar.update([10.0, 20.0, 30.0, 40.0], force=True)
    assert log_file.getvalue().count("\n") == 2 and "\r" not in log_file.getvalue()
    assert "1/4 episodes, mean 10.0" in log_file.getvalue() and "4/4 episodes, mean 25.0" in log_file.getvalue()
    assert terminal.getvalue().startswith("\r") and terminal.getvalue().count("\r") == 2
    assert terminal.getvalue().endswith("\n") and "2/4" not in terminal.getvalue()


def test_each_env_plays_a_fixed_share_of_the_games():
    assert split_episodes(100, 8) == [13, 13, 13, 13, 12, 12, 12, 12]
    assert split_episodes(3, 8) == [1, 1, 1]
    assert sum(split_episodes(1001, 7)) == 1001
