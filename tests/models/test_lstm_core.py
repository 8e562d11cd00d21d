"""The LSTM core (--use_lstm): an unroll over T with resets equals step-by-step calls with
the state zeroed by hand, for every torso; the start state matters; per-env states."""
import numpy as np
import pytest
import torch

from herd.models import CoreInput, EnvCoreStates, build_model, recurrent_core
from herd.models.core import core_input_from_batch, state_from_rows, state_to_rows

A, H = 3, 16
CASES = {
    "mlp": ((4,), "float32"),
    "nature_cnn": ((4, 84, 84), "uint8"),
    "resnet": ((3, 32, 32), "uint8"),
}


def make(network):
    torch.manual_seed(0)
    obs_shape, obs_dtype = CASES[network]
    return build_model(network, obs_shape, obs_dtype, A, None, lstm_size=H).eval()


def observations(network, T, B):
    obs_shape, obs_dtype = CASES[network]
    if obs_dtype == "uint8":
        return torch.randint(0, 256, (T, B, *obs_shape), dtype=torch.uint8)
    return torch.randn(T, B, *obs_shape)


@pytest.mark.parametrize("network", CASES)
def test_unroll_with_resets_equals_step_by_step_with_manual_resets(network):
    torch.manual_seed(1)
    model = make(network)
    T, B = 6, 3
    obs = observations(network, T, B)
    start = torch.randn(2, 1, B, model.core.state_size)       # the MLP's value stream doubles it
    reset = torch.zeros(T, B, dtype=torch.bool)
    reset[2, 0] = reset[4, 1] = reset[4, 2] = True          # episodes begin at these steps
    with torch.no_grad():
        whole, final = model.unroll(obs, CoreInput(start, reset))
        state, steps = start.clone(), []
        for t in range(T):
            state = state * (~reset[t]).float().view(1, 1, B, 1)   # the manual reset
            out, state = model.unroll(obs[t:t + 1], CoreInput(state, None))
            steps.append(out)
    for name, got in whole._asdict().items():
        expected = torch.cat([getattr(s, name) for s in steps])
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(final, state, rtol=1e-5, atol=1e-5)


def test_a_reset_forgets_everything_before_it():
    model = make("mlp")
    T, B = 5, 2
    obs = torch.randn(T, B, 4)
    reset = torch.zeros(T, B, dtype=torch.bool)
    reset[3] = True
    with torch.no_grad():
        S = model.core.state_size
        out = model(obs, CoreInput(torch.randn(2, 1, B, S), reset))
        fresh = model(obs[3:])                                    # a zero state from step 3 on
        torch.testing.assert_close(out.logits[3:], fresh.logits)
        # ...while before the reset the start state matters (the test above could not fail otherwise).
        other = model(obs, CoreInput(torch.randn(2, 1, B, S), reset))
    assert not torch.allclose(out.logits[:3], other.logits[:3])
    torch.testing.assert_close(out.logits[3:], other.logits[3:])


def test_feed_forward_networks_refuse_a_state_and_have_no_core():
    model = build_model("mlp", (4,), "float32", A, None)
    assert recurrent_core(model) is None and EnvCoreStates.for_model(model) is None
    with pytest.raises(ValueError, match="without an LSTM core"):
        model(torch.randn(2, 1, 4), CoreInput(torch.zeros(2, 1, 1, 64), None))


def test_the_core_runs_in_float32_under_bf16_autocast():
    model = make("mlp")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out, state = model.unroll(torch.randn(4, 2, 4), CoreInput(torch.zeros(2, 1, 2, 2 * H), None))
    assert state.dtype == torch.float32 and torch.isfinite(out.logits.float()).all()


def test_learner_core_input_resets_after_done_and_starts_from_the_stored_state():
    T, B = 4, 2
    rows = torch.randn(B, 2, 1, H)
    done = torch.zeros(T, B, dtype=torch.bool)
    done[1, 0] = done[3, 1] = True
    core = core_input_from_batch({"core_state": rows[None], "done": done})
    assert core.reset.shape == (T + 1, B)
    assert core.reset[:, 0].tolist() == [False, False, True, False, False]
    assert core.reset[:, 1].tolist() == [False, False, False, False, True]
    torch.testing.assert_close(state_to_rows(core.state), rows)
    torch.testing.assert_close(state_from_rows(rows), core.state)
    assert core_input_from_batch({"done": done}) is None


def test_env_states_are_kept_per_environment_and_reset_on_request():
    model = make("mlp")
    states = EnvCoreStates.for_model(model, num_envs=2)
    obs = torch.randn(1, 2, 4)
    with torch.no_grad():
        _, start = states.step(model, obs, np.array([0, 1]))
        assert torch.count_nonzero(start) == 0                     # a new environment starts at zero
        after = states.state.clone()
        _, start = states.step(model, obs[:, :1], np.array([1]))   # env 1 alone (an asynchronous batch)
        torch.testing.assert_close(start[:, :, 0], after[:, :, 1])
        torch.testing.assert_close(states.state[:, :, 0], after[:, :, 0])   # env 0 untouched
        _, start = states.step(model, obs, np.array([0, 1]), reset=np.array([True, False]))
        assert torch.count_nonzero(start[:, :, 0]) == 0 and torch.count_nonzero(start[:, :, 1]) > 0
        states.begin(np.array([4]))                                  # grows to a higher index
    assert states.state.shape[2] == 5


def test_a_learner_step_trains_the_core_from_a_batch_with_start_states():
    from herd.algos import trajectory_layout
    from herd.algos.impala import IMPALA
    from herd.learner.learner import Learner, build_optimizer, build_scheduler
    from herd.losses.impala import ImpalaLossWeights, impala_loss

    model = make("mlp")
    T, B = 5, 3
    assert model.core.state_shape == (2, 1, 2 * H)                    # policy and value streams
    layout = trajectory_layout(IMPALA, T, (4,), "float32", A, H, core_state_shape=model.core.state_shape)
    assert layout.fields()["core_state"][0] == (1, 2, 1, 2 * H)       # one step: the start
    rng = np.random.default_rng(0)
    batch = {"obs": torch.randn(T + 1, B, 4), "action": torch.from_numpy(rng.integers(0, A, (T, B))),
             "reward": torch.ones(T, B), "done": torch.from_numpy(rng.random((T, B)) < 0.3),
             "trunc_value": torch.zeros(T, B), "behaviour_logits": torch.zeros(T, B, A),
             "behaviour_value": torch.zeros(T, B), "features": torch.zeros(T, B, H),
             "core_state": torch.randn(1, B, 2, 1, 2 * H), "replayed": torch.zeros(B, dtype=torch.bool)}
    optimizer = build_optimizer("adam", model.parameters(), 1e-2, 1e-5)
    learner = Learner(model, optimizer, build_scheduler(optimizer, 1e-2, 1e-3, 10),
                      lambda b, out: impala_loss(b, out, ImpalaLossWeights()), grad_clip_norm=40.0)
    before = [model.core.lstm.weight_hh_l0.detach().clone(), model.core.value_lstm.weight_hh_l0.detach().clone()]
    metrics = learner.step(batch).metrics
    assert metrics["skipped"] == 0.0 and np.isfinite(metrics["loss"])
    assert not torch.equal(before[0], model.core.lstm.weight_hh_l0)
    assert not torch.equal(before[1], model.core.value_lstm.weight_hh_l0)


def test_a_saturated_value_lstm_leaves_the_mlp_value_trainable():
    """The late collapse with --use_lstm on CartPole (docs/lstm.md): values near 10 drove most of
    the value LSTM's units into saturation (|h| > 0.9: o and tanh(c) both flat), where they
    pass almost no gradient, so the value could not come down when games began to fail.
    The MLP's value head therefore also reads its value torso. Here the value LSTM is
    saturated by hand (huge gate biases): the value must still move with the value torso's
    weights, as a feed-forward value does; without the skip the gradient is ~0."""
    torch.manual_seed(0)
    model = build_model("mlp", (4,), "float32", 2, None, lstm_size=H)
    with torch.no_grad():
        model.core.value_lstm.bias_ih_l0.fill_(30.0)              # every gate open, c past tanh's range
    T, B = 5, 4
    obs = torch.randn(T, B, 4)
    with torch.no_grad():
        flat = obs.reshape(T * B, 4)
        _, value_h, _ = model.core(model.torso(flat), T, B, None, model.value_torso(flat))
    assert value_h.view(T, B, -1)[2:].abs().min() > 0.99           # saturated once c has grown (c_t = t + 1)
    out, _ = model.unroll(obs, CoreInput(model.core.initial_state(B), None))
    out.value[2:].sum().backward()
    torso_grad = torch.cat([p.grad.flatten() for p in model.value_torso.parameters()])
    assert torso_grad.norm() > 0.1, torso_grad.norm()
