"""Bytes per stored transition of Ape-X's prioritized replay on Pong, measured.

Plays PongNoFrameskip-v4 with herd's preprocessing (4 stacked 84x84 grayscale frames)
and random actions, writes the trajectories (T = r_f_steps, Ape-X's layout) into the
replay's TrajectoryStore with and without LZ4, and divides the bytes it holds (plus the
sampler's priorities) by the transitions stored. A transition's frames are not copied:
each trajectory keeps its T+1 observations once, per-step LZ4 frames (so a stacked
observation still repeats 3 of its 4 frames from the previous step; LZ4 sees each step
alone and cannot remove that repetition).

Usage: python benchmarks/apex_replay_bytes.py [--steps 2000] [--unroll 20]
"""
from __future__ import annotations

import argparse

import numpy as np

from common import print_table, record

from herd.algos import APEX, trajectory_layout
from herd.envs import make_env
from herd.store import TrajectoryStore


def pong_trajectories(steps: int, unroll: int, seed: int = 0) -> list[dict]:
    env = make_env("PongNoFrameskip-v4", seed=seed)
    layout = trajectory_layout(APEX, unroll, env.observation_space.shape, "uint8", env.action_space.n, 512)
    rng = np.random.default_rng(seed)
    obs, _ = env.reset()
    out = []
    for _ in range(steps // unroll):
        data = {name: np.zeros(shape, dtype) for name, (shape, dtype) in layout.fields().items()}
        for t in range(unroll):
            data["obs"][t] = obs
            action = int(rng.integers(env.action_space.n))
            obs, reward, terminated, truncated, _ = env.step(action)
            data["action"][t], data["reward"][t], data["done"][t] = action, reward, terminated or truncated
            if terminated or truncated:
                obs, _ = env.reset()
        data["obs"][unroll] = obs
        out.append(data)
    env.close()
    return out, layout


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--unroll", type=int, default=20)
    args = parser.parse_args()
    trajectories, layout = pong_trajectories(args.steps, args.unroll)
    transitions = len(trajectories) * args.unroll
    rows, results = [], {}
    for compress in (False, True):
        storage = TrajectoryStore(layout, len(trajectories), compress_obs=compress)
        for position, data in enumerate(trajectories):
            storage.write(position, data, 0)
        tree_bytes = 8 * transitions               # the sampler's float64 priority per leaf
        per = (storage.nbytes() + tree_bytes) / transitions
        results["lz4" if compress else "raw"] = round(per, 1)
        rows.append(["LZ4 per step" if compress else "uncompressed", f"{per:,.0f}",
                     f"{4 * 84 * 84 * 2 / per:.1f}x"])
    print_table(["storage", "bytes per transition", "vs. storing s_t and s_t+n raw (56,448 B)"], rows)
    record("apex_replay_bytes_pong", {"command": f"python benchmarks/apex_replay_bytes.py --steps {args.steps} "
                                                 f"--unroll {args.unroll}", "transitions": transitions,
                                      "bytes_per_transition": results})


if __name__ == "__main__":
    main()
