"""Environment backends side by side: agent steps per second of random play in one process.

  gymnasium  herd's own stack (make_env), `envs` envs stepped one after the other
  ale sync   AleVectorEnvs, every env in every batch, `threads` C++ worker threads
  ale async  AleVectorEnvs, batches of `batch` envs, whichever finished first
  numpy      BatchedCartPole (CartPole only): all envs in one array operation per step

Atari games get the first four, CartPole the gymnasium stack and numpy, other tasks the
gymnasium stack alone.

Construction and start() are not timed. Frames are agent steps x 4 on Atari (frame skip). Besides
wall-clock rates, the CPU time of the whole process (all its threads) per 1000 steps says
how much work a step costs, which a busy machine disturbs less than the rates. The load
average is recorded too: rates taken on a busy machine are only indicative.
Prints a table and records results/env_backends.json.
Usage: python benchmarks/env_backends.py [--env PongNoFrameskip-v4] [--envs 8] [--threads 2] [--batch 4] [--seconds 10]
       python benchmarks/env_backends.py --env CartPole-v1 --envs 16
"""
from __future__ import annotations

import argparse
import os
import time

import numpy as np

from common import print_table, record


def gymnasium_rate(env_id: str, envs: int, seconds: float) -> tuple[float, float]:
    """-> (agent steps per second, CPU milliseconds per 1000 steps)."""
    from herd.envs import make_env
    group = [make_env(env_id, seed=i) for i in range(envs)]
    for env in group:
        env.reset()
    rng = np.random.default_rng(0)
    n = group[0].action_space.n
    steps, start, cpu = 0, time.perf_counter(), time.process_time()
    while time.perf_counter() - start < seconds:
        for env, action in zip(group, rng.integers(n, size=envs)):
            _, _, terminated, truncated, _ = env.step(int(action))
            if terminated or truncated:
                env.reset()
        steps += envs
    rate, cost = steps / (time.perf_counter() - start), 1e6 * (time.process_time() - cpu) / steps
    for env in group:
        env.close()
    return rate, cost


def vector_rate(backend: str, env_id: str, envs: int, threads: int, batch: int, seconds: float
                ) -> tuple[float, float]:
    """-> (agent steps per second, CPU milliseconds per 1000 steps) of an actor's env backend
    (herd/envs/actor_envs.py), stepped as an actor steps it: send the last batch's actions,
    receive the next batch."""
    from herd.envs import describe_env
    from herd.envs.actor_envs import make_actor_envs
    actions = describe_env(env_id).num_actions
    vec = make_actor_envs(backend, env_id, envs, seed=0, threads=threads, batch_size=batch, env_kwargs={})
    try:
        rows = len(vec.start().env_ids)
        rng = np.random.default_rng(0)
        steps, start, cpu = 0, time.perf_counter(), time.process_time()
        while time.perf_counter() - start < seconds:
            vec.send(rng.integers(actions, size=rows))
            rows = len(vec.recv().env_ids)
            steps += rows
        return steps / (time.perf_counter() - start), 1e6 * (time.process_time() - cpu) / steps
    finally:
        vec.close()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--env", default="PongNoFrameskip-v4")
    parser.add_argument("--envs", type=int, default=8)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--batch", type=int, default=4, help="rows per batch in async mode")
    parser.add_argument("--seconds", type=float, default=10, help="timed seconds per backend")
    args = parser.parse_args()

    from herd.envs.batched_cartpole import runs_batched
    from herd.envs.registry import env_kind

    load_before = os.getloadavg()[0]
    runs = {  # name: (threads, rows per batch, (steps/s, CPU ms per 1000 steps))
        "gymnasium (make_env)": (1, args.envs, gymnasium_rate(args.env, args.envs, args.seconds)),
    }
    if env_kind(args.env) == "atari":
        runs.update({
            "ale sync, 1 thread": (1, args.envs, vector_rate("ale_vector", args.env, args.envs, 1, 0, args.seconds)),
            "ale sync": (args.threads, args.envs, vector_rate("ale_vector", args.env, args.envs, args.threads, 0,
                                                              args.seconds)),
            "ale async": (args.threads, args.batch, vector_rate("ale_vector", args.env, args.envs, args.threads,
                                                                args.batch, args.seconds)),
        })
    if runs_batched(args.env):
        runs["numpy"] = (1, args.envs, vector_rate("numpy", args.env, args.envs, 1, 0, args.seconds))
    base = runs["gymnasium (make_env)"][2][0]
    skip = 4 if env_kind(args.env) == "atari" else 1     # frames per agent step
    rows = [[name, threads, batch, f"{rate:.0f}", f"{skip * rate:.0f}", f"{rate / base:.2f}", f"{cost:.0f}"]
            for name, (threads, batch, (rate, cost)) in runs.items()]
    print_table(["backend", "threads", "rows/batch", "steps/s", "frames/s", "x gymnasium", "cpu ms/1000 steps"], rows)
    load_after = os.getloadavg()[0]
    print(f"load average (1 min) before {load_before:.1f}, after {load_after:.1f} on {os.cpu_count()} CPUs")
    out = record("env_backends" if env_kind(args.env) == "atari" else f"env_backends_{args.env}", {
        "command": f"python benchmarks/env_backends.py --env {args.env} --envs {args.envs} --threads {args.threads} "
                   f"--batch {args.batch} --seconds {args.seconds}",
        "load_average_1min": [round(load_before, 2), round(load_after, 2)],
        # rates from a machine that others were using are indicative only
        "busy_machine": load_before >= 0.5 * (os.cpu_count() or 1),
        "results": [{"backend": name, "threads": threads, "rows_per_batch": batch, "steps_per_s": round(rate, 1),
                     "cpu_ms_per_1000_steps": round(cost, 1)}
                    for name, (threads, batch, (rate, cost)) in runs.items()],
    })
    print(f"recorded {out}")


if __name__ == "__main__":
    main()
