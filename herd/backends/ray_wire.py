"""What a rollout looks like on the wire between nodes (--ray_compress_obs): its
observations LZ4-compressed by the actor before they leave its node, decompressed where
they are read (the learner, or the replay server). On Pong (uint8 frames [T+1, E, 4, 84,
84]) this cut the bytes on the link per step 12x at no measurable cost in actor frames/s;
on float observations (CartPole) it gains little (benchmarks/netns_cluster.py,
docs/netns-cluster.md)."""
from __future__ import annotations

from dataclasses import dataclass

import lz4.frame
import numpy as np

OBS = "obs"


@dataclass(frozen=True)
class PackedArray:
    """An array as LZ4 frame bytes with what rebuilds it."""
    data: bytes
    dtype: str          # numpy dtype string ('|u1', '<f4')
    shape: tuple

    @classmethod
    def pack(cls, array: np.ndarray) -> PackedArray:
        return cls(lz4.frame.compress(np.ascontiguousarray(array).tobytes()), array.dtype.str, tuple(array.shape))

    def unpack(self) -> np.ndarray:
        """A writable array of the original dtype and shape."""
        flat = np.frombuffer(bytearray(lz4.frame.decompress(self.data)), dtype=np.dtype(self.dtype))
        return flat.reshape(self.shape)


def pack_obs(arrays: dict) -> dict:
    """field -> [T(+1), E, ...] with the observations packed (the other fields as they are)."""
    return {**arrays, OBS: PackedArray.pack(arrays[OBS])} if OBS in arrays else arrays


def unpack_obs(arrays: dict) -> dict:
    """The inverse of pack_obs; arrays whose observations are not packed pass unchanged."""
    packed = arrays.get(OBS)
    return {**arrays, OBS: packed.unpack()} if isinstance(packed, PackedArray) else arrays
