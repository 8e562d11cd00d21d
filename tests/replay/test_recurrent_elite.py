"""Elite and attentive scoring with an LSTM model: a candidate's current-model features
come from unrolling it from its stored start state (herd/replay/recurrent.py), so
trajectories scored with the very model that made them are at distance 0."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from herd.models import CoreInput
from herd.models.core import CORE_STATE, state_from_rows
from herd.replay.distances import distance
from herd.replay.registry import build_replay
from herd.replay.spec import parse_replay_parameters
from recurrent_testing import E, LAYOUT, T, collect


def custom_replay(score_steps) -> object:
    spec = parse_replay_parameters(
        '[{"type": "custom", "capacity": 32, "sample_ratio": 1, "dist_function": "ln_norm", '
        f'"sample_strategy": "elite_sampling", "lambda_batch_multiplier": 2, "score_steps": {score_steps}}}]')[0]
    return build_replay(spec, LAYOUT, 4, E, compress=True)


@pytest.fixture(scope="module")
def filled():
    """(model, replay holding on-policy trajectories, score_steps 2)."""
    model, copies = collect(E)
    replay = custom_replay(2)
    for c in copies:
        for e in range(E):
            replay.add({name: view[:, e] for name, view in c.items()}, version=0)
    replay.attach_model(model, "cpu")
    return model, replay


def test_trajectories_scored_by_the_model_that_made_them_are_at_distance_zero(filled):
    model, replay = filled
    positions = np.arange(replay.available())
    distances = replay.sampler.scorer(positions, np.random.default_rng(0))
    assert distances.shape == (len(positions),) and float(np.max(distances)) < 1e-4
    # Without the stored start states (zeros instead) most trajectories look off-policy.
    saved = replay.storage.arrays[CORE_STATE].copy()
    replay.storage.arrays[CORE_STATE][:] = 0.0
    try:
        wrong = replay.sampler.scorer(positions, np.random.default_rng(0))
    finally:
        replay.storage.arrays[CORE_STATE][:] = saved
    assert np.count_nonzero(wrong > 1e-3) >= len(positions) // 2
    # A changed model moves every trajectory away.
    with torch.no_grad():
        model.heads.feature.weight.add_(0.1)
    try:
        assert float(np.min(replay.sampler.scorer(positions, np.random.default_rng(0)))) > 1e-3
    finally:
        with torch.no_grad():
            model.heads.feature.weight.sub_(0.1)
    positions_sampled, _ = replay.sampler.sample(4, np.random.default_rng(1))   # elite sampling runs
    assert len(positions_sampled) == 4


def test_attentive_scores_compare_each_candidate_with_the_anchors_unrolled_last_state(filled):
    model, replay = filled
    storage, anchor, positions = replay.storage, replay.sampler.newest, np.arange(5)
    got = replay.sampler.attentive_scorer(positions, anchor, np.random.default_rng(0))

    def features(position: int) -> torch.Tensor:                     # [T+1, F], unrolled by hand
        obs = storage.unpack_obs(position)[:, None].copy()
        done = storage.arrays["done"][:, position]
        reset = torch.from_numpy(np.concatenate([[False], done]))[:, None]
        start = state_from_rows(torch.from_numpy(storage.arrays[CORE_STATE][0, position:position + 1]))
        with torch.no_grad():
            return model(torch.from_numpy(obs), CoreInput(start, reset)).features[:, 0]

    steps = np.sort(np.random.default_rng(0).choice(T, size=2, replace=False))   # what the scorer drew
    candidates = torch.stack([features(p)[steps].mean(0) for p in positions])[None]   # [1, C, F]
    anchor_features = features(anchor)[T].expand_as(candidates)
    expected = distance("ln_norm", candidates, anchor_features).numpy()
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


def test_device_storage_scores_exactly_as_the_host_storage(filled):
    """The same trajectories in device storage (a GPU learner's; CPU tensors here): both
    recurrent scorers read obs, done, start states and features from device tensors and
    give the host storage's distances. Catches a device read_steps that gathers the wrong
    steps or positions, or a reset / start state built from the wrong rows."""
    model, replay = filled
    spec = parse_replay_parameters(
        '[{"type": "custom", "capacity": 32, "sample_ratio": 1, "dist_function": "ln_norm", '
        '"sample_strategy": "elite_sampling", "lambda_batch_multiplier": 2, "score_steps": 2}]')[0]
    device = build_replay(spec, LAYOUT, 4, E, storage_device=torch.device("cpu"))
    device.load_state_dict(replay.state_dict())
    device.attach_model(model, "cpu")
    positions = np.random.default_rng(2).permutation(replay.available())[:6]
    for seed in range(3):
        np.testing.assert_allclose(device.sampler.scorer(positions, np.random.default_rng(seed)),
                                   replay.sampler.scorer(positions, np.random.default_rng(seed)), rtol=1e-5, atol=1e-6)
        anchor = int(positions[seed])
        np.testing.assert_allclose(device.sampler.attentive_scorer(positions, anchor, np.random.default_rng(seed)),
                                   replay.sampler.attentive_scorer(positions, anchor, np.random.default_rng(seed)),
                                   rtol=1e-5, atol=1e-6)
