"""--ray_compress_obs (herd/backends/ray_wire.py): what the actor packs is what the learner
reads, bit for bit, and the option is refused where nothing would be compressed."""
import numpy as np
import pytest

from herd.backends.ray_wire import PackedArray, pack_obs, unpack_obs
from herd.config import ConfigError, resolve
from herd.envs import env_kind


def test_packed_observations_come_back_bit_identical_writable_and_smaller_for_frames():
    """Catches a lossy or reshaped round trip (dtype, shape, byte order), a read-only result
    (the learner's replay writes into what it keeps) and other fields being touched."""
    rng = np.random.default_rng(0)
    frames = np.zeros((21, 4, 4, 84, 84), dtype=np.uint8)          # [T+1, E, stack, H, W], Pong-like
    frames[:, :, :, 30:60, 10:14] = rng.integers(0, 255, (21, 4, 4, 30, 4), dtype=np.uint8)
    vectors = rng.standard_normal((21, 4, 4)).astype(np.float32)   # CartPole-like
    for obs in (frames, vectors):
        action = rng.integers(0, 3, (20, 4))
        packed = pack_obs({"obs": obs, "action": action})
        assert isinstance(packed["obs"], PackedArray) and packed["action"] is action
        back = unpack_obs(packed)
        assert back["obs"].dtype == obs.dtype and back["obs"].shape == obs.shape
        assert np.array_equal(back["obs"], obs) and back["obs"].flags.writeable
    assert len(pack_obs({"obs": frames})["obs"].data) * 10 < frames.nbytes
    plain = {"obs": vectors}
    assert unpack_obs(plain) is plain                                # unpacked input passes through


def test_ray_compress_obs_without_the_ray_backend_is_one_line():
    """Catches the option being accepted, and silently doing nothing, on local actors."""
    cfg = resolve({"env": "CartPole-v1", "ray_compress_obs": "True"}, env_kind=env_kind)
    with pytest.raises(ConfigError, match="needs --multiprocessing_backend=ray"):
        cfg.validate()
    ray = resolve({"env": "CartPole-v1", "ray_compress_obs": "True", "multiprocessing_backend": "ray"},
                  env_kind=env_kind)
    ray.validate()
    assert ray.parallel.ray_compress_obs is True
