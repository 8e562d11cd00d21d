"""What an inference server writes into the actors' trajectories itself: the observations
it acts on and the actions and policy outputs it computed (--inference_records).

Without it, a frame reaches a GPU learner twice: the actor writes it into its slot and
into its request, the server copies the request to the GPU to act, and the learner later
copies the slot to the GPU to train. With it, the actor only writes the request: the
server, which holds the batch on its device already, writes each row's observation and
outputs into a store of the slots' layout on that same device (`on_device`, shared with
the learner's process), and the learner copies a rollout from there, device to device.
Actors then write only what the server does not hold: rewards, dones, truncation values
and the bootstrap observation obs[T] (which the server sees only as the next rollout's
obs[0], after this rollout was delivered). Each frame crosses to the GPU once, plus its
slot's last one. On a CPU the server writes straight into the actors' slots
(`in_slots`): the same trajectories, the copies done by the server instead of the actor.

Where a row goes travels with the request: the client writes, per row, its place in the
observations and its place in the step fields (`places`, from the actor's RolloutWriter):

    obs place   (slot * (T+1) + t) * E + env     into obs [S, T+1, E, ...] seen flat
    step place  (slot * T + t) * E + env         into the step fields [S, T, E, ...] seen flat

-1: nothing to record (a value request). The server writes a batch's rows before it
records the batch's event, and answers only once the event fired, so a rollout's rows are
in place when its actor delivers it."""
from __future__ import annotations

import numpy as np
import torch

from herd.store import TrajectorySlots
from herd.trajectory import TrajectoryLayout, torch_dtype

# A server output and the trajectory field it fills (IMPALA's step fields).
FIELD_OF_OUTPUT = {"actions": "action", "logits": "behaviour_logits", "value": "behaviour_value",
                   "features": "features"}
NOTHING = -1            # a place that records nothing


def recorded_fields(layout: TrajectoryLayout, outputs: tuple) -> tuple:
    """The fields a server with these outputs records: the observations and what of its
    outputs the layout holds."""
    fields = layout.fields()
    return ("obs", *(FIELD_OF_OUTPUT[o] for o in outputs if FIELD_OF_OUTPUT.get(o) in fields))


def recorded_by(records: "StepRecords | None") -> tuple:
    """The trajectory fields a server writing into `records` records itself, which its
    actors leave to it (none where nothing records)."""
    return tuple(records.tensors) if records is not None else ()


class StepRecords:
    """field -> tensor [S, time, E, ...] (the slots' layout: obs with T+1 steps, the step
    fields with T), where the servers write the rows they act on."""

    def __init__(self, tensors: dict[str, torch.Tensor], unroll_length: int, envs_per_slot: int,
                 on_host: bool = False):
        """on_host: the tensors are host memory, written in numpy (the actors' slots); else
        written with torch's indexed copies on their device (a GPU's mirror; the CPU's in
        tests of that path)."""
        self.tensors, self.on_host = tensors, on_host
        self.unroll_length, self.envs_per_slot = unroll_length, envs_per_slot
        self.device = tensors["obs"].device
        # The same memory seen flat, [S * time * E, ...]: a place is a row of it.
        self.flat = {name: t.view(-1, *t.shape[3:]) for name, t in tensors.items()}
        self.arrays = self.host_views()

    def host_views(self) -> dict:
        """The flat tensors as numpy arrays (the same memory), where written in numpy."""
        return {name: t.numpy() for name, t in self.flat.items()} if self.on_host else {}

    # Sent to server processes (CUDA tensors as IPC handles, host ones by file
    # descriptor): the flat views (pickled, numpy views would be copies) are remade there.
    def __getstate__(self) -> dict:
        return {key: value for key, value in self.__dict__.items() if key not in ("flat", "arrays")}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self.flat = {name: t.view(-1, *t.shape[3:]) for name, t in self.tensors.items()}
        self.arrays = self.host_views()

    @classmethod
    def in_slots(cls, slots: TrajectorySlots, fields: tuple) -> "StepRecords":
        """The actors' own slots (a server on the host writes where the actor would have)."""
        return cls({name: slots.tensors[name] for name in fields}, slots.layout.unroll_length, slots.envs_per_slot,
                   on_host=True)

    @classmethod
    def on_device(cls, layout: TrajectoryLayout, num_slots: int, envs_per_slot: int, fields: tuple,
                  device: torch.device) -> "StepRecords":
        """A mirror of the slots' `fields` on `device` (a GPU learner's), filled with sentinels."""
        specs = layout.fields()
        tensors = {}
        for name in fields:
            shape, dtype = specs[name]
            tensors[name] = torch.full((num_slots, shape[0], envs_per_slot, *shape[1:]), layout.sentinel(name),
                                       dtype=torch_dtype(dtype), device=device)
        return cls(tensors, layout.unroll_length, envs_per_slot)

    def write(self, places: np.ndarray, obs: torch.Tensor, outputs: dict) -> None:
        """places [N, 2] (obs place, step place) of a batch's rows; obs [N, ...] and
        outputs name -> [N, ...] on this store's device. Rows whose places are NOTHING
        are left out; the rest are written with one indexed copy per field, on the
        current stream."""
        keep = np.flatnonzero(places[:, 0] != NOTHING)
        if len(keep) == 0:
            return
        if self.on_host:
            self.write_on_host(places, keep, obs, outputs)
            return
        at = torch.from_numpy(np.ascontiguousarray(places[keep].T)).to(self.device, non_blocking=True)   # [2, k]
        rows = None if len(keep) == len(places) else torch.from_numpy(keep).to(self.device, non_blocking=True)

        def kept(t: torch.Tensor) -> torch.Tensor:
            return t if rows is None else t.index_select(0, rows)

        self.flat["obs"].index_copy_(0, at[0], kept(obs))
        for output, t in outputs.items():
            field = FIELD_OF_OUTPUT.get(output)
            if field in self.flat:
                self.flat[field].index_copy_(0, at[1], kept(t).to(self.flat[field].dtype))

    def write_on_host(self, places: np.ndarray, keep: np.ndarray, obs: torch.Tensor, outputs: dict) -> None:
        """write() into host memory, in numpy: a few fancy-indexed assignments cost a CPU
        server, which every actor waits on, less than as many torch ops."""
        every = len(keep) == len(places)
        obs_at, step_at = (places[:, 0], places[:, 1]) if every else (places[keep, 0], places[keep, 1])
        self.arrays["obs"][obs_at] = obs.numpy() if every else obs.numpy()[keep]
        for output, t in outputs.items():
            field = FIELD_OF_OUTPUT.get(output)
            if field in self.arrays:
                self.arrays[field][step_at] = t.numpy() if every else t.numpy()[keep]

    def rollout(self, slot: int, host: dict, copies) -> dict:
        """A delivered slot as the learner ingests it: the host slot's views `host` (field
        -> [time, E, ...]) with the recorded fields replaced by this store's, once the
        bootstrap observation obs[T] was copied here from the host slot (on the copy
        stream of `copies`, herd/device_copies.py: the slot goes back to its actor only
        after that copy, like after the rollout's own)."""
        views = dict(host)
        T = self.unroll_length
        with copies.copying(rollout=False):
            self.tensors["obs"][slot, T].copy_(torch.from_numpy(host["obs"][T]), non_blocking=True)
        for name, tensor in self.tensors.items():
            views[name] = tensor[slot]                               # [time, E, ...] on the device
        return views
