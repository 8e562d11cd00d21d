"""How the Ray backend's actors scale with the nodes of a cluster, simulated on loopback.

For N in --nodes (1, 2, 4, 8): a Ray cluster on 127.0.0.1 with a head (the learner's
node: 0 CPUs, so no actor runs there) and N worker nodes of --node_cpus CPUs, each node
running `actors_per_node` of herd's own Ray actors (herd/backends/ray_actors.py:
RolloutWorker, real envs, real model, the weights published once). The learner is replaced
by a sink that takes one rollout every 1/--rate seconds (a learner that trains at a fixed
pace), through the same queued calls as the backend (--inflight per actor). Recorded per N:

    offered    the sink's rate (rollouts/s), and what it got (a sink faster than the actors
               gets less: then the actors are the bottleneck)
    env steps/s  agent steps the sink received per second, all actors together
    latency    from an actor's return to the sink holding the arrays (median, 90th pct): the
               wait in Ray's object store plus the transfer between nodes
    actors/s   the unthrottled rate of the same actors (a sink that takes everything), i.e.
               what a cluster of N such nodes can feed a fast learner

On this 2-core machine all nodes share the same two cores, so the steps/s cannot grow
with N here: what the numbers show is the transport's and Ray's per-node overhead as the
cluster grows (a real cluster adds cores with every node). Timings are noisy on a shared machine.
Usage: python benchmarks/ray_scaling.py [--nodes 1,2,4,8] [--env CartPole-v1] [--seconds 15] [--rate 100]
"""
from __future__ import annotations

import argparse
import os
import secrets
import time

# Before Ray is imported: its nodes on 127.0.0.1 only (herd/backends/ray_cluster.py says why).
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

import numpy as np  # noqa: E402
import ray  # noqa: E402
from ray.cluster_utils import Cluster

from common import print_table, record  # noqa: E402
from herd.algos import get_algorithm
from herd.algos.base import trajectory_layout
from herd.backends.ray_actors import RolloutWorker, WeightsBoard
from herd.backends.ray_cluster import use_token_auth
from herd.actors.actor import ActorSpec
from herd.envs import describe_env
from herd.models import build_model


class StampedWorker(RolloutWorker):
    """herd's actor, with the wall time of each return (for the latency)."""

    def next_rollout(self):
        rollout, arrays = super().next_rollout()
        return rollout, arrays, time.time()


def spec_and_layout(env: str, envs: int, unroll: int) -> tuple[ActorSpec, object]:
    info = describe_env(env)
    algorithm = get_algorithm("impala")
    feature = 512 if info.obs_dtype == "uint8" else 64
    network = "nature_cnn" if info.obs_dtype == "uint8" else "mlp"
    model_kwargs = dict(network=network, obs_shape=tuple(info.obs_shape), obs_dtype=info.obs_dtype,
                        num_actions=info.num_actions, feature_size=feature, use_feature_layer=False,
                        hidden_sizes=(64, 64))
    layout = trajectory_layout(algorithm, unroll, info.obs_shape, info.obs_dtype, info.num_actions, feature)
    spec = ActorSpec(env_id=env, env_kwargs={}, model_kwargs=model_kwargs, envs_per_worker=envs,
                     unroll_length=unroll, seed=1)
    return spec, layout


def take_rollouts(actors: list, inflight: int, rate: float | None, seconds: float,
                  receive=lambda arrays: None, one_at_a_time: bool = False) -> dict:
    """The sink: keeps `inflight` calls queued on every actor and takes their rollouts at
    `rate` per second (None: as fast as they come) for `seconds`, handing each one's arrays
    to `receive`. one_at_a_time: wait without fetching, then fetch the oldest finished
    rollout alone, as herd's learner reads (herd/backends/ray_pool.py); otherwise Ray's
    wait starts fetching every queued rollout at once. Returns {'latencies_s': [return ->
    taken], 'steps', 'taken', 'elapsed', 'pending': the refs of the calls still queued}."""
    owner = {}
    for index, actor in enumerate(actors):
        for _ in range(inflight):
            owner[actor.next_rollout.remote()] = index
    latencies, steps, taken = [], 0, 0
    start = time.monotonic()
    while (now := time.monotonic()) - start < seconds:
        if rate is not None and taken >= (now - start) * rate:
            time.sleep(min(0.002, 1 / rate))
            continue
        # owner is in call order, and wait returns ready refs in the order given: the oldest.
        ready, _ = ray.wait(list(owner), num_returns=1, timeout=0.5, fetch_local=not one_at_a_time)
        if not ready:
            continue
        rollout, arrays, stamp = ray.get(ready[0])
        receive(arrays)
        latencies.append(time.time() - stamp)
        steps += rollout.steps
        taken += 1
        index = owner.pop(ready[0])
        owner[actors[index].next_rollout.remote()] = index
    return {"latencies_s": latencies, "steps": steps, "taken": taken, "elapsed": time.monotonic() - start,
            "pending": list(owner)}


def sink(actors: list, inflight: int, rate: float | None, seconds: float) -> dict:
    """Takes rollouts at `rate` per second (None: as fast as they come) for `seconds`."""
    took = take_rollouts(actors, inflight, rate, seconds)
    elapsed = took["elapsed"]
    lat = np.array(took["latencies_s"] or [float("nan")]) * 1e3
    return {"rollouts_per_s": round(took["taken"] / elapsed, 1), "env_steps_per_s": round(took["steps"] / elapsed),
            "latency_p50_ms": round(float(np.median(lat)), 2), "latency_p90_ms": round(float(np.percentile(lat, 90)), 2)}


def run(nodes: int, args) -> dict:
    spec, layout = spec_and_layout(args.env, args.envs, args.unroll)
    node = dict(node_ip_address="127.0.0.1", object_store_memory=150 * 2**20)
    cluster = Cluster(initialize_head=True, head_node_args=dict(num_cpus=0, include_dashboard=False, **node))
    for _ in range(nodes):
        cluster.add_node(num_cpus=args.node_cpus, **node)
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, logging_level="WARNING", log_to_driver=False)
    try:
        board = WeightsBoard()
        board.publish(build_model(**spec.model_kwargs), 0)
        worker = ray.remote(StampedWorker)
        count = nodes * args.actors_per_node
        actors = [worker.options(num_cpus=args.node_cpus / args.actors_per_node, scheduling_strategy="SPREAD")
                  .remote(i, ActorSpec(**{**spec.__dict__, "seed": 1 + 10_000 * i}), layout, args.inflight + 1,
                          *board.newest()) for i in range(count)]
        placed = ray.get([a.where.remote() for a in actors])
        spread = len({p["node"] for p in placed})
        sink(actors, args.inflight, None, 3.0)                 # warm-up: first forward passes, env resets
        free = sink(actors, args.inflight, None, args.seconds)
        paced = sink(actors, args.inflight, args.rate, args.seconds)
        for actor in actors:
            ray.kill(actor)
    finally:
        ray.shutdown()
        cluster.shutdown()
    return {"nodes": nodes, "actors": count, "nodes_used": spread, "unthrottled": free, "paced": paced}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nodes", default="1,2,4,8")
    parser.add_argument("--env", default="CartPole-v1")
    parser.add_argument("--envs", type=int, default=16, help="environments per actor")
    parser.add_argument("--unroll", type=int, default=16, help="steps per rollout (T)")
    parser.add_argument("--actors_per_node", type=int, default=1)
    parser.add_argument("--node_cpus", type=float, default=1)
    parser.add_argument("--inflight", type=int, default=4, help="queued calls per actor")
    parser.add_argument("--rate", type=float, default=10, help="the sink's pace, rollouts per second (below what the actors make: the sink is the bottleneck)")
    parser.add_argument("--seconds", type=float, default=10)
    args = parser.parse_args()
    use_token_auth(secrets.token_hex(32))
    runs = [run(int(n), args) for n in args.nodes.split(",")]
    rows = [[r["nodes"], r["actors"], r["nodes_used"], r["unthrottled"]["env_steps_per_s"],
             r["unthrottled"]["latency_p50_ms"], f"{args.rate:g}", r["paced"]["rollouts_per_s"],
             r["paced"]["env_steps_per_s"], r["paced"]["latency_p50_ms"], r["paced"]["latency_p90_ms"]] for r in runs]
    print_table(["nodes", "actors", "nodes used", "actors steps/s (free)", "latency p50 ms (free)", "sink rate",
                 "got /s", "steps/s", "latency p50 ms", "p90 ms"], rows)
    record(f"ray_scaling_{args.env}", {"args": vars(args), "runs": runs})


if __name__ == "__main__":
    main()
