"""The double-buffered actor (--actor_double_buffer) against the single-buffered one, both
served by a real inference server (in a thread) and stepping real CartPole environments.

The stated difference (herd/actors/double_buffer.py): the two make the same trajectories
(observations, actions, rewards, done flags exactly) and the same behaviour logits and
values up to the last bits, since a forward pass over half the rows rounds differently
from one over all of them."""
from __future__ import annotations

import numpy as np

from herd.actors.double_buffer import split
from herd.models import build_model
from herd.weights import SharedWeights
from served_actors import CONTEXT, MLP, RECORD, ROLLOUTS, trajectories


def test_double_buffered_trajectories_equal_the_single_buffered_ones():
    """Catches halves seeded or numbered unlike the single actor's environments, sampling
    uniforms drawn in another order (actions would differ), rows written to the wrong
    column or step, and slots delivered before both halves filled them."""
    weights = SharedWeights(build_model(**MLP), CONTEXT)
    single, double = trajectories(weights, double=False), trajectories(weights, double=True)
    assert len(single) == len(double) == ROLLOUTS
    actions = np.concatenate([r["action"].ravel() for r in single])
    assert 0.2 < actions.mean() < 0.8                    # a spread-out policy: the draws matter
    for a, b in zip(single, double):
        assert set(a) == set(b) == {"obs", "action", "reward", "done", "trunc_value", *RECORD}   # no features
        for name in ("obs", "action", "reward", "done", "trunc_value"):
            np.testing.assert_array_equal(a[name], b[name], err_msg=name)
        for name in RECORD:
            np.testing.assert_allclose(a[name], b[name], rtol=1e-5, atol=1e-6, err_msg=name)
        assert not np.isnan(b["behaviour_logits"]).any()      # every step written


def test_double_buffered_with_one_slot_ends_each_rollout_with_both_halves():
    """Synchronous sampling's one slot per actor: the half that finishes its part of a
    rollout first waits for the other half's delivery instead of asking for a second slot
    (the learner would give the one slot back only after that delivery: a deadlock), and
    the trajectories stay the single-buffered ones (the uniforms drawn in the same order)."""
    weights = SharedWeights(build_model(**MLP), CONTEXT)
    single = trajectories(weights, double=False, slots_per_actor=1)
    double = trajectories(weights, double=True, slots_per_actor=1)
    assert len(single) == len(double) == ROLLOUTS
    for a, b in zip(single, double):
        for name in ("obs", "action", "reward", "done", "trunc_value"):
            np.testing.assert_array_equal(a[name], b[name], err_msg=name)
        for name in RECORD:
            np.testing.assert_allclose(a[name], b[name], rtol=1e-5, atol=1e-6, err_msg=name)


def test_halves_cover_every_environment_once():
    for envs in range(2, 12):
        (first_a, count_a), (first_b, count_b) = split(envs)
        assert first_a == 0 and first_b == count_a and count_a + count_b == envs and count_a - count_b in (0, 1)
