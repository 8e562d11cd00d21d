"""The one trajectory store: field -> tensor [time, capacity, ...], with a layout
(herd/trajectory.py TrajectoryLayout), a capacity, a device and a shared flag.

It serves as
- the actors' slots (`TrajectorySlots` below: the same fields with the capacity split into
  slots, slot first, shared between processes; each slot a run of envs_per_slot positions
  that an actor writes step by step),
- the replays' rings (herd/replay/registry.py: on the host, or on a GPU learner's device
  where a batch is gathered by index without leaving it),
- the one checkpoint format (`state_dict`: observations LZ4-packed per step, the other
  fields as arrays; a store on any device saves and loads the same format).

Storing capacity on the second axis means that reading a batch of positions with one
gather already gives the learner's time-major layout [time, B, ...], and that a run of
adjacent positions is a view [time, n, ...] of it (a slot, a lent batch).

On the host the store's tensors are also seen as numpy arrays (`arrays`, the same
memory): replays and actors work on those. With `compress_obs` (host only),
observations, by far the largest field for frames, are kept LZ4-compressed instead of in
a preallocated tensor, one LZ4 frame per time step, all steps of a trajectory in one bytes
object with their offsets beside it: a batch read decompresses every step, elite scoring
only the few steps it looks at. (One frame per trajectory compresses about 2x better, but
stacked Atari frames already shrink 20-45x per step, and then the float features are
most of a stored trajectory.) benchmarks/replay_sampling.py measures what this saves."""
from __future__ import annotations

import contextlib

import lz4.frame
import numpy as np
import torch

from herd.device_copies import DeviceCopies
from herd.trajectory import TrajectoryLayout, torch_dtype


class TrajectoryStore:
    def __init__(self, layout: TrajectoryLayout, capacity: int, device: torch.device | str | None = None,
                 shared: bool = False, compress_obs: bool = False, compression_level: int = 0,
                 copies: DeviceCopies | None = None):
        self.layout = layout
        self.capacity = capacity
        # device None: the host store, seen as numpy (`arrays`), which lends, compresses and
        # shares; a device (a GPU learner's, or the CPU's in tests of that path): tensors
        # written by copy_ and gathered there, reads returning tensors on it.
        self.on_host = device is None
        self.device = torch.device("cpu") if device is None else torch.device(device)
        if (compress_obs or shared) and not self.on_host:
            raise ValueError(f"a store on the device {self.device} is neither compressed nor shared between processes")
        self.compress_obs = compress_obs
        self.compression_level = compression_level
        # A device store's rollouts are copied on the copy stream of herd/device_copies.py
        # (the learner's one, shared by its replays); None: on the caller's stream.
        self.copies = copies
        fields = layout.fields()
        self.obs_shape, self.obs_dtype = fields["obs"]              # [T+1, *obs_shape]
        self.unroll_length = layout.unroll_length                    # T
        self.tensors: dict[str, torch.Tensor] = {}                   # field -> [time, capacity, ...]
        for name, (shape, dtype) in fields.items():
            if name == "obs" and compress_obs:
                continue
            tensor = torch.empty((shape[0], capacity, *shape[1:]), dtype=torch_dtype(dtype), device=self.device)
            if shared:
                tensor.share_memory_()
            tensor.fill_(layout.sentinel(name))
            self.tensors[name] = tensor
        self.arrays = self.numpy_views()
        self.packed_obs: list[bytes | None] = [None] * capacity if compress_obs else []
        self.offsets = np.zeros((capacity if compress_obs else 0, self.obs_shape[0] + 1), dtype=np.int64)
        # The policy version that acted, per position: on the host (the mixer reads it every batch).
        self.version = np.full(capacity, -1, dtype=np.int64)

    def numpy_views(self) -> dict[str, np.ndarray]:
        """The host tensors as numpy arrays sharing their memory (none on a device)."""
        return {name: tensor.numpy() for name, tensor in self.tensors.items()} if self.on_host else {}

    # A store travels to actor processes with its tensors shared (torch's reductions pass
    # their memory by file descriptor); numpy views of them would be pickled as copies, so
    # they are remade on arrival.
    def __getstate__(self) -> dict:
        return {key: value for key, value in self.__dict__.items() if key != "arrays"}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self.arrays = self.numpy_views()

    def positions(self, start: int, n: int) -> dict[str, np.ndarray]:
        """numpy views of positions start .. start + n - 1, field -> [time, n, ...] (host only):
        writing them writes the store."""
        if not self.on_host:
            raise ValueError(f"a store on the device {self.device} has no numpy views")
        return {name: array[:, start:start + n] for name, array in self.arrays.items()}

    def fill_sentinels(self, start: int, n: int) -> None:
        """Positions start .. start + n - 1 back to their sentinels (unwritten memory)."""
        for name, tensor in self.tensors.items():
            tensor[:, start:start + n].fill_(self.layout.sentinel(name))

    def write(self, position: int, trajectory: dict[str, np.ndarray], version: int) -> None:
        """trajectory: field -> [time, ...] for one environment (host arrays)."""
        self.put(position, {name: value[:, None] for name, value in trajectory.items()}, version)

    def write_run(self, start: int, rollout: dict[str, np.ndarray], version: int) -> None:
        """rollout: field -> [time, n, ...] host arrays, its n trajectories into positions
        start .. start + n - 1 (inside the capacity): one copy per field, not one per
        trajectory (on a device, one host-to-device copy per field)."""
        self.put(start, rollout, version)

    def put(self, start: int, rollout: dict[str, np.ndarray], version: int) -> None:
        """What write and write_run do: rollout field -> [time, n, ...] into start .. start + n - 1."""
        n = rollout["action"].shape[1]
        if self.on_host:
            for name, array in self.arrays.items():
                if isinstance(rollout[name], torch.Tensor):        # recorded on a GPU (herd/inference/records.py)
                    self.tensors[name][:, start:start + n].copy_(rollout[name])
                else:
                    array[:, start:start + n] = rollout[name]
        else:
            # One transfer per field (a slot's fields are C-contiguous: no host copy here),
            # asynchronous from page-locked slots; device to device for the fields an
            # inference server recorded on this device.
            with self.copies.copying() if self.copies is not None else contextlib.nullcontext():
                for name, tensor in self.tensors.items():
                    source = rollout[name]
                    if not isinstance(source, torch.Tensor):
                        source = torch.as_tensor(np.ascontiguousarray(source))
                    tensor[:, start:start + n].copy_(source, non_blocking=True)
        if self.compress_obs:
            obs = rollout["obs"]
            obs = obs.cpu().numpy() if isinstance(obs, torch.Tensor) else obs
            for e in range(n):
                self.packed_obs[start + e], self.offsets[start + e] = self.pack(obs[:, e])
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

    def device_index(self, indices) -> torch.Tensor:
        """Host indices [N] as an int64 tensor on the store's device."""
        return torch.as_tensor(np.asarray(indices, dtype=np.int64)).to(self.device, non_blocking=True)

    def read(self, positions: np.ndarray) -> dict:
        """field -> [time, B, ...] copies of the given positions, time-major (the learner's
        layout; `array[:, positions]` would come out batch-major in memory): on the host
        C-contiguous numpy arrays, on a device tensors there. One gather (Gather.read)."""
        return self.gather(positions).read()

    def gather(self, positions: np.ndarray) -> "Gather":
        """The read of `positions`, not made yet (a replay's share of a batch: the mixer
        joins the shares' positions and reads them once, into the batch)."""
        return Gather([(self, np.asarray(positions, dtype=np.int64) if self.on_host else self.device_index(positions))])

    def lend(self, positions: np.ndarray) -> "dict[str, np.ndarray] | Gather | None":
        """read(positions) without a copy, the positions valid until they are written again
        (the queue's sampler keeps them from that until they are given back):
        - on the host, when the positions are one ascending run (the on-policy queue's
          batches are): the observations a view into the store, obs [T+1, B, ...] strided
          in time; None when they are not such a run or the observations are LZ4-packed;
        - on a device, the read itself deferred (Gather): the learner gathers the batch
          straight into the tensors its step reads. Its gather is queued on the learner's
          stream before the positions are given back, and a later write's copy waits for
          that stream (herd/device_copies.py), so the gather reads what was lent."""
        if not self.on_host:
            return self.gather(positions)
        start = int(positions[0]) if len(positions) else 0
        if self.compress_obs or not np.array_equal(positions, np.arange(start, start + len(positions))):
            return None
        batch = {name: np.take(array, positions, axis=1) for name, array in self.arrays.items() if name != "obs"}
        batch["obs"] = self.arrays["obs"][:, start:start + len(positions)]
        return batch

    def column(self, name: str) -> torch.Tensor:
        """A stored field [time, capacity, ...] (the observations too, unless they are
        LZ4-packed: obs_at reads those)."""
        return self.tensors[name]

    def obs_at(self, positions, steps) -> torch.Tensor:
        """The observation of step steps[b] of trajectory positions[b], for each b: [B, ...]
        (a transition batch reads one or two steps of many trajectories); positions and
        steps [B] int64, numpy or tensors on the store's device."""
        if not self.compress_obs:
            return self.tensors["obs"][torch.as_tensor(steps), torch.as_tensor(positions)]
        return torch.from_numpy(np.stack([self.unpack_steps(p, (t,))[0]
                                          for p, t in zip(np.asarray(positions).tolist(), np.asarray(steps).tolist())]))

    def read_steps(self, positions: np.ndarray, steps: np.ndarray, names: tuple) -> dict:
        """Only the time steps `steps` [k] of the fields `names`: field -> [k, C, ...] for
        positions [C]. What elite scoring reads: a few steps of many trajectories (on a
        device, the frames never leave it)."""
        if not self.on_host:
            rows, columns = self.device_index(steps), self.device_index(positions)       # [k], [C]
            return {name: self.tensors[name].index_select(0, rows).index_select(1, columns) for name in names}
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
        return sum(t.numel() * t.element_size() for t in self.tensors.values()) + packed

    def host_copy(self, filled: int) -> TrajectoryStore:
        """The first `filled` positions in a store on the host (a device store's checkpoint)."""
        host = TrajectoryStore(self.layout, max(filled, 1))
        for name, tensor in self.tensors.items():
            host.tensors[name][:, :filled].copy_(tensor[:, :filled])
        host.version[:filled] = self.version[:filled]
        return host

    def state_dict(self, filled: int) -> dict:
        """The first `filled` positions; observations always LZ4-packed per step (checkpoints
        stay small), as uint8 arrays with their offsets: a checkpoint holds arrays, nothing
        that needs unpickling. The same format from a store on any device."""
        if not self.on_host:
            return self.host_copy(filled).state_dict(filled)
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
        if not self.on_host:
            filled = len(state["version"])
            host = TrajectoryStore(self.layout, max(filled, 1))
            host.load_state_dict(state)
            for name, tensor in self.tensors.items():
                if name in host.tensors:
                    tensor[:, :filled].copy_(host.tensors[name][:, :filled])
            self.version[:filled] = host.version[:filled]
            return
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


class Gather:
    """A batch of positions of stores on one device, not read yet: field -> [time, B, ...]
    once read, the parts (a replay's share each) joined on the batch axis in order. Reading
    writes each part straight into its columns of the batch: one copy of each frame, not a
    read per share and then their join. A device store lends its batches this way too
    (TrajectoryStore.lend), so that the learner gathers them straight into the tensors its
    step reads (a captured step's static inputs, herd/learner/learner.py) instead of into a
    batch of their own and then a copy there. columns: per-column tensors [B] on the
    device that travel beside (the replayed flags)."""

    def __init__(self, parts: list[tuple[TrajectoryStore, "np.ndarray | torch.Tensor"]], columns: dict | None = None):
        self.parts = parts            # (store, positions [n] int64: numpy for a host store, on its device otherwise)
        self.columns: dict[str, torch.Tensor] = columns or {}

    @staticmethod
    def join(gathers: list["Gather"]) -> "Gather":
        """The replays' shares as one batch (before any column is added: the mixer's)."""
        return Gather([part for gather in gathers for part in gather.parts])

    def with_columns(self, **columns: torch.Tensor) -> "Gather":
        return Gather(self.parts, {**self.columns, **columns})

    def into(self, out: dict) -> None:
        """Writes the batch into out (field -> [time, B, ...] numpy arrays on the host,
        tensors on a device; [B] for a column): per field and part one index_select into
        that part's columns of out (on the host through torch too: numpy's take into a
        strided destination is slower), or for LZ4-packed observations their steps
        unpacked there."""
        for name, destination in out.items():
            if name in self.columns:
                destination.copy_(self.columns[name], non_blocking=True)
                continue
            target = torch.from_numpy(destination) if isinstance(destination, np.ndarray) else destination
            b = 0
            for store, positions in self.parts:
                n = len(positions)
                if name == "obs" and store.compress_obs:
                    for e, position in enumerate(positions.tolist()):
                        destination[:, b + e] = store.unpack_obs(position)
                else:
                    index = torch.from_numpy(positions) if isinstance(positions, np.ndarray) else positions
                    torch.index_select(store.tensors[name], 1, index, out=target[:, b:b + n])
                b += n

    def read(self) -> dict:
        """The batch in arrays of its own: numpy on the host, tensors on a device (an eager
        step's)."""
        store = self.parts[0][0]
        B = sum(len(positions) for _, positions in self.parts)
        fields = store.layout.fields()
        if store.on_host:
            out = {name: np.empty((shape[0], B, *shape[1:]), dtype=dtype) for name, (shape, dtype) in fields.items()}
        else:
            out = {name: torch.empty((shape[0], B, *shape[1:]), dtype=torch_dtype(dtype), device=store.device)
                   for name, (shape, dtype) in fields.items()}
        self.into(out)
        return {**out, **self.columns}


def read_now(data: "dict | Gather") -> dict:
    """A replay's share as data: a Gather read into arrays of its own, data as it is."""
    return data.read() if isinstance(data, Gather) else data


class TrajectorySlots:
    """The actors' slots: num_slots x envs_per_slot positions, slot s holding positions
    s x envs_per_slot .. (s + 1) x envs_per_slot - 1, so one actor rollout is field ->
    [time, E, ...].

    Each field is one tensor [slot, time, E, ...] (the store's layout with its capacity
    split into slots, slot first): a slot's rollout is C-contiguous, so it leaves in one
    transfer per field (a GPU learner's copy from page-locked memory, herd/learner/ingest.py;
    Ray's out-of-band pickling), and a batch of positions inside one slot is a view of it.
    Positions across slots are one gather (read).

    Built in the main process, handed to actor processes as arguments (torch shares the
    memory by file descriptor, one per field, so nothing is copied and nothing is left in
    /dev/shm); passed between processes by index. shared=False: one process's slots (a Ray
    actor's)."""

    def __init__(self, layout: TrajectoryLayout, num_slots: int, envs_per_slot: int, shared: bool = True):
        self.layout = layout
        self.num_slots = num_slots
        self.envs_per_slot = envs_per_slot
        self.capacity = num_slots * envs_per_slot           # positions
        self.tensors: dict[str, torch.Tensor] = {}          # field -> [slot, time, E, ...]
        for name, (shape, dtype) in layout.fields().items():
            tensor = torch.empty((num_slots, shape[0], envs_per_slot, *shape[1:]), dtype=torch_dtype(dtype))
            if shared:
                tensor.share_memory_()
            tensor.fill_(layout.sentinel(name))
            self.tensors[name] = tensor
        self.arrays = {name: tensor.numpy() for name, tensor in self.tensors.items()}

    # As a store's (TrajectoryStore): the numpy views would be pickled as copies, so they are
    # left out and remade on arrival.
    __getstate__ = TrajectoryStore.__getstate__

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self.arrays = {name: tensor.numpy() for name, tensor in self.tensors.items()}

    def views(self, slot: int) -> dict[str, np.ndarray]:
        """numpy views of one slot, [time, E, ...] C-contiguous: writing them writes the slots."""
        return {name: array[slot] for name, array in self.arrays.items()}

    def reset(self, slot: int) -> None:
        """Refills a slot with sentinels, so a half-written slot can never pass as data."""
        for name, tensor in self.tensors.items():
            tensor[slot].fill_(self.layout.sentinel(name))

    def runs(self, positions: np.ndarray) -> list[tuple[int, int, int]]:
        """positions [B] as runs of adjacent positions inside one slot, in order: (slot,
        first position in the slot, length)."""
        E = self.envs_per_slot
        runs: list[tuple[int, int, int]] = []
        for position in np.asarray(positions).tolist():
            slot, e = divmod(position, E)
            if runs and runs[-1][0] == slot and runs[-1][1] + runs[-1][2] == e:
                runs[-1] = (slot, runs[-1][1], runs[-1][2] + 1)
            else:
                runs.append((slot, e, 1))
        return runs

    def read(self, positions: np.ndarray, out: dict[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
        """field -> [time, B, ...] C-contiguous copies of the given positions: one copy of
        each, a run of adjacent positions inside a slot at a time; into `out` (a batch of
        B positions read before) where given."""
        B = len(positions)
        runs = self.runs(positions)
        batch = {}
        for name, array in self.arrays.items():
            shape = (array.shape[1], B, *array.shape[3:])
            target = out[name] if out is not None and out[name].shape == shape else np.empty(shape, dtype=array.dtype)
            b = 0
            for slot, e, n in runs:
                np.copyto(target[:, b:b + n], array[slot, :, e:e + n])
                b += n
            batch[name] = target
        return batch

    def lend(self, positions: np.ndarray) -> dict[str, np.ndarray] | None:
        """read(positions) with the observations as a view into the slots, no copy, when
        the positions are one run inside one slot (the on-policy queue's batches of a
        rollout or less are): obs [T+1, B, ...], valid until the slot is written again (the
        queue keeps it from its actor until every position is given back). None otherwise."""
        runs = self.runs(positions)
        if len(runs) != 1:
            return None
        slot, e, n = runs[0]
        return {name: array[slot, :, e:e + n] if name == "obs" else array[slot, :, e:e + n].copy()
                for name, array in self.arrays.items()}

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors.values())
