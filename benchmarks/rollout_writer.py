"""What the actor's rollout writer (herd/actors/rollout.py) costs per step, in one process:
the three writes of one step of E environments (the policy's outputs, the step's outcome,
the next observations) into trajectory slots in shared memory, Pong-sized by default
(frames [4, 84, 84] uint8, 6 actions, 512 features, unrolls of 20).

  lockstep  every batch holds all E environments in order (a synchronous backend): one
            slice per field
  grouped   the same batches written as an asynchronous backend's are: environments
            grouped by slot and step, indexed writes (the writer with lockstep off)

Both write the same bytes (tests/actors/test_rollout.py); the difference is the writer's own
cost beside the emulator (benchmarks/pipeline.py measures the whole actor side).
Usage: python benchmarks/rollout_writer.py [--envs 8] [--steps 20000]
Records benchmarks/results/rollout_writer.json.
"""
from __future__ import annotations

import argparse
import time

import numpy as np

from common import print_table, record

from herd.actors.rollout import RolloutWriter
from herd.algos.impala import impala_layout
from herd.interfaces import EnvBatch, PolicyStep
from herd.store import TrajectorySlots

T, ACTIONS, FEATURES, FRAMES = 20, 6, 512, (4, 84, 84)
SLOTS = 4


def microseconds_per_step(envs: int, steps: int, lockstep: bool) -> float:
    layout = impala_layout(unroll_length=T, obs_shape=FRAMES, obs_dtype="uint8", num_actions=ACTIONS,
                           feature_size=FEATURES)
    slots = TrajectorySlots(layout, SLOTS, envs)
    free = list(range(SLOTS))
    writer = RolloutWriter(slots.views, lambda: free.pop(0), T, envs)
    writer.lockstep = lockstep
    ids = np.arange(envs)
    frames = np.random.default_rng(0).integers(0, 255, (envs, *FRAMES), dtype=np.uint8)
    batch = EnvBatch(ids, frames, np.zeros(envs, np.float32), np.zeros(envs, np.bool_))
    out = PolicyStep(np.zeros(envs, np.int64), {"behaviour_logits": np.zeros((envs, ACTIONS), np.float32),
                                                "behaviour_value": np.zeros(envs, np.float32),
                                                "features": np.zeros((envs, FEATURES), np.float32)}, 0)
    writer.observe(batch)
    start = time.perf_counter()
    for _ in range(steps):
        writer.record_action(ids, out)
        for delivery in writer.record_outcome(batch, {}):
            free.append(delivery.slot)          # the learner hands each slot back at once
        writer.observe(batch)
    return (time.perf_counter() - start) / steps * 1e6


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--envs", type=int, default=8)
    parser.add_argument("--steps", type=int, default=20000)
    args = parser.parse_args()
    # Alternated, twice each: load from other processes falls on both alike.
    times = {"lockstep": [], "grouped": []}
    for _ in range(2):
        for name in times:
            times[name].append(microseconds_per_step(args.envs, args.steps, name == "lockstep"))
    best = {name: min(values) for name, values in times.items()}
    print_table(["writes", "us per step of all envs (best of 2)", "x grouped"],
                [[name, f"{us:.1f}", f"{best['grouped'] / us:.2f}"] for name, us in best.items()])
    record("rollout_writer", {"command": f"python benchmarks/rollout_writer.py --envs {args.envs} --steps {args.steps}",
                              "envs": args.envs, "unroll": T, "frames": list(FRAMES),
                              "microseconds_per_step": {name: [round(v, 2) for v in values]
                                                        for name, values in times.items()}})


if __name__ == "__main__":
    main()
