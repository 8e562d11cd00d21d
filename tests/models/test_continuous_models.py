"""The Gaussian policy head and the observation normaliser: shapes, the running statistics
against numpy over all the data, and their trip through weight publishing and a
checkpoint (plain tensors, weights_only loading)."""
import numpy as np
import pytest
import torch

from herd.checkpoint import load_checkpoint, save_checkpoint
from herd.models import action_distribution_of, build_model, observation_normalizer
from herd.models.gaussian import LOG_STD_MAX
from herd.weights import SharedWeights

D, A = 5, 3


def continuous_model(normalize=True, log_std=-0.5):
    torch.manual_seed(0)
    return build_model("auto", (D,), "float32", A, 16, hidden_sizes=(8,), action_distribution="gaussian",
                       initial_log_std=log_std, normalize_observations=normalize)


def test_gaussian_head_outputs_mean_and_a_state_independent_log_std():
    model = continuous_model(log_std=-0.7)
    out = model(torch.randn(4, 2, D))
    assert out.logits.shape == (4, 2, 2 * A) and out.value.shape == (4, 2) and out.features.shape == (4, 2, 16)
    mean, log_std = out.logits.chunk(2, -1)
    assert torch.allclose(log_std, torch.full_like(log_std, -0.7))
    assert mean.std() > 0 and action_distribution_of(model) == "gaussian"
    with torch.no_grad():
        model.heads.policy.log_std.fill_(50.0)
    assert float(model(torch.randn(1, 1, D)).logits.detach()[..., A:].max()) == LOG_STD_MAX     # kept in range


def test_discrete_models_are_unchanged_by_the_new_options():
    torch.manual_seed(0)
    plain = build_model("auto", (D,), "float32", 2, 16)
    assert action_distribution_of(plain) == "categorical" and observation_normalizer(plain) is None
    assert not any("obs_normalizer" in name or "log_std" in name for name in plain.state_dict())
    with pytest.raises(ValueError, match="vector observations"):
        build_model("nature_cnn", (4, 84, 84), "uint8", 6, None, action_distribution="gaussian")


def test_running_statistics_equal_numpy_over_all_batches():
    model = continuous_model()
    normalizer = observation_normalizer(model)
    rng = np.random.default_rng(0)
    batches = [rng.normal(3.0, 2.0, size=(17, 2, D)).astype(np.float32) * np.arange(1, D + 1) for _ in range(6)]
    for batch in batches:
        normalizer.update(batch)
    everything = np.concatenate([b.reshape(-1, D) for b in batches]).astype(np.float64)
    assert float(normalizer.count) == len(everything)
    np.testing.assert_allclose(normalizer.mean.numpy(), everything.mean(0), rtol=1e-5)
    np.testing.assert_allclose(normalizer.var.numpy(), everything.var(0), rtol=1e-4)
    normalised = normalizer(torch.from_numpy(everything).float()).numpy()
    np.testing.assert_allclose(normalised.mean(0), 0.0, atol=1e-4)
    np.testing.assert_allclose(normalised.std(0), 1.0, atol=1e-3)
    assert not any(p.requires_grad for p in normalizer.parameters())     # no loss moves them


def test_statistics_travel_with_the_weights_and_round_trip_a_checkpoint(tmp_path):
    learner = continuous_model()
    observation_normalizer(learner).update(np.random.default_rng(1).normal(5.0, 3.0, size=(64, D)))
    actor = continuous_model()
    weights = SharedWeights(continuous_model())
    weights.publish(learner)
    weights.pull(actor, have_version=0)
    for name in ("count", "mean", "var"):
        assert torch.equal(getattr(observation_normalizer(actor), name), getattr(observation_normalizer(learner), name))
    path = save_checkpoint({"model": learner.state_dict()}, tmp_path, update=3)
    state, _ = load_checkpoint(path)                                     # torch.load(weights_only=True)
    restored = continuous_model()
    restored.load_state_dict(state["model"])
    obs = torch.randn(2, 3, D) * 4 + 5
    torch.testing.assert_close(restored(obs).logits, learner(obs).logits, rtol=0, atol=0)
    assert float(observation_normalizer(restored).count) == 64
