"""Preallocated trajectory storage, time-major: field -> array [time, capacity, ...].

Storing capacity on the second axis means that reading a batch of positions with one
fancy index already gives the learner's time-major layout [time, B, ...].

With `compress_obs`, observations (by far the largest field for frames) are kept
LZ4-compressed instead of in the preallocated array, one LZ4 frame per time step, all
steps of a trajectory in one bytes object with their offsets beside it: a batch read
decompresses every step, elite scoring only the few steps it looks at. (One frame per
trajectory compresses about 2x better, but stacked Atari frames already shrink 20-45x
per step, and then the float features are most of a stored trajectory.) The other
fields stay uncompressed. benchmarks/replay_sampling.py measures what this saves and
costs. Checkpoints hold observations in the same packed form, compressed or not."""
from __future__ import annotations

import lz4.frame
import numpy as np
import torch

from herd.trajectory import TrajectoryLayout


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
            array.fill(layout.sentinel(name))
            self.arrays[name] = array
        self.packed_obs: list[bytes | None] = [None] * capacity if compress_obs else []
        self.offsets = np.zeros((capacity if compress_obs else 0, self.obs_shape[0] + 1), dtype=np.int64)
        self.version = np.full(capacity, -1, dtype=np.int64)  # policy version that acted

    def write(self, position: int, trajectory: dict[str, np.ndarray], version: int) -> None:
        """trajectory: field -> [time, ...] for one environment."""
        for name, array in self.arrays.items():
            array[:, position] = trajectory[name]
        if self.compress_obs:
            self.packed_obs[position], self.offsets[position] = self.pack(trajectory["obs"])
        self.version[position] = version

    def write_run(self, start: int, rollout: dict[str, np.ndarray], version: int) -> None:
        """rollout: field -> [time, n, ...], its n trajectories into positions start ..
        start + n - 1 (inside the capacity): one copy per field, not one per trajectory."""
        n = rollout["action"].shape[1]
        for name, array in self.arrays.items():
            array[:, start:start + n] = rollout[name]
        if self.compress_obs:
            for e in range(n):
                self.packed_obs[start + e], self.offsets[start + e] = self.pack(rollout["obs"][:, e])
        self.version[start:start + n] = version

    def pack(self, obs: np.ndarray) -> tuple[bytes, np.ndarray]:
        """obs [T+1, ...] -> (the steps' LZ4 frames back to back, offsets [T+2])."""
        obs = np.ascontiguousarray(obs, dtype=self.obs_dtype)
        frames = [lz4.frame.compress(step.tobytes(), compression_level=self.compression_level) for step in obs]
        return b"".join(frames), np.cumsum([0] + [len(f) for f in frames])

    def unpack(self, packed: bytes, offsets: np.ndarray, steps) -> np.ndarray:
        """Time steps `steps` of one packed trajectory: [k, ...]."""
        raw = b"".join(lz4.frame.decompress(packed[offsets[t]:offsets[t + 1]]) for t in steps)
        return np.frombuffer(raw, dtype=self.obs_dtype).reshape(len(steps), *self.obs_shape[1:])

    def unpack_steps(self, position: int, steps) -> np.ndarray:
        """The observations of the given time steps of one stored trajectory: [k, ...]."""
        return self.unpack(self.packed_obs[position], self.offsets[position], steps)

    def unpack_obs(self, position: int) -> np.ndarray:
        return self.unpack_steps(position, range(self.obs_shape[0]))

    def read(self, positions: np.ndarray) -> dict[str, np.ndarray]:
        """field -> [time, B, ...] copies for the given positions, C-contiguous (np.take:
        `array[:, positions]` would come out batch-major in memory, and making it time-major
        for the learner would copy every frame once more)."""
        batch = {name: np.take(array, positions, axis=1) for name, array in self.arrays.items()}
        if self.compress_obs:
            batch["obs"] = np.stack([self.unpack_obs(p) for p in positions], axis=1)
        return batch

    def lend(self, positions: np.ndarray) -> dict[str, np.ndarray] | None:
        """read(positions) with the observations as a view into the storage, no copy, when
        the positions are one ascending run (the on-policy queue's batches are): obs
        [T+1, B, ...] strided in time, valid until the positions are written again (the
        queue's sampler keeps them from that until they are given back). None when the
        positions are not such a run or the observations are LZ4-packed."""
        start = int(positions[0]) if len(positions) else 0
        if self.compress_obs or not np.array_equal(positions, np.arange(start, start + len(positions))):
            return None
        batch = {name: np.take(array, positions, axis=1) for name, array in self.arrays.items() if name != "obs"}
        batch["obs"] = self.arrays["obs"][:, start:start + len(positions)]
        return batch

    device = torch.device("cpu")

    def column(self, name: str) -> torch.Tensor:
        """A stored field as a tensor [time, capacity, ...] sharing the array's memory (the
        observations too, unless they are LZ4-packed: obs_at reads those)."""
        return torch.from_numpy(self.arrays[name])

    def obs_at(self, positions, steps) -> torch.Tensor:
        """The observation of step steps[b] of trajectory positions[b], for each b: [B, ...]
        (a transition batch reads one or two steps of many trajectories); positions and
        steps [B] int64, numpy or CPU tensors."""
        if not self.compress_obs:
            return self.column("obs")[torch.as_tensor(steps), torch.as_tensor(positions)]
        return torch.from_numpy(np.stack([self.unpack_steps(p, (t,))[0]
                                          for p, t in zip(np.asarray(positions).tolist(), np.asarray(steps).tolist())]))

    def read_steps(self, positions: np.ndarray, steps: np.ndarray, names: tuple) -> dict[str, np.ndarray]:
        """Only the time steps `steps` [k] of the fields `names`: field -> [k, C, ...] for
        positions [C]. What elite scoring reads: a few steps of many trajectories."""
        out = {}
        for name in names:
            if name == "obs" and self.compress_obs:
                out[name] = np.stack([self.unpack_steps(p, steps) for p in positions], axis=1)
            else:
                out[name] = self.arrays[name][np.ix_(steps, positions)]
        return out

    def nbytes(self) -> int:
        """Memory held by the stored data (what compression saves)."""
        packed = sum(len(p) for p in self.packed_obs if p is not None)
        return sum(a.nbytes for a in self.arrays.values()) + packed

    def state_dict(self, filled: int) -> dict:
        """The first `filled` positions; observations always LZ4-packed per step (checkpoints
        stay small), as uint8 arrays with their offsets: a checkpoint holds tensors, nothing
        that needs unpickling."""
        state = {"arrays": {name: a[:, :filled].copy() for name, a in self.arrays.items() if name != "obs"},
                 "version": self.version[:filled].copy()}
        if self.compress_obs:
            packed, offsets = self.packed_obs[:filled], self.offsets[:filled].copy()
        else:
            pairs = [self.pack(self.arrays["obs"][:, p]) for p in range(filled)]
            packed = [pair[0] for pair in pairs]
            # Shaped explicitly: with nothing stored yet (a stop before the first rollout
            # reached the replay) there is no row to infer the width from.
            offsets = np.zeros((filled, self.obs_shape[0] + 1), dtype=np.int64)
            for position, pair in enumerate(pairs):
                offsets[position] = pair[1]
        state["packed_obs"] = [np.frombuffer(p, dtype=np.uint8).copy() for p in packed]
        state["packed_offsets"] = offsets
        return state

    def load_state_dict(self, state: dict) -> None:
        for name, array in state["arrays"].items():
            if name not in self.arrays:
                continue
            self.arrays[name][:, : array.shape[1]] = array
        self.version[: len(state["version"])] = state["version"]
        for position, packed in enumerate(state.get("packed_obs", [])):
            packed = packed.tobytes()
            if "packed_offsets" in state:
                offsets = np.asarray(state["packed_offsets"][position], dtype=np.int64)
            else:  # saved before per-step packing: one LZ4 frame for the whole trajectory
                whole = np.frombuffer(lz4.frame.decompress(packed), dtype=self.obs_dtype).reshape(self.obs_shape)
                packed, offsets = self.pack(whole)
            if self.compress_obs:
                self.packed_obs[position], self.offsets[position] = packed, offsets
            else:
                self.arrays["obs"][:, position] = self.unpack(packed, offsets, range(self.obs_shape[0]))
