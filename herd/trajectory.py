"""The layout of one trajectory and the shared-memory slots actors write them into.

A trajectory of unroll length T, for one environment, time-major. Every algorithm's
actors record the same five fields:

    obs               [T+1, *obs_shape]  uint8 frames or float32 vectors; obs[T] bootstraps
    action            [T]                int64; continuous (Box) actions: [T, A] float32, the policy's
                                         unclipped sample (the env clips it, see herd/envs/wrappers.py)
    reward            [T]                float32, after the env's reward clipping
    done              [T]                bool, the episode ended after this step (terminated or truncated)
    trunc_value       [T]                float32, behaviour value of the final observation where the
                                         episode was truncated (not terminated), else 0

and the algorithm adds the per-step outputs of its policy that its loss or replays need
(`step_fields`, from its builder in herd/algos/). IMPALA's, for example:

    behaviour_logits  [T, A]             float32
    behaviour_value   [T]                float32
    features          [T, F]             float32, the behaviour policy's feature vectors (elite replay)

With an LSTM core (--use_lstm) one more field holds what the trajectory STARTS from:

    core_state        [1, 2, L, H]       float32, the actor's (h, c) before step 0 (herd/models/core.py)

Slots hold one actor rollout: every field with an extra env axis after time, e.g.
obs [T+1, E, *obs_shape]. They are positions of one shared store (herd/store.py
TrajectorySlots), preallocated once, filled with sentinels, and passed between processes
by index.
"""
from __future__ import annotations

import queue
from dataclasses import dataclass

import numpy as np
import torch


@dataclass(frozen=True)
class Field:
    """One field of a trajectory: its shape per step (after the time axis), dtype, the
    sentinel that fills unwritten memory, and whether it has T+1 steps (obs), T, or, with
    `start_only`, one: the value at the trajectory's start (an LSTM state). Keeping a time
    axis of 1 lets slots, replays and batches treat it like every other field."""
    shape: tuple
    dtype: str
    sentinel: float | int | bool
    bootstrap: bool = False
    start_only: bool = False


def common_fields(obs_shape: tuple, obs_dtype: str, action_shape: tuple = (),
                  action_dtype: str = "int64") -> dict[str, Field]:
    return {
        "obs": Field(tuple(obs_shape), obs_dtype, 0, bootstrap=True),
        # Discrete actions: int64 [], sentinel -1; continuous: float32 [A], sentinel NaN.
        "action": Field(tuple(action_shape), action_dtype, -1 if action_dtype == "int64" else np.nan),
        "reward": Field((), "float32", np.nan),
        "done": Field((), "bool", False),
        "trunc_value": Field((), "float32", np.nan),
    }


@dataclass(frozen=True)
class TrajectoryLayout:
    unroll_length: int          # T
    obs_shape: tuple
    obs_dtype: str              # "uint8" or "float32"
    step_fields: tuple = ()     # ((name, Field), ...): the algorithm's per-step policy outputs
    action_shape: tuple = ()    # per step: () discrete, (A,) continuous
    action_dtype: str = "int64"  # "int64" discrete, "float32" continuous

    def field_specs(self) -> dict[str, Field]:
        return {**common_fields(self.obs_shape, self.obs_dtype, self.action_shape, self.action_dtype),
                **dict(self.step_fields)}

    def fields(self) -> dict[str, tuple[tuple, np.dtype]]:
        """name -> (shape with time first, dtype) for one environment's trajectory."""
        T = self.unroll_length
        return {name: ((T + 1 if f.bootstrap else 1 if f.start_only else T, *f.shape), np.dtype(f.dtype))
                for name, f in self.field_specs().items()}

    def sentinel(self, name: str):
        return self.field_specs()[name].sentinel

    def nbytes(self) -> int:
        """Bytes of one environment's trajectory."""
        return sum(int(np.prod(shape)) * dtype.itemsize for shape, dtype in self.fields().values())


def env_columns(views: dict[str, np.ndarray]) -> list[dict[str, np.ndarray]]:
    """One rollout, field -> [time, E, ...], as its E trajectories, field -> [time, ...]
    (views of the rollout's arrays, not copies): what a replay stores one at a time."""
    envs = views["action"].shape[1]
    return [{name: view[:, e] for name, view in views.items()} for e in range(envs)]


def stack_columns(trajectories: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """env_columns' inverse: trajectories, field -> [time, ...], as one rollout, field ->
    [time, n, ...] (a copy)."""
    return {name: np.stack([t[name] for t in trajectories], axis=1) for name in trajectories[0]}


def torch_dtype(dtype: np.dtype) -> torch.dtype:
    return torch.from_numpy(np.zeros(0, dtype=dtype)).dtype


class FreeSlots:
    """One actor's free slot indices, from the learner (put) to the actor (get): a one-way
    pipe, each index one write of 4 bytes. (An mp.Queue's put pickles into a buffer and
    wakes a feeder thread that writes it: several times the learner's host time per
    rollout.) Both ends travel to the actor; the learner's copy of the read end keeps the
    pipe open, so a put to a dead actor is lost, never an error (its slots are refilled when
    it is restarted, into a new FreeSlots)."""

    def __init__(self, context):
        self.reader, self.writer = context.Pipe(duplex=False)

    def put(self, slot: int) -> None:
        self.writer.send_bytes(int(slot).to_bytes(4, "little"))

    def get(self, timeout: float) -> int:
        """The next free index; queue.Empty after `timeout` seconds without one."""
        if not self.reader.poll(timeout):
            raise queue.Empty
        return int.from_bytes(self.reader.recv_bytes(), "little")

    def close(self) -> None:
        self.writer.close()
        self.reader.close()
