"""The cost of handing one finished trajectory from an actor to the learner, per transport:

    local          herd's local backend: the actor fills a shared-memory slot, sends its
                   index through its pipe; the learner takes numpy views of the slot
    ray-return     herd's Ray backend: the rollout is the return value of an actor call
                   (object ref), the learner keeps `inflight` calls queued per actor
    ray-channel    the alternative: Ray compiled graphs (shared-memory channels), one
                   execute() at a time
    ... -2nodes    the same with the actor on a second Ray node (loopback): the object
                   store copies the rollout across

A producer does nothing but hand off one slot after another (no env, no model), so the
numbers are the transport alone: µs per hand-off (wall time / hand-offs, with the queue
kept full), the latency from the producer's hand-off to the learner holding the arrays
(median, 90th percentile), and the bytes the transport copies per hand-off. The learner's
own copy into the replays is the same for every transport and is not counted.
Payloads: Pong (IMPALA, T=20, 4 envs: 2.4 MB) and CartPole (T=16, 16 envs: 12 KB).
On this 2-core machine producer and learner share the cores with everything else.
Usage: python benchmarks/handoff.py [--seconds 4] [--transports local,ray-return,...]
"""
from __future__ import annotations

import argparse
import os
import pickle
import secrets
import time

# Before Ray is imported: its nodes on 127.0.0.1 only (herd/backends/ray_cluster.py says why).
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

import numpy as np
import torch.multiprocessing as mp

from common import print_table, record
from herd.actors.actor import Rollout
from herd.algos import get_algorithm
from herd.algos.base import trajectory_layout
from herd.store import TrajectorySlots

PAYLOADS = {
    "pong": dict(T=20, E=4, obs_shape=(4, 84, 84), obs_dtype="uint8", actions=6, features=512),
    "cartpole": dict(T=16, E=16, obs_shape=(4,), obs_dtype="float32", actions=2, features=64),
}
INFLIGHT = 4      # queued hand-offs per producer (the slots of the local backend, the calls of Ray's)


def layout_of(name: str):
    p = PAYLOADS[name]
    return trajectory_layout(get_algorithm("impala"), p["T"], p["obs_shape"], p["obs_dtype"], p["actions"],
                             p["features"]), p["E"]


def summarize(latencies: list, count: int, seconds: float) -> dict:
    lat = np.array(latencies) * 1e6
    return {"handoffs": count, "us_per_handoff": round(seconds * 1e6 / max(count, 1), 1),
            "latency_p50_us": round(float(np.median(lat)), 1), "latency_p90_us": round(float(np.percentile(lat, 90)), 1)}


# ------------------------------------------------------------------ local: slot index through a pipe
def local_producer(slots, free, sender, stop) -> None:
    while not stop.is_set():
        try:
            slot = free.get(timeout=0.1)
        except Exception:
            continue
        sender.send(Rollout(slot, 0, 0, 1, []) + (time.monotonic(),))   # monotonic: one clock per machine


def run_local(payload: str, seconds: float) -> dict:
    layout, envs = layout_of(payload)
    context = mp.get_context("spawn")
    slots = TrajectorySlots(layout, INFLIGHT, envs)
    free, stop = context.Queue(), context.Event()
    for slot in range(INFLIGHT):
        free.put(slot)
    receiver, sender = context.Pipe(duplex=False)
    process = context.Process(target=local_producer, args=(slots, free, sender, stop), daemon=True)
    process.start()
    receiver.recv()   # warm: the producer is up
    latencies, count, start = [], 0, time.monotonic()
    while time.monotonic() - start < seconds:
        message = receiver.recv()
        views = slots.views(message[0])                     # what the learner ingests from
        latencies.append(time.monotonic() - message[-1])
        assert views["obs"].shape[1] == envs
        free.put(message[0])
        count += 1
    elapsed = time.monotonic() - start
    stop.set()
    process.join(5)
    message_bytes = len(pickle.dumps(Rollout(0, 0, 0, 1, [])))
    return {**summarize(latencies, count, elapsed), "bytes_copied": 0, "message_bytes": message_bytes}


# ------------------------------------------------------------------ Ray
class Producer:
    """A Ray actor handing off the same slot again and again (the transport's cost only)."""

    def __init__(self, payload: str):
        layout, envs = layout_of(payload)
        self.slots = TrajectorySlots(layout, 1, envs)

    def next(self, _=None):
        return Rollout(0, 0, 0, 1, []), self.slots.views(0), time.time()

    def node(self) -> str:
        import ray
        return ray.get_runtime_context().get_node_id()


def ray_returns(producer, seconds: float) -> tuple[list, int, float]:
    import ray
    calls = [producer.next.remote() for _ in range(INFLIGHT)]
    ray.get(calls)
    calls = [producer.next.remote() for _ in range(INFLIGHT)]
    latencies, count, start = [], 0, time.monotonic()
    while time.monotonic() - start < seconds:
        ready, calls = ray.wait(calls, num_returns=1)
        _, arrays, stamp = ray.get(ready[0])
        latencies.append(time.time() - stamp)
        calls.append(producer.next.remote())
        count += 1
        del arrays
    return latencies, count, time.monotonic() - start


def ray_channel(producer, seconds: float) -> tuple[list, int, float]:
    import ray
    from ray.dag import InputNode
    with InputNode() as given:
        dag = producer.next.bind(given)
    compiled = dag.experimental_compile()
    try:
        ray.get(compiled.execute(0))
        latencies, count, start = [], 0, time.monotonic()
        while time.monotonic() - start < seconds:
            _, arrays, stamp = ray.get(compiled.execute(0))
            latencies.append(time.time() - stamp)
            count += 1
            del arrays
        return latencies, count, time.monotonic() - start
    finally:
        compiled.teardown()


RAY_WAYS = {"ray-return": ray_returns, "ray-channel": ray_channel}


def run_ray(way: str, payload: str, seconds: float, nodes: int) -> dict:
    """nodes 1: the producer beside the learner (one private node); 2: on a second node."""
    import ray
    from ray.cluster_utils import Cluster
    from herd.backends.ray_cluster import use_token_auth
    use_token_auth(os.environ.get("RAY_AUTH_TOKEN") or secrets.token_hex(32))
    node = dict(node_ip_address="127.0.0.1", object_store_memory=300 * 2**20)
    cluster = Cluster(initialize_head=True, head_node_args=dict(num_cpus=0 if nodes == 2 else 1,
                                                                include_dashboard=False, **node))
    if nodes == 2:
        cluster.add_node(num_cpus=1, **node)
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, logging_level="WARNING")
    try:
        producer = ray.remote(num_cpus=1)(Producer).remote(payload)
        placed = ray.get(producer.node.remote())
        assert (placed != ray.get_runtime_context().get_node_id()) == (nodes == 2)
        latencies, count, elapsed = RAY_WAYS[way](producer, seconds)
    finally:
        ray.shutdown()
        cluster.shutdown()
    layout, envs = layout_of(payload)
    data = layout.nbytes() * envs
    # The arrays are written once into the producer node's object store (large objects; small
    # ones travel inside the reply, about as many bytes), once more into the learner's node's
    # store when that is another node (a channel writes them once into its shared memory).
    copies = 1 + (nodes == 2)
    return {**summarize(latencies, count, elapsed), "bytes_copied": copies * data}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--payloads", default="pong,cartpole")
    parser.add_argument("--transports", default="local,ray-return,ray-return-2nodes,ray-channel")
    args = parser.parse_args()
    rows, results = [], {}
    for payload in args.payloads.split(","):
        layout, envs = layout_of(payload)
        for transport in args.transports.split(","):
            try:
                if transport == "local":
                    result = run_local(payload, args.seconds)
                else:
                    way, _, where = transport.partition("-2nodes")
                    result = run_ray(way, payload, args.seconds, nodes=2 if transport.endswith("-2nodes") else 1)
            except Exception as err:      # a transport this Ray cannot run here: say so, measure the rest
                result = {"error": " ".join(str(err).split())[:300]}
            results[f"{payload}/{transport}"] = {"payload_bytes": layout.nbytes() * envs, **result}
            rows.append([payload, transport, f"{layout.nbytes() * envs:,}", result.get("us_per_handoff", "-"),
                         result.get("latency_p50_us", "-"), result.get("latency_p90_us", "-"),
                         f"{result['bytes_copied']:,}" if "bytes_copied" in result else result.get("error", "")[:60]])
    print_table(["payload", "transport", "rollout bytes", "µs/hand-off", "latency p50 µs", "p90 µs",
                 "bytes copied"], rows)
    record("handoff", {"seconds": args.seconds, "inflight": INFLIGHT, "results": results})


if __name__ == "__main__":
    main()
