"""Networks: output shapes and dtypes, frame scaling, feature-vector semantics, gradient flow,
model choice and errors, checkpoint signatures."""
import pytest
import torch
from torch.nn.utils import parameters_to_vector, vector_to_parameters

from herd.models import NETWORKS, ImpalaResNet, MinAtarCNN, MLPNet, ModelOutput, NatureCNN, build_model, model_signature

A = 5
# network -> (obs_shape, obs_dtype, default feature size); frames are small where the
# architecture allows, to keep the suite fast.
CASES = {
    "mlp": ((4,), "float32", 64),
    "nature_cnn": ((4, 84, 84), "uint8", 512),
    "resnet": ((3, 64, 64), "uint8", 256),
    "minatar_cnn": ((4, 10, 10), "float32", 128),      # MinAtar's 0/1 channels
}
IMAGE_NETS = ("nature_cnn", "resnet")


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def make(network, **kwargs):
    obs_shape, obs_dtype, feature_size = CASES[network]
    kwargs.setdefault("feature_size", feature_size)
    return build_model(network, obs_shape, obs_dtype, A, **kwargs)


def observations(network, T, B):
    obs_shape, obs_dtype, _ = CASES[network]
    if obs_dtype == "uint8":
        return torch.randint(0, 256, (T, B, *obs_shape), dtype=torch.uint8)
    return torch.randn(T, B, *obs_shape)


@pytest.mark.parametrize("network", CASES)
@pytest.mark.parametrize("T,B", [(3, 2), (1, 2), (1, 1)])
def test_output_shapes_and_dtypes(network, T, B):
    model = make(network, feature_size=24)
    out = model(observations(network, T, B))
    assert isinstance(out, ModelOutput)
    assert out.logits.shape == (T, B, A)
    assert out.value.shape == (T, B)
    assert out.features.shape == (T, B, 24)
    for field in out:
        assert field.dtype == torch.float32
        assert torch.isfinite(field).all()


@pytest.mark.parametrize("network", CASES)
def test_time_flattening_keeps_steps_apart(network):
    """One [T, B] call equals T separate [1, B] calls: the [T*B] reshape keeps the order."""
    model = make(network)
    obs = observations(network, 3, 2)
    whole = model(obs)
    for t in range(3):
        step = model(obs[t:t + 1])
        for a, b in zip(whole, step):
            torch.testing.assert_close(a[t:t + 1], b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("network", IMAGE_NETS)
def test_uint8_frames_are_scaled_inside(network):
    model = make(network)
    obs = observations(network, 2, 2)
    for a, b in zip(model(obs), model(obs.float() / 255.0)):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    full = torch.full_like(obs, 255)
    for a, b in zip(model(full), model(torch.ones(obs.shape))):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    # And the scale really is 1/255: raw 0..255 floats would give something else.
    assert not torch.allclose(model(obs).value, model(obs.float()).value)


def test_mlp_takes_float64_vectors():
    model = make("mlp")
    obs = torch.randn(2, 3, 4, dtype=torch.float64)
    torch.testing.assert_close(model(obs).logits, model(obs.float()).logits)


@pytest.mark.parametrize("network", CASES)
def test_feature_size(network):
    _, _, torso_size = CASES[network]
    assert make(network, feature_size=7).heads.feature.out_features == 7
    assert make(network, feature_size=7)(observations(network, 1, 2)).features.shape == (1, 2, 7)
    # Without the extra layer the feature vector is the torso output itself.
    model = make(network, feature_size=torso_size, use_feature_layer=False)
    assert model.heads.feature is None
    assert model(observations(network, 1, 2)).features.shape == (1, 2, torso_size)
    assert make(network, feature_size=None, use_feature_layer=False).heads.feature_size == torso_size
    with pytest.raises(ValueError, match=f"must be {torso_size}"):
        make(network, feature_size=torso_size + 1, use_feature_layer=False)


@pytest.mark.parametrize("network", CASES)
@pytest.mark.parametrize("use_feature_layer", [True, False])
def test_gradients_reach_every_trainable_parameter(network, use_feature_layer):
    model = make(network, use_feature_layer=use_feature_layer)
    out = model(observations(network, 3, 2))
    (out.logits.sum() + out.value.sum()).backward()
    for name, p in model.named_parameters():
        if name.startswith("heads.feature."):
            # The feature projection is a side branch no loss reads: frozen, but still a
            # parameter so weight sync carries it to the actors.
            assert not p.requires_grad and p.grad is None, name
        else:
            assert p.grad is not None and p.grad.abs().sum() > 0, name
    assert any(n.startswith("heads.feature.") for n, _ in model.named_parameters()) == use_feature_layer


@pytest.mark.parametrize("network", CASES)
def test_weight_sync_round_trip(network):
    """Actors receive weights via parameters_to_vector, which needs contiguous parameters."""
    src = make(network)
    torch.manual_seed(1)
    dst = make(network)
    vector_to_parameters(parameters_to_vector(src.parameters()), dst.parameters())
    for a, b in zip(src.parameters(), dst.parameters()):
        assert torch.equal(a, b)
    obs = observations(network, 1, 2)
    # Not bit-equal: dst's parameters are now views into one vector, whose alignment can
    # change the CPU kernels' summation order.
    for a, b in zip(src(obs), dst(obs)):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_initialisation():
    """Orthogonal heads: a near-uniform initial policy and zero biases."""
    model = make("mlp")
    assert torch.allclose(model.heads.policy.bias, torch.zeros(A))
    assert model.heads.policy.weight.abs().max() < 0.05
    w = model.torso[0].weight                                     # [64, 4], gain sqrt(2)
    torch.testing.assert_close(w.T @ w, 2 * torch.eye(4), rtol=1e-4, atol=1e-4)


def test_auto_picks_by_observation_rank():
    assert isinstance(build_model("auto", (4,), "float32", 2, 64), MLPNet)
    assert isinstance(build_model("auto", (4, 84, 84), "uint8", 6, 512), NatureCNN)
    assert isinstance(build_model("resnet", (4, 84, 84), "uint8", 6, 512), ImpalaResNet)
    assert isinstance(build_model("auto", (10, 10, 10), "float32", 6, 128), MinAtarCNN)   # under 36x36
    assert isinstance(build_model("auto", (4, 36, 36), "uint8", 6, 512), NatureCNN)        # the smallest it takes
    assert NETWORKS == ("auto", "mlp", "nature_cnn", "resnet", "minatar_cnn", "constant")   # auto never picks constant


def test_other_resolutions():
    model = build_model("nature_cnn", (1, 42, 60), "uint8", 3, 16)
    assert model(torch.zeros(1, 2, 1, 42, 60, dtype=torch.uint8)).logits.shape == (1, 2, 3)


@pytest.mark.parametrize("args,match", [
    (("nature_cnn", (4,), "float32", 2, 64), "nature_cnn needs frames"),
    (("resnet", (8,), "float32", 2, 64), "resnet needs frames"),
    (("mlp", (4, 84, 84), "uint8", 2, 64), "mlp needs vector"),
    (("auto", (3, 4), "float32", 2, 64), "auto handles"),
    (("transformer", (4,), "float32", 2, 64), "unknown network 'transformer'"),
    (("auto", (4,), "not_a_dtype", 2, 64), "unknown observation dtype"),
    (("auto", (4,), "float32", 0, 64), "at least one action"),
    (("auto", (4,), "float32", 2, 0), "must be positive"),
    (("nature_cnn", (4, 20, 20), "uint8", 2, 64), "too small"),
])
def test_errors_are_one_clear_line(args, match):
    with pytest.raises(ValueError, match=match) as err:
        build_model(*args)
    assert "\n" not in str(err.value)


def test_forward_rejects_missing_time_axis():
    with pytest.raises(ValueError, match=r"time-major observations \[T, B"):
        make("mlp")(torch.zeros(2, 4))
    with pytest.raises(ValueError, match=r"\[T, B, 3-d observation\], got shape \(2, 4, 84, 84\)"):
        make("nature_cnn")(torch.zeros(2, 4, 84, 84, dtype=torch.uint8))


def test_unknown_activation():
    with pytest.raises(ValueError, match="unknown activation"):
        MLPNet(4, 2, activation="swish")
    assert isinstance(MLPNet(4, 2, activation="relu").torso[1], torch.nn.ReLU)


def test_model_signature():
    frames = ((4, 84, 84), "uint8")
    nature = model_signature(build_model("nature_cnn", *frames, 6, 512))
    assert nature == model_signature(build_model("nature_cnn", *frames, 6, 512))
    assert nature != model_signature(build_model("resnet", *frames, 6, 512))
    assert nature != model_signature(build_model("nature_cnn", *frames, 4, 512))
    assert nature != model_signature(build_model("nature_cnn", *frames, 6, 512, use_feature_layer=False))
    mlp = model_signature(build_model("mlp", (4,), "float32", 2, 64))
    assert mlp != model_signature(build_model("mlp", (4,), "float32", 3, 64))
    assert mlp != model_signature(build_model("mlp", (4,), "float32", 2, 64, hidden_sizes=(32, 32)))
    assert all(isinstance(v, list) and all(type(d) is int for d in v) for v in nature.values())
    assert nature["heads.policy.weight"] == [6, 512]


def test_the_nature_cnn_trains_channels_last_on_cpu_and_acts_in_nchw():
    """Channels-last activations only where gradients flow (the learner's update), the same
    numbers either way, and the weights stay contiguous for weight sync."""
    torch.manual_seed(0)
    model = NatureCNN(4, 6)
    obs = torch.randint(0, 256, (3, 2, 4, 84, 84), dtype=torch.uint8)
    seen = []
    model.convs[0].register_forward_hook(lambda module, inputs, output: seen.append(
        inputs[0].is_contiguous(memory_format=torch.channels_last) and not inputs[0].is_contiguous()))
    with torch.no_grad():
        acting = model(obs)
    training = model(obs)
    model.channels_last_when_training = False
    plain = model(obs)
    assert seen == [False, True, False]
    assert torch.allclose(training.logits, acting.logits, atol=1e-5)
    assert torch.allclose(training.logits, plain.logits, atol=1e-5)
    assert torch.allclose(training.value, plain.value, atol=1e-5)
    training.value.sum().backward()
    assert all(p.is_contiguous() for p in model.parameters())
