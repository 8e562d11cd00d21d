"""Preallocated trajectory storage, time-major: field -> array [time, capacity, ...].

Storing capacity on the second axis means that reading a batch of positions with one
fancy index already gives the learner's time-major layout [time, B, ...].

With `compress_obs`, observations (by far the largest field for frames) are kept as one
LZ4 frame per trajectory instead of in the preallocated array; the other fields stay
uncompressed. benchmarks/replay_sampling.py measures what this saves and costs."""
from __future__ import annotations

import lz4.frame
import numpy as np

from herd.trajectory import SENTINELS, TrajectoryLayout


class TrajectoryStorage:
    def __init__(self, layout: TrajectoryLayout, capacity: int, compress_obs: bool = False,
                 compression_level: int = 0):
        self.capacity = capacity
        self.compress_obs = compress_obs
        self.compression_level = compression_level
        fields = layout.fields()
        self.obs_shape, self.obs_dtype = fields["obs"]              # [T+1, *obs_shape]
        self.unroll_length = layout.unroll_length                    # T
        self.arrays: dict[str, np.ndarray] = {}
        for name, (shape, dtype) in fields.items():
            if name == "obs" and compress_obs:
                continue
            array = np.empty((shape[0], capacity, *shape[1:]), dtype=dtype)
            array.fill(SENTINELS[name])
            self.arrays[name] = array
        self.packed_obs: list[bytes | None] = [None] * capacity if compress_obs else []
        self.version = np.full(capacity, -1, dtype=np.int64)  # policy version that acted

    def write(self, position: int, trajectory: dict[str, np.ndarray], version: int) -> None:
        """trajectory: field -> [time, ...] for one environment."""
        for name, array in self.arrays.items():
            array[:, position] = trajectory[name]
        if self.compress_obs:
            obs = np.ascontiguousarray(trajectory["obs"], dtype=self.obs_dtype)
            self.packed_obs[position] = lz4.frame.compress(obs.tobytes(), compression_level=self.compression_level)
        self.version[position] = version

    def unpack_obs(self, position: int) -> np.ndarray:
        raw = lz4.frame.decompress(self.packed_obs[position])
        return np.frombuffer(raw, dtype=self.obs_dtype).reshape(self.obs_shape)

    def read(self, positions: np.ndarray) -> dict[str, np.ndarray]:
        """field -> [time, B, ...] copies for the given positions."""
        batch = {name: array[:, positions] for name, array in self.arrays.items()}
        if self.compress_obs:
            batch["obs"] = np.stack([self.unpack_obs(p) for p in positions], axis=1)
        return batch

    def read_steps(self, positions: np.ndarray, steps: np.ndarray, names: tuple) -> dict[str, np.ndarray]:
        """Only the time steps `steps` [k] of the fields `names`: field -> [k, C, ...] for
        positions [C]. What elite scoring reads: a few steps of many trajectories."""
        out = {}
        for name in names:
            if name == "obs" and self.compress_obs:
                out[name] = np.stack([self.unpack_obs(p)[steps] for p in positions], axis=1)
            else:
                out[name] = self.arrays[name][np.ix_(steps, positions)]
        return out

    def nbytes(self) -> int:
        """Memory held by the stored data (what compression saves)."""
        packed = sum(len(p) for p in self.packed_obs if p is not None)
        return sum(a.nbytes for a in self.arrays.values()) + packed

    def state_dict(self, filled: int) -> dict:
        """The first `filled` positions; observations always LZ4-packed (checkpoints stay small),
        as uint8 arrays: a checkpoint holds tensors, nothing that needs unpickling."""
        state = {"arrays": {name: a[:, :filled].copy() for name, a in self.arrays.items() if name != "obs"},
                 "version": self.version[:filled].copy()}
        if self.compress_obs:
            packed = self.packed_obs[:filled]
        else:
            packed = [lz4.frame.compress(np.ascontiguousarray(self.arrays["obs"][:, p]).tobytes())
                      for p in range(filled)]
        state["packed_obs"] = [np.frombuffer(p, dtype=np.uint8).copy() for p in packed]
        return state

    def load_state_dict(self, state: dict) -> None:
        for name, array in state["arrays"].items():
            if name not in self.arrays:
                continue
            self.arrays[name][:, : array.shape[1]] = array
        self.version[: len(state["version"])] = state["version"]
        if not self.compress_obs:
            # A checkpoint saved with compression: unpack into the plain array.
            for position, packed in enumerate(state.get("packed_obs", [])):
                raw = lz4.frame.decompress(packed.tobytes())
                self.arrays["obs"][:, position] = np.frombuffer(raw, dtype=self.obs_dtype).reshape(self.obs_shape)
        else:
            for position, packed in enumerate(state.get("packed_obs", [])):
                self.packed_obs[position] = packed.tobytes()
