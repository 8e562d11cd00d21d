"""Test mode with an LSTM core (herd/evaluation.py): each game's state is carried from step to
step and zeroed where its episode ends, env by env."""
import torch

from herd.evaluation import play_episodes
from herd.models import ModelOutput
from herd.models.base import DeclaredPolicy
from herd.models.core import LSTMCore


class StepCounter(torch.nn.Module, DeclaredPolicy):     # no herd Heads inside
    """A recurrent stand-in whose state counts the steps since its last reset: the state it
    is given at a step says how many steps of the episode came before (0 at the first)."""

    def __init__(self):
        super().__init__()
        self.core = LSTMCore(1, 1)          # what marks a network as recurrent; its weights are unused
        self.seen: list[list[int]] = []     # per call: the step counts of its rows

    def unroll(self, obs, core):
        self.seen.append(core.state[0, 0, :, 0].round().int().tolist())
        T, B = obs.shape[:2]
        out = ModelOutput(torch.zeros(T, B, 2), torch.zeros(T, B), torch.zeros(T, B, 1))
        return out, core.state + 1.0


def test_each_game_starts_from_a_zero_state_and_carries_it_to_its_end():
    model = StepCounter()
    scores = play_episodes(model, "CartPole-v1", {}, episodes=3, num_envs=1, seed=3)
    counts = [row[0] for row in model.seen]
    # CartPole scores one point a step: the games were len(score) steps long, back to back.
    expected = [step for score in scores for step in range(int(score))]
    assert counts == expected and len(scores) == 3 and max(counts) > 0


def test_two_games_in_lockstep_keep_their_own_states():
    model = StepCounter()
    scores = play_episodes(model, "CartPole-v1", {}, episodes=4, num_envs=2, seed=5)
    assert len(scores) == 4
    # Row i of a call is env i while both play; every row's count is 0 or its previous + 1.
    previous = model.seen[0]
    assert previous == [0, 0]
    for row in model.seen[1:]:
        if len(row) == len(previous):
            assert all(now in (0, before + 1) for now, before in zip(row, previous))
        previous = row
    assert any(0 in row for row in model.seen[1:])          # an episode ended and the next began at 0
