"""Recurrent V-trace, end to end on real CartPole (velocities hidden): actors carry each
env's LSTM state across trajectories and store it at each trajectory's start; the
learner, unrolling from the stored states with resets after the done flags, recomputes
exactly the behaviour logits for an on-policy batch (the same weights): log rho = 0. This
is the check that recurrent V-trace learns from the policy that actually acted."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from herd.learner.learner import Learner, to_tensors
from herd.losses.impala import ImpalaLossWeights, vtrace_targets
from herd.models import CoreInput
from herd.models.core import CORE_STATE, core_input_from_batch, state_from_rows
from herd.replay.registry import build_replay
from herd.replay.spec import parse_replay_parameters
from recurrent_testing import E, LAYOUT, S, T, collect


@pytest.fixture(scope="module", params=[E, 2], ids=["sync", "async"])
def rollouts(request):
    return collect(request.param)


def unroll_final_state(model, data: dict, e: int) -> torch.Tensor:
    """Env e's state after step T-1 of a trajectory, from its stored start state: [2, L, 1, H]."""
    done = torch.from_numpy(data["done"][:, e:e + 1])
    reset = torch.cat([torch.zeros(1, 1, dtype=torch.bool), done[:-1]])
    start = state_from_rows(torch.from_numpy(data[CORE_STATE][0, e:e + 1]))
    with torch.no_grad():
        return model.unroll(torch.from_numpy(data["obs"][:T, e:e + 1]), CoreInput(start, reset))[1]


def test_actors_carry_the_state_across_trajectories_and_reset_it_at_episode_ends(rollouts):
    model, copies = rollouts
    assert np.count_nonzero(copies[0][CORE_STATE]) == 0            # every env starts from zero
    assert copies[0][CORE_STATE].shape == (1, E, 2, 1, S)
    carried = 0
    for before, after in zip(copies, copies[1:]):
        for e in range(E):
            expected = unroll_final_state(model, before, e)[:, :, 0]    # [2, L, H]
            if before["done"][T - 1, e]:
                expected = torch.zeros_like(expected)
            else:
                carried += 1
            torch.testing.assert_close(torch.from_numpy(after[CORE_STATE][0, e]), expected, rtol=1e-5, atol=1e-5)
    assert carried > 0


def test_learner_recomputes_the_behaviour_logits_of_an_on_policy_batch(rollouts):
    model, copies = rollouts
    batch = {name: np.concatenate([c[name] for c in copies], axis=1) for name in copies[0]}   # B = ROLLOUTS * E
    tensors = to_tensors(batch, np.zeros(batch["action"].shape[1], bool), torch.device("cpu"))
    assert tensors["done"].any(), "no episode ended inside a trajectory: the resets went untested"
    learner = Learner(model, None, None, None, grad_clip_norm=0.0)
    with torch.no_grad():
        out = learner.run_model(tensors["obs"], core_input_from_batch(tensors))           # [T+1, B, ...]
        torch.testing.assert_close(out.logits[:-1], tensors["behaviour_logits"], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(out.value[:-1], tensors["behaviour_value"], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(out.features[:-1], tensors["features"], rtol=1e-5, atol=1e-5)
        log_rhos = vtrace_targets(tensors, out, ImpalaLossWeights()).log_rhos
        assert float(log_rhos.abs().max()) < 1e-4
        # The check can fail: from zero states, or without the resets, the logits differ.
        zero = core_input_from_batch(tensors)._replace(state=torch.zeros_like(core_input_from_batch(tensors).state))
        assert not torch.allclose(learner.run_model(tensors["obs"], zero).logits[:-1], tensors["behaviour_logits"],
                                  atol=1e-4)
        no_reset = core_input_from_batch(tensors)._replace(reset=None)
        assert not torch.allclose(learner.run_model(tensors["obs"], no_reset).logits[:-1],
                                  tensors["behaviour_logits"], atol=1e-4)


def test_the_start_state_round_trips_through_a_replay_and_its_checkpoint_state(rollouts):
    _, copies = rollouts
    spec = parse_replay_parameters('[{"type": "standard", "capacity": 32, "sample_ratio": 1}]')[0]
    replay = build_replay(spec, LAYOUT, 4, E, compress=True)
    trajectories = [{name: view[:, e] for name, view in c.items()} for c in copies for e in range(E)]
    for trajectory in trajectories:
        replay.add(trajectory, version=0)
    restored = build_replay(spec, LAYOUT, 4, E, compress=False)
    restored.load_state_dict(replay.state_dict())
    for source in (replay, restored):
        data, _, keys, _ = source.sample(8, np.random.default_rng(0))
        assert data[CORE_STATE].shape == (1, 8, 2, 1, S)
        for column, position in enumerate(keys.positions):
            original = trajectories[position]
            np.testing.assert_array_equal(data[CORE_STATE][0, column], original[CORE_STATE][0])
            np.testing.assert_array_equal(data["obs"][:, column], original["obs"])
