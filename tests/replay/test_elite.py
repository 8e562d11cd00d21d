"""Elite and attentive replay (the `custom` type): distances, the four strategies, elite
insertion, annealing, the model scorers and checkpoint round trips, on hand-built buffers
whose right answer is known."""
import json
import math

import numpy as np
import pytest
import torch

from herd.replay.spec import parse_replay_parameters
from herd.models import MLPNet
from herd.replay.distances import cos_dist, distance, kl_div, ln_norm
from herd.replay.elite import EliteSampler, choose
from herd.replay.registry import build_replay
from herd.algos.impala import impala_layout

T, F = 3, 4
LAYOUT = impala_layout(unroll_length=T, obs_shape=(2,), obs_dtype="float32", num_actions=2, feature_size=F)
# position -> distance; ascending order of positions by distance: 3 5 1 7 0 6 4 2
DIST = np.array([5.0, 3.0, 8.0, 1.0, 7.0, 2.0, 6.0, 4.0])


def filled_sampler(capacity=8, **kwargs) -> EliteSampler:
    """A sampler holding `capacity` trajectories, scored by DIST (fake scorer)."""
    kwargs = {"sample_strategy": "elite_sampling", "lambda_batch_multiplier": 10, "anneal_rounds": 10_000, **kwargs}
    sampler = EliteSampler(capacity, **kwargs)
    sampler.set_scorer(lambda positions, rng: DIST[positions])
    for _ in range(capacity):
        sampler.add()
    return sampler


def draw(sampler: EliteSampler, n: int, seed: int = 0) -> set:
    return set(int(p) for p in sampler.sample(n, np.random.default_rng(seed))[0])


def tiny_model() -> MLPNet:
    torch.manual_seed(0)
    return MLPNet(obs_dim=2, num_actions=2, hidden_sizes=(4,), feature_size=F)


def custom_replay(capacity: int, **options):
    entry = {"type": "custom", "capacity": capacity, "sample_ratio": 1, "dist_function": "ln_norm", **options}
    return build_replay(parse_replay_parameters(json.dumps([entry]))[0], LAYOUT, share=1, rollout_size=1)


def trajectory(obs: np.ndarray, features: np.ndarray) -> dict:
    """obs [T+1, 2], features [T, F]; the other fields are filler."""
    out = {name: np.zeros(shape, dtype=dtype) for name, (shape, dtype) in LAYOUT.fields().items()}
    out["obs"], out["features"] = obs.astype(np.float32), features.astype(np.float32)
    return out


def own_features(model, obs: np.ndarray) -> np.ndarray:
    """The model's features of obs[:-1]: [T, F]."""
    with torch.no_grad():
        return model(torch.from_numpy(obs[:-1, None].astype(np.float32))).features[:, 0].numpy()


# -- distances ---------------------------------------------------------------------------

def test_cos_dist_is_zero_for_one_direction_and_two_for_opposite():
    current = torch.tensor([[[1.0, 2.0], [1.0, 0.0]]])          # [T=1, C=2, F=2]
    stored = torch.tensor([[[2.0, 4.0], [-3.0, 0.0]]])
    assert torch.allclose(cos_dist(current, stored), torch.tensor([0.0, 2.0]), atol=1e-6)


def test_ln_norm_p1_p2_and_mean_over_steps():
    current = torch.tensor([[[3.0, 4.0]], [[1.0, 0.0]]])        # [T=2, C=1, F=2]
    stored = torch.zeros(2, 1, 2)
    assert ln_norm(current, stored).item() == pytest.approx((5 + 1) / 2)
    assert ln_norm(current, stored, p=1).item() == pytest.approx((7 + 1) / 2)
    assert distance("ln_norm", current, stored, p=1).item() == pytest.approx(4.0)


def test_kl_div_zero_for_equal_and_known_value():
    x = torch.randn(3, 5, 4)
    assert torch.allclose(kl_div(x, x.clone()), torch.zeros(5), atol=1e-6)
    # behaviour softmax [0.5, 0.5], current softmax [0.75, 0.25]
    stored, current = torch.zeros(1, 1, 2), torch.tensor([[[math.log(3.0), 0.0]]])
    assert kl_div(current, stored).item() == pytest.approx(0.5 * math.log(4 / 3), rel=1e-5)
    with pytest.raises(ValueError, match="unknown dist_function"):
        distance("l2", x, x)


# -- strategies (fake scorer; lambda large enough that every position is a candidate) -----

def test_strategy1_takes_the_lowest_distances():
    sampler = filled_sampler(elite_sampling_strategy="strategy1")
    assert draw(sampler, 3) == {3, 5, 1}
    assert draw(sampler, 3, seed=1) == {3, 5, 1}            # the candidate order does not matter
    assert sampler.counts[[3, 5, 1]].tolist() == [2, 2, 2] and sampler.counts.sum() == 6


def test_strategy2_takes_the_first_of_each_distance_group():
    sampler = filled_sampler(elite_sampling_strategy="strategy2")
    assert draw(sampler, 3) == {3, 7, 4}                     # groups [3 5 1] [7 0 6] [4 2]


def test_strategy3_prefers_the_least_sampled():
    sampler = filled_sampler(elite_sampling_strategy="strategy3")
    assert draw(sampler, 3) == {3, 5, 1}                     # all unsampled: lowest distances
    assert draw(sampler, 3) == {7, 0, 6}                     # the next unsampled ones
    assert draw(sampler, 3) == {4, 2, 3}                     # 2 unsampled left, then distance


def test_strategy4_prefers_the_least_sampled_within_groups():
    sampler = filled_sampler(elite_sampling_strategy="strategy4")
    assert draw(sampler, 3) == {3, 7, 4}
    assert draw(sampler, 3) == {5, 0, 2}
    assert draw(sampler, 3) == {1, 6, 4}                     # last group all sampled once: distance


@pytest.mark.parametrize("sample_strategy,strategy", [("elite_sampling", "strategy1"),
                                                      ("elite_sampling", "strategy2"),
                                                      ("attentive_sampling", "strategy1")])
def test_while_annealing_the_sampler_picks_what_uniform_would_not_and_then_samples_uniformly(sample_strategy,
                                                                                           strategy):
    """Catches a sampler that falls back to uniform draws while its multiplier is above 1
    (scoring skipped, the strategy ignored) and one that keeps scoring after annealing."""
    sampler = filled_sampler(sample_strategy=sample_strategy, elite_sampling_strategy=strategy,
                             lambda_batch_multiplier=4, anneal_rounds=60)
    sampler.set_attentive_scorer(lambda positions, anchor, rng: DIST[positions])
    uniform = filled_sampler(sample_strategy=None)
    rng, uniform_rng = np.random.default_rng(0), np.random.default_rng(0)
    during, after, uniform_picks, rounds_during = np.zeros(8), np.zeros(8), np.zeros(8), 0
    for _ in range(120):
        annealing = sampler.current_multiplier() >= 2
        picks = sampler.sample(2, rng)[0]
        np.add.at(during if annealing else after, picks, 1)
        rounds_during += annealing
        np.add.at(uniform_picks, uniform.sample(2, uniform_rng)[0], 1)
    assert rounds_during >= 40
    # 4 to 8 candidates for 2 picks: the farthest (position 2) is never among those taken,
    # the nearest (3) is taken whenever it is a candidate (at least half the rounds).
    assert during[2] == 0 and uniform_picks[2] >= 15
    assert during[3] >= 0.5 * rounds_during > 2 * rounds_during / 8
    # Multiplier 1: every candidate is taken, the farthest too, about as often as uniformly.
    assert after[2] >= 0.5 * after.sum() / 8


def test_nan_distance_is_never_preferred():
    assert choose(np.array([np.nan, 2.0, 1.0]), np.zeros(3, dtype=np.int64), 2, "strategy1").tolist() == [2, 1]


def test_inserting_resets_the_counter():
    sampler = filled_sampler(elite_sampling_strategy="strategy1")
    sampler.counts[:] = 5                                      # every stored trajectory was sampled
    position = sampler.add()
    assert sampler.counts[position] == 0 and sampler.newest == position
    assert (np.delete(sampler.counts, position) == 5).all()


# -- insertion -----------------------------------------------------------------------------

def test_elite_insertion_fills_in_order_then_evicts_the_farthest():
    calls = []
    sampler = EliteSampler(4, insert_strategy="elite_insertion", elite_batch_size=4)
    sampler.set_scorer(lambda positions, rng: (calls.append(positions), np.array([1.0, 9.0, 3.0, 2.0])[positions])[1])
    order = []
    for _ in range(4):
        order.append(sampler.add())
    assert order == [0, 1, 2, 3] and not calls                 # no scoring while filling
    assert sampler.add() == 1                                  # the most off-policy, not the oldest (0)


def test_ring_insertion_without_strategy():
    sampler = EliteSampler(3)
    order = []
    for _ in range(5):
        order.append(sampler.add())
    assert order == [0, 1, 2, 0, 1] and sampler.stored() == 3
    assert sorted(draw(sampler, 3)) == [0, 1, 2]              # uniform, without replacement
    assert sampler.counts.tolist() == [1, 1, 1]


# -- annealing -----------------------------------------------------------------------------

def test_multiplier_anneals_linearly_to_one():
    sampler = filled_sampler(capacity=4, sample_strategy=None, lambda_batch_multiplier=6, anneal_rounds=100)
    rng = np.random.default_rng(0)
    seen = []
    for _ in range(150):
        seen.append(sampler.current_multiplier())
        sampler.sample(2, rng)
    assert seen[0] == 6 and seen[100] == 1 and set(seen[100:]) == {1}
    assert all(isinstance(m, int) and m >= 1 for m in seen)
    assert all(a >= b for a, b in zip(seen, seen[1:])) and set(seen) == {1, 2, 3, 4, 5, 6}


def test_build_replay_reads_the_custom_keys():
    spec = parse_replay_parameters('[{"type": "custom", "capacity": 7, "sample_ratio": 1, "dist_function": '
                                   '"cos_dist", "alfa_annealing_factor": 0.5, "lambda_batch_multiplier": 3}]')[0]
    replay = build_replay(spec, LAYOUT, share=1, rollout_size=1, anneal_rounds_base=200)
    sampler = replay.sampler
    assert replay.name == "custom" and not replay.on_policy and replay.storage.capacity == 7
    assert sampler.anneal_rounds == 100 and sampler.current_multiplier() == 3
    assert (sampler.elite_sampling_strategy, sampler.elite_batch_size, sampler.p) == ("strategy3", 20, 2)
    assert sampler.dist_function == "cos_dist" and sampler.sample_strategy is None


# -- the model scorers -------------------------------------------------------------------

@pytest.mark.parametrize("dist_function", ["ln_norm", "cos_dist", "kl_div"])
def test_scorer_finds_the_trajectory_the_model_itself_made(dist_function):
    model = tiny_model().train()
    replay = custom_replay(6, dist_function=dist_function, sample_strategy="elite_sampling",
                           elite_sampling_strategy="strategy1", lambda_batch_multiplier=6)
    replay.attach_model(model, "cpu")
    rng = np.random.default_rng(0)
    for position in range(6):
        obs = rng.normal(size=(T + 1, 2))
        features = own_features(model, obs) if position == 4 else rng.normal(size=(T, F))
        replay.add(trajectory(obs, features), version=position)
    scored = replay.sampler.scorer(np.arange(6), rng)
    assert scored.shape == (6,) and scored[4] == pytest.approx(0.0, abs=1e-5) and np.all(scored[np.arange(6) != 4] > 1e-3)
    data, versions, _, _ = replay.sample(1, rng)
    assert versions.tolist() == [4] and data["obs"].shape == (T + 1, 1, 2)
    assert model.training and torch.is_grad_enabled()          # mode and autograd untouched


def test_attentive_ranks_by_closeness_to_the_newest_last_state():
    model = tiny_model()
    replay = custom_replay(5, sample_strategy="attentive_sampling", elite_sampling_strategy="strategy1",
                           lambda_batch_multiplier=5)
    replay.attach_model(model, "cpu")
    rng = np.random.default_rng(1)
    anchor = np.array([0.3, -0.7])
    for position in range(5):
        obs = rng.normal(size=(T + 1, 2)) * 3
        if position == 2:
            obs[:] = anchor                    # every step equals the anchor state
        if position == 4:
            obs[-1] = anchor                   # the newest: its last state is the anchor
        replay.add(trajectory(obs, rng.normal(size=(T, F))), version=position)
    assert replay.sampler.newest == 4
    scored = replay.sampler.attentive_scorer(np.arange(5), 4, rng)
    assert scored[2] == pytest.approx(0.0, abs=1e-5) and int(np.argmin(scored)) == 2
    _, versions, _, _ = replay.sample(1, rng)
    assert versions.tolist() == [2]


def test_attentive_sampler_passes_the_newest_as_anchor():
    seen = []
    sampler = EliteSampler(6, sample_strategy="attentive_sampling", elite_sampling_strategy="strategy1",
                           lambda_batch_multiplier=6)
    sampler.set_attentive_scorer(lambda positions, anchor, rng: (seen.append(anchor), DIST[positions])[1])
    for _ in range(6):
        sampler.add()
    assert draw(sampler, 2) == {3, 5} and seen == [5]


def test_strategies_without_a_model_fail_clearly():
    sampler = EliteSampler(4, sample_strategy="elite_sampling", lambda_batch_multiplier=4)
    for _ in range(4):
        sampler.add()
    with pytest.raises(RuntimeError, match="attach_model"):
        sampler.sample(2, np.random.default_rng(0))


def test_state_dict_round_trip_reproduces_samples():
    def build():
        replay = custom_replay(5, sample_strategy="elite_sampling", insert_strategy="elite_insertion",
                               elite_batch_size=3, lambda_batch_multiplier=3)
        replay.attach_model(tiny_model(), "cpu")
        return replay

    def run(replay, rng, data_rng):
        out = []
        for _ in range(4):
            replay.add(trajectory(data_rng.normal(size=(T + 1, 2)), data_rng.normal(size=(T, F))), version=9)
            out.append(replay.sampler.sample(2, rng)[0].tolist())
        return out, replay.sampler.counts.tolist()

    replay, rng, data_rng = build(), np.random.default_rng(3), np.random.default_rng(4)
    for _ in range(7):  # past capacity: elite insertion already used its own rng
        replay.add(trajectory(data_rng.normal(size=(T + 1, 2)), data_rng.normal(size=(T, F))), version=1)
        replay.sampler.sample(2, rng)
    state, rng_state, data_state = replay.state_dict(), rng.bit_generator.state, data_rng.bit_generator.state
    expected = run(replay, rng, data_rng)

    restored = build()
    restored.load_state_dict(state)
    rng.bit_generator.state, data_rng.bit_generator.state = rng_state, data_state
    assert run(restored, rng, data_rng) == expected
    assert restored.sampler.rounds == replay.sampler.rounds == 11


# -- cost controls: one scored set serves several insertions; a few steps per candidate ----

def test_one_scored_set_serves_half_its_size_of_insertions_farthest_first():
    calls = []
    distances = np.array([5.0, 3.0, 8.0, 1.0, 7.0, 2.0, 6.0, 4.0])
    sampler = EliteSampler(8, insert_strategy="elite_insertion", elite_batch_size=8)
    sampler.set_scorer(lambda positions, rng: (calls.append(1), distances[positions])[1])
    for _ in range(8):
        sampler.add()
    evicted = [sampler.insert_position() for _ in range(4)]
    assert evicted == [2, 4, 6, 0] and len(calls) == 1      # farthest first, one forward pass for four
    sampler.insert_position()
    assert len(calls) == 2                                  # half the set used: scored afresh
    sampler.sample(2, np.random.default_rng(0))             # uniform sampling: no scorer call
    sampler.insert_position()
    assert len(calls) == 3                                  # after a sample the model has changed


def test_storage_reads_chosen_steps_with_and_without_compression():
    from herd.store import TrajectoryStore
    rng = np.random.default_rng(0)
    for compress in (False, True):
        storage = TrajectoryStore(LAYOUT, capacity=4, compress_obs=compress)
        for position in range(4):
            storage.write(position, trajectory(rng.normal(size=(T + 1, 2)), rng.normal(size=(T, F))), version=0)
        positions, steps = np.array([3, 1]), np.array([0, 2])
        full = storage.read(positions)
        part = storage.read_steps(positions, steps, ("obs", "features"))
        assert part["obs"].shape == (2, 2, 2) and part["features"].shape == (2, 2, F)
        assert np.array_equal(part["obs"], full["obs"][steps]) and np.array_equal(part["features"], full["features"][steps])


def test_score_steps_gives_an_unbiased_estimate_of_the_mean_over_steps():
    """Stored features match the model's own at every step but the last, where they are
    off by 3 in one coordinate: the all-steps distance is 3/T. Scoring one random step per
    round gives 0 or 3, and averages to 3/T."""
    model = tiny_model()
    obs = np.random.default_rng(2).normal(size=(T + 1, 2))
    features = own_features(model, obs)
    features[T - 1, 0] += 3.0
    values = {}
    for steps in (1, "all"):
        replay = custom_replay(2, sample_strategy="elite_sampling", lambda_batch_multiplier=2, score_steps=steps)
        replay.attach_model(model, "cpu")
        replay.add(trajectory(obs, features), version=0)
        rng = np.random.default_rng(5)
        values[steps] = np.array([replay.sampler.scorer(np.array([0]), rng)[0] for _ in range(600)])
    assert np.allclose(values["all"], 3.0 / T, atol=1e-5)
    one = values[1]
    assert np.all(np.isclose(one, 0.0, atol=1e-5) | np.isclose(one, 3.0, atol=1e-5))
    assert one.mean() == pytest.approx(3.0 / T, rel=0.2)


def test_score_steps_must_be_a_positive_integer_or_all():
    from herd.config import ConfigError
    base = {"type": "custom", "capacity": 5, "sample_ratio": 1, "dist_function": "ln_norm"}
    for bad in (0, -1, 1.5, "some", True):
        with pytest.raises(ConfigError, match="score_steps"):
            parse_replay_parameters(json.dumps([{**base, "score_steps": bad}]))
    assert parse_replay_parameters(json.dumps([{**base, "score_steps": "all"}]))[0].option("score_steps") == "all"
    replay = build_replay(parse_replay_parameters(json.dumps([{**base, "score_steps": "all"}]))[0], LAYOUT, 1, 1)
    assert replay.sampler.score_steps is None


# -- continuous actions: kl_div compares the Gaussian policies ----------------------------

GAUSSIAN_LAYOUT = impala_layout(unroll_length=T, obs_shape=(2,), obs_dtype="float32", num_actions=2, feature_size=F,
                                action_distribution="gaussian")


# storage_device: a GPU learner's storage (device tensors; here CPU ones): scoring reads it the same way.
@pytest.mark.parametrize("storage_device", [None, torch.device("cpu")], ids=["host-storage", "device-storage"])
def test_gaussian_kl_div_scores_by_the_policies_kl_and_finds_the_models_own_trajectory(storage_device):
    torch.manual_seed(0)
    model = MLPNet(obs_dim=2, num_actions=2, hidden_sizes=(4,), feature_size=F, action_distribution="gaussian")
    entry = {"type": "custom", "capacity": 5, "sample_ratio": 1, "dist_function": "kl_div",
             "sample_strategy": "elite_sampling", "elite_sampling_strategy": "strategy1", "lambda_batch_multiplier": 5,
             "score_steps": "all"}
    replay = build_replay(parse_replay_parameters(json.dumps([entry]))[0], GAUSSIAN_LAYOUT, share=1, rollout_size=1,
                          storage_device=storage_device)
    replay.attach_model(model, "cpu")
    rng = np.random.default_rng(0)
    stored = []
    for position in range(5):
        obs = rng.normal(size=(T + 1, 2)).astype(np.float32)
        with torch.no_grad():
            own = model(torch.from_numpy(obs[:-1, None])).logits[:, 0].numpy()          # [T, 4]: mean, log_std
        params = own if position == 2 else own + rng.normal(0, 0.5, size=own.shape).astype(np.float32)
        data = {name: np.zeros(shape, dtype=dtype) for name, (shape, dtype) in GAUSSIAN_LAYOUT.fields().items()}
        data["obs"], data["behaviour_mean"], data["behaviour_log_std"] = obs, params[:, :2], params[:, 2:]
        replay.add(data, version=position)
        stored.append((obs, params))
    scored = replay.sampler.scorer(np.arange(5), rng)
    assert scored[2] == pytest.approx(0.0, abs=1e-6) and np.all(scored[np.arange(5) != 2] > 1e-3)
    obs, params = stored[0]                      # the score is the closed-form KL(behaviour || current)
    with torch.no_grad():
        current = model(torch.from_numpy(obs[:-1, None])).logits[:, 0]
    behaviour = torch.from_numpy(params)
    expected = torch.distributions.kl_divergence(
        torch.distributions.Independent(torch.distributions.Normal(behaviour[:, :2], behaviour[:, 2:].exp()), 1),
        torch.distributions.Independent(torch.distributions.Normal(current[:, :2], current[:, 2:].exp()), 1)).mean()
    assert scored[0] == pytest.approx(float(expected), rel=1e-5)
    assert replay.sample(1, rng)[1].tolist() == [2]
