"""Trajectory storage in the learner's device memory: field -> tensor [time, capacity, ...].

On a GPU learner the replays keep their items where the learner computes: a batch is
gathered by index on the device (one index_select per field) instead of being copied,
concatenated and pinned on the host in one thread and sent over PCIe every update (which
capped an H100 learner's intake at about 25,600 env steps per second with three quarters
of each batch replayed, shared/gpu/README.md). Frames stay uint8: 10,000 Pong
trajectories of 21 x 4 x 84 x 84 are about 6 GB.

The interface is TrajectoryStorage's (write, read, nbytes, state_dict, load_state_dict,
capacity, version, unroll_length), so samplers and Replay do not change; read() returns
device tensors. Checkpoints keep one format: state_dict() goes through a host
TrajectoryStorage (observations LZ4-packed), so a checkpoint saved from a GPU learner
loads on a CPU one and the other way round. Observations are never compressed here
(--use_replay_compression is for host replays: decompressing on the host is the copy
this storage removes)."""
from __future__ import annotations

import numpy as np
import torch

from herd.replay.storage import TrajectoryStorage
from herd.trajectory import TrajectoryLayout


class DeviceTrajectoryStorage:
    compress_obs = False

    def __init__(self, layout: TrajectoryLayout, capacity: int, device: torch.device):
        self.layout = layout
        self.capacity = capacity
        self.device = torch.device(device)
        fields = layout.fields()
        self.obs_shape, self.obs_dtype = fields["obs"]              # [T+1, *obs_shape]
        self.unroll_length = layout.unroll_length                    # T
        self.tensors: dict[str, torch.Tensor] = {}
        for name, (shape, dtype) in fields.items():
            tensor = torch.empty((shape[0], capacity, *shape[1:]), dtype=torch.from_numpy(np.empty(0, dtype)).dtype,
                                 device=self.device)                  # [time, capacity, ...]
            tensor.fill_(layout.sentinel(name))
            self.tensors[name] = tensor
        self.version = np.full(capacity, -1, dtype=np.int64)        # host: the mixer reads it every batch

    def write(self, position: int, trajectory: dict[str, np.ndarray], version: int) -> None:
        """trajectory: field -> [time, ...] for one environment (host arrays, copied here)."""
        for name, tensor in self.tensors.items():
            tensor[:, position].copy_(torch.as_tensor(np.ascontiguousarray(trajectory[name])), non_blocking=True)
        self.version[position] = version

    def write_run(self, start: int, rollout: dict[str, np.ndarray], version: int) -> None:
        """rollout: field -> [time, n, ...] host arrays, into positions start .. start + n - 1:
        one copy per field."""
        n = rollout["action"].shape[1]
        for name, tensor in self.tensors.items():
            tensor[:, start:start + n].copy_(torch.as_tensor(np.ascontiguousarray(rollout[name])), non_blocking=True)
        self.version[start:start + n] = version

    def column(self, name: str) -> torch.Tensor:
        """A stored field [time, capacity, ...]."""
        return self.tensors[name]

    def obs_at(self, positions: torch.Tensor, steps: torch.Tensor) -> torch.Tensor:
        """The observation of step steps[b] of trajectory positions[b]: [B, ...] (device
        index tensors [B])."""
        return self.tensors["obs"][steps, positions]

    def read(self, positions: np.ndarray) -> dict[str, torch.Tensor]:
        """field -> [time, B, ...] device tensors for the given positions (a gather on the
        device; the index goes over as [B] int64)."""
        index = torch.as_tensor(np.asarray(positions, dtype=np.int64)).to(self.device, non_blocking=True)
        return {name: tensor.index_select(1, index) for name, tensor in self.tensors.items()}

    def lend(self, positions: np.ndarray) -> None:
        """Never lends (see TrajectoryStorage.lend): a GPU step reads its batch after the host
        has moved on, so positions given back when the host returns from the step could be
        written before that read. A device learner's copy is the gather into its step."""
        return None

    def read_steps(self, positions: np.ndarray, steps: np.ndarray, names: tuple) -> dict[str, torch.Tensor]:
        """TrajectoryStorage.read_steps on the device: only the time steps `steps` [k] of the
        fields `names`, field -> [k, C, ...] device tensors for positions [C] (what elite
        scoring reads; the frames never leave the device)."""
        rows = torch.as_tensor(np.asarray(steps, dtype=np.int64)).to(self.device, non_blocking=True)        # [k]
        columns = torch.as_tensor(np.asarray(positions, dtype=np.int64)).to(self.device, non_blocking=True)  # [C]
        return {name: self.tensors[name].index_select(0, rows).index_select(1, columns) for name in names}

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors.values())

    def host_copy(self, filled: int) -> TrajectoryStorage:
        """The first `filled` positions as a host TrajectoryStorage (for checkpoints)."""
        host = TrajectoryStorage(self.layout, max(filled, 1))
        for name, tensor in self.tensors.items():
            host.arrays[name][:, :filled] = tensor[:, :filled].cpu().numpy()
        host.version[:filled] = self.version[:filled]
        return host

    def state_dict(self, filled: int) -> dict:
        """TrajectoryStorage's format: the same checkpoint whichever storage saved it."""
        return self.host_copy(filled).state_dict(filled)

    def load_state_dict(self, state: dict) -> None:
        filled = len(state["version"])
        host = TrajectoryStorage(self.layout, max(filled, 1))
        host.load_state_dict(state)
        for name, tensor in self.tensors.items():
            if name in host.arrays:
                tensor[:, :filled].copy_(torch.from_numpy(host.arrays[name][:, :filled]))
        self.version[:filled] = host.version[:filled]
