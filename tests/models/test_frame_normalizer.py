"""--normalize_observations on frames: a running mean and std per pixel (herd/models/normalize.py
FrameNormalizer), gathered from real Pong frames, applied inside the image networks."""
import numpy as np
import pytest
import torch

from herd.envs import make_env
from herd.models import build_model, observation_normalizer
from herd.models.normalize import CLIP, FrameNormalizer


@pytest.fixture(scope="module")
def pong_frames():
    """[N, 4, 84, 84] uint8: 200 steps of Pong under random actions."""
    env = make_env("PongNoFrameskip-v4", seed=3)
    obs, _ = env.reset(seed=3)
    frames, rng = [], np.random.default_rng(3)
    for _ in range(200):
        obs, _, terminated, truncated, _ = env.step(int(rng.integers(env.action_space.n)))
        frames.append(np.asarray(obs))
        if terminated or truncated:
            obs, _ = env.reset()
    env.close()
    return np.stack(frames)


def test_statistics_are_per_pixel_of_the_newest_frame(pong_frames):
    norm = FrameNormalizer((84, 84))
    norm.update(pong_frames[:120].reshape(60, 2, 4, 84, 84))       # [T, E, C, H, W], as a rollout gives them
    norm.update(pong_frames[120:])
    newest = pong_frames[:, -1].reshape(200, -1).astype(np.float64) / 255
    assert float(norm.count) == 200
    np.testing.assert_allclose(norm.mean.numpy(), newest.mean(0), atol=1e-6)
    np.testing.assert_allclose(norm.var.numpy(), newest.var(0), atol=1e-6)
    # A negative control: statistics of every stacked frame would differ where things move.
    every = pong_frames.reshape(800, -1).astype(np.float64) / 255
    assert not np.allclose(norm.mean.numpy(), every.mean(0), atol=1e-6)


def test_a_rollout_counts_the_newest_frame_of_every_fourth_step(pong_frames):
    rollout = pong_frames[:84].reshape(21, 4, 4, 84, 84)          # [T+1, E, C, H, W]
    norm = FrameNormalizer((84, 84))
    norm.update_from_rollout(rollout)
    counted = rollout[0:20:4, :, -1].reshape(20, -1).astype(np.float64) / 255   # steps 0, 4, ..., 16
    assert float(norm.count) == 20
    np.testing.assert_allclose(norm.mean.numpy(), counted.mean(0), atol=1e-6)
    np.testing.assert_allclose(norm.var.numpy(), counted.var(0), atol=1e-6)
    # obs[T] is the next rollout's first: never counted here. Vector observations count every step.
    vectors = observation_normalizer(build_model(network="mlp", obs_shape=(3,), obs_dtype="float32", num_actions=2, feature_size=None,
                                                 normalize_observations=True))
    vectors.update_from_rollout(np.ones((21, 4, 3), np.float32))
    assert float(vectors.count) == 80


def test_uint8_moments_are_exact_past_float32s_integer_range():
    """600 frames of bright levels: their sum of squares (about 3e7) is beyond float32's
    exact integers (2^24), so the sums are taken 256 rows at a time; the statistics equal
    those of exact int64 sums bit for bit."""
    frames = torch.randint(200, 256, (300, 2, 4, 6, 5), dtype=torch.uint8,
                           generator=torch.Generator().manual_seed(0))   # [T, E, C, H, W]
    norm = FrameNormalizer((6, 5))
    norm.update(frames)
    levels = frames[..., -1, :, :].reshape(600, 30).to(torch.int64)
    total, squares = levels.sum(0).double(), (levels * levels).sum(0).double()
    mean = total / 600
    expected = FrameNormalizer((6, 5))
    expected.merge(600, mean / 255.0, (squares / 600 - mean * mean).clamp(min=0.0) / 255.0 ** 2)
    assert torch.equal(norm.mean, expected.mean) and torch.equal(norm.var, expected.var)
    assert float(norm.count) == 600


def test_the_host_merge_is_the_device_merge_in_numpy(pong_frames):
    """A CPU learner merges its statistics in numpy (merge_on_host), a GPU learner in torch
    (merge_on_device): the same float64 operations, so the same statistics bit for bit,
    merge after merge (here both on the CPU, one forced through torch)."""
    host, torch_path = FrameNormalizer((84, 84)), FrameNormalizer((84, 84))
    for part in (pong_frames[:70], pong_frames[70:150], pong_frames[150:]):
        levels = torch.from_numpy(part[:, -1].reshape(len(part), -1)).double() / 255.0
        mean, var = levels.mean(0), levels.var(0, unbiased=False)
        host.merge(len(part), mean, var)
        torch_path.merge_on_device(len(part), mean, var)
        for name in ("count", "mean", "var"):
            assert torch.equal(getattr(host, name), getattr(torch_path, name)), name
    assert float(host.count) == len(pong_frames) and float(host.var.max()) > 0


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_gpu_learners_statistics_are_summed_on_its_device_and_equal_the_hosts(pong_frames):
    """On a GPU the newest frames go to the device and are summed there: the same
    statistics, bit for bit, as on the host (every partial sum is an exact integer)."""
    host, device = FrameNormalizer((84, 84)), FrameNormalizer((84, 84)).cuda()
    recorded = FrameNormalizer((84, 84)).cuda()     # frames already on the device (herd/inference/records.py)
    for part in (pong_frames[:120].reshape(60, 2, 4, 84, 84), pong_frames[120:], np.tile(pong_frames, (2, 1, 1, 1))):
        host.update(part)
        device.update(part)
        recorded.update(torch.from_numpy(np.ascontiguousarray(part)).cuda())
    for name in ("count", "mean", "var"):
        assert torch.equal(getattr(device, name).cpu(), getattr(host, name)), name
        assert torch.equal(getattr(recorded, name).cpu(), getattr(host, name)), name


def test_constant_pixels_become_exactly_zero_and_moving_ones_stand_out(pong_frames):
    norm = FrameNormalizer((84, 84))
    norm.update(pong_frames)
    for dtype in (torch.float32, torch.bfloat16):
        out = norm(torch.as_tensor(pong_frames[-8:]), dtype)
        assert out.dtype == dtype and out.shape == (8, 4, 84, 84)
        constant = (norm.var == 0).view(84, 84)
        assert constant.any() and (out[:, :, constant] == 0).all()        # the background, in bf16 too
        assert out.float().abs().max() <= CLIP
        assert out.float().abs().amax(dim=(1, 2, 3)).min() > 3             # the ball and paddles
    # Float frames already in [0, 1] normalise as their uint8 originals do.
    scaled = torch.as_tensor(pong_frames[-8:]).float() / 255
    torch.testing.assert_close(norm(scaled), norm(torch.as_tensor(pong_frames[-8:])))


@pytest.mark.parametrize("network", ["nature_cnn", "resnet"])
def test_image_networks_normalise_their_input_when_asked(pong_frames, network):
    torch.manual_seed(0)
    plain = build_model(network, (4, 84, 84), "uint8", 6, None)
    torch.manual_seed(0)
    normed = build_model(network, (4, 84, 84), "uint8", 6, None, normalize_observations=True)
    assert observation_normalizer(plain) is None
    stats = observation_normalizer(normed)
    assert isinstance(stats, FrameNormalizer)
    assert not any(p.requires_grad for p in stats.parameters())             # the optimizer leaves them alone
    obs = torch.as_tensor(pong_frames[:6]).view(3, 2, 4, 84, 84)            # [T, B, C, H, W]
    # Before any data the normaliser is the identity on [0, 1] frames: both networks agree.
    torch.testing.assert_close(normed(obs).logits, plain(obs).logits)
    stats.update(pong_frames)
    assert not torch.allclose(normed(obs).logits, plain(obs).logits)
    with torch.autocast("cpu", torch.bfloat16):
        assert torch.isfinite(normed(obs).value.float()).all()


def test_minatar_frames_are_refused():
    with pytest.raises(ValueError, match="minatar_cnn has no observation normaliser"):
        build_model("minatar_cnn", (4, 10, 10), "float32", 3, None, normalize_observations=True)
