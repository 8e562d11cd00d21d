"""Ape-X on the Ray backend with a replay server, on a loopback multi-node Ray cluster.

The cluster (started here, 127.0.0.1 only, token auth): a head with 0 CPUs, where herd's
learner runs (as the Ray driver) and, by default, the replay server; and two worker nodes
of --node_cpus CPUs each, where the actors run. Two measurements, each one command:

learning (default): for each seed, `herd train --env CartPole-v1 --algorithm=apex
    --multiprocessing_backend=ray --replay_server=True` with Ape-X's vector-task defaults
    (170,000 environment steps; 2 actors x 8 envs), stopped with Ctrl+C if still running
    --limit seconds after launch; then `herd test` greedily (epsilon 0) over --episodes
    games. The acceptance: CartPole reaches 475, measured as the greedy test mean (and the
    least exploring actor's last-100-games average in training, recorded beside it).

--throughput: the same flags with the replay in the learner, then in the server, each
    run for --seconds after a --warmup (the first updates after the replay's fill-in),
    stopped with Ctrl+C: environment steps/s and learner updates/s over the measured
    window (from train.csv, one row every 10 updates), the CPU the learner's process and
    the server's used per update (hardware.csv), and the bytes the replay server received
    as rollouts and sent as batches (the learner's: the rollout bytes it read itself).

The machine is shared: every record holds the load average at its start and end.
Usage: python benchmarks/apex_ray.py [--seeds 1 2] [--throughput] [--extra='...']
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import secrets
import shlex
import sys
import tempfile
from pathlib import Path

# Before Ray is imported: its nodes on 127.0.0.1 only (herd/backends/ray_cluster.py says why).
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

from ray.cluster_utils import Cluster  # noqa: E402

from apex_cartpole import greedy_test  # noqa: E402
from common import print_table, read_csv, record, run_herd  # noqa: E402
from herd.backends.ray_cluster import restore_auth, use_token_auth  # noqa: E402

TARGET = 475.0
NODE = dict(node_ip_address="127.0.0.1", object_store_memory=200 * 2**20)


def start_cluster(node_cpus: float) -> Cluster:
    """Head (0 CPUs: the learner's node) + two worker nodes, all on 127.0.0.1; the herd
    processes started from here inherit the token."""
    cluster = Cluster(initialize_head=True, head_node_args=dict(num_cpus=0, include_dashboard=False, **NODE))
    for _ in range(2):
        cluster.add_node(num_cpus=node_cpus, **NODE)
    cluster.wait_for_nodes()
    return cluster


def where(summary: dict, cluster: Cluster) -> dict:
    workers = {node.node_id for node in cluster.worker_nodes}
    replay = summary.get("replay", {})
    return {"actor_nodes": summary.get("actor_nodes"),
            "actors_on_worker_nodes": bool(summary.get("actor_nodes")) and set(summary["actor_nodes"]) <= workers,
            "learner_on_head": summary.get("learner_node") == cluster.head_node.node_id,
            "replay_location": replay.get("location"),
            "replay_on_head": replay.get("node") == cluster.head_node.node_id, "replay": replay}


def learning(args, cluster: Cluster, flags: list[str]) -> None:
    runs, rows = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for seed in args.seeds:
            load = os.getloadavg()[0]
            run_dir, _, code = run_herd(["train", *flags, "--replay_server=True", f"--seed={seed}"],
                                        Path(tmp) / f"seed{seed}", stop_after=args.limit, timeout=args.limit + 300)
            summary = json.loads((run_dir / "summary.json").read_text())
            test = greedy_test(run_dir, args.episodes)
            run = {"seed": seed, "exit": code, "ended": summary["ended"], "train_seconds": summary["total_time_s"],
                   "env_steps": summary["environment_steps"], "updates": summary["training_steps"],
                   "least_exploring_avg100": summary.get("least_exploring_average_score"),
                   "greedy_test_mean": test["mean"], "greedy_test_std": test["std"], "greedy_test_min": test["min"],
                   "reached_475": test["mean"] >= TARGET, "load_average_1min_start": round(load, 2),
                   "load_average_1min_end": round(os.getloadavg()[0], 2), **where(summary, cluster)}
            runs.append(run)
            rows.append([seed, code, run["ended"], f"{run['train_seconds']:.0f}", run["env_steps"], run["updates"],
                         f"{run['least_exploring_avg100'] or float('nan'):.1f}",
                         f"{test['mean']:.1f} ± {test['std']:.1f}", "yes" if run["reached_475"] else "no",
                         f"{load:.1f}"])
            print(f"seed {seed}: greedy test mean {test['mean']:.1f}", file=sys.stderr, flush=True)
    print_table(["seed", "exit", "ended", "train s", "env steps", "updates", "least-exploring avg100",
                 f"greedy test ({args.episodes} games)", ">= 475", "load"], rows)
    reached = sum(r["reached_475"] for r in runs)
    print(f"greedy test mean >= 475: {reached} of {len(runs)}")
    record(f"apex_ray{args.tag}", {"command": command(args), "target": TARGET, "limit_seconds": args.limit,
                                   "cluster": cluster_text(args), "runs": runs, "reached_475": reached})


def window_rates(run_dir: Path, warmup: float, seconds: float) -> dict:
    """Steps/s and updates/s between the first and the last train.csv row of the window
    from `warmup` to `warmup + seconds` seconds of training."""
    rows = read_csv(run_dir / "train.csv")
    after = [r for r in rows if warmup <= r["wall_time"] <= warmup + seconds]
    if len(after) < 2:
        return {"env_steps_per_s": None, "updates_per_s": None, "window_s": 0.0}
    first, last = after[0], after[-1]
    seconds = last["wall_time"] - first["wall_time"]
    rates = {"env_steps_per_s": round((last["env_step"] - first["env_step"]) / seconds, 1),
             "updates_per_s": round((last["update"] - first["update"]) / seconds, 2), "window_s": round(seconds, 1)}
    # hardware.csv (every 5 s): the CPU the learner's and the replay server's processes used in the window.
    with open(run_dir / "hardware.csv") as f:
        rows = [r for r in csv.DictReader(f) if warmup <= float(r["time"]) <= warmup + seconds]
    for source in ("learner", "replay-server"):
        used = [float(r["value"]) for r in rows if r["source"] == source and r["metric"] == "cpu"]
        if used:
            percent = rates[f"{source}_cpu_percent"] = round(sum(used) / len(used), 1)
            rates[f"{source}_cpu_ms_per_update"] = round(10 * percent / rates["updates_per_s"], 2)
    return rates


def throughput(args, cluster: Cluster, flags: list[str]) -> None:
    runs, rows = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for served in (False, True):
            load = os.getloadavg()[0]
            run_dir, _, code = run_herd(["train", *flags, f"--replay_server={served}", f"--seed={args.seeds[0]}",
                                         "--verbose_learner_out_int=10", "--environment_max_steps=100000000"],
                                        Path(tmp) / f"served{served}", stop_after=args.warmup + args.seconds + 25)
            summary = json.loads((run_dir / "summary.json").read_text())
            run = {"replay_server": served, "exit": code, **window_rates(run_dir, args.warmup, args.seconds),
                   "load_average_1min_start": round(load, 2), "load_average_1min_end": round(os.getloadavg()[0], 2),
                   **where(summary, cluster)}
            runs.append(run)
            replay = run["replay"]
            rows.append(["server" if served else "learner", run["env_steps_per_s"], run["updates_per_s"],
                         run["window_s"], run.get("learner_cpu_ms_per_update"),
                         run.get("replay-server_cpu_ms_per_update", "-"), replay.get("rollout_bytes"),
                         replay.get("batch_bytes", "-"), f"{load:.1f}"])
    print_table(["replay in", "env steps/s", "updates/s", "window s", "learner CPU ms/update",
                 "server CPU ms/update", "rollout bytes", "batch bytes", "load"], rows)
    record(f"apex_ray_throughput{args.tag}", {"command": command(args), "cluster": cluster_text(args),
                                              "warmup_seconds": args.warmup, "seconds": args.seconds, "runs": runs})


def command(args) -> str:
    return "python benchmarks/apex_ray.py " + " ".join(a for a in sys.argv[1:])


def cluster_text(args) -> str:
    return (f"loopback Ray cluster: head 0 CPUs (learner, replay server), 2 worker nodes x {args.node_cpus:g} CPUs "
            "(actors), all on this machine's cores")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--episodes", type=int, default=100, help="greedy test games per seed")
    parser.add_argument("--limit", type=float, default=600.0, help="seconds after launch before Ctrl+C (learning)")
    parser.add_argument("--throughput", action="store_true", help="replay in the learner vs in the server")
    parser.add_argument("--seconds", type=float, default=60.0, help="measured seconds per throughput run")
    parser.add_argument("--warmup", type=float, default=20.0, help="training seconds before the measured window")
    parser.add_argument("--node_cpus", type=float, default=2.0, help="Ray CPUs of each worker node")
    parser.add_argument("--extra", default="", help="extra herd flags in one string")
    parser.add_argument("--tag", default="", help="suffix of the results file name")
    args = parser.parse_args()
    saved = {name: os.environ.get(name) for name in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN")}
    use_token_auth(secrets.token_hex(32))
    cluster = start_cluster(args.node_cpus)
    try:
        flags = ["--env", "CartPole-v1", "--algorithm=apex", "--multiprocessing_backend=ray",
                 f"--ray_address={cluster.address}", "--basic_verbose=False", "--tensorboard=False",
                 *shlex.split(args.extra)]
        (throughput if args.throughput else learning)(args, cluster, flags)
    finally:
        cluster.shutdown()
        restore_auth(saved)


if __name__ == "__main__":
    main()
