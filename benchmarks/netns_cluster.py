"""herd's Ray actors across hosts on a real network stack: network namespaces joined by
shaped links (herd/cluster), a Ray head on host 0 (0 CPUs) and a worker node of
--host_cpus CPUs on each of hosts 1..N, each running --actors_per_host of herd's own Ray
actors (RolloutWorker: real envs, real model). Per configuration (hosts x link bandwidth x
link latency; latency comes from the harness's user-space delay line):

    rtt          TCP round trip between a worker host and host 0 (1 byte, p50)
    free         the learner replaced by a sink that takes every rollout at once: what the
                 actors (or the link) can deliver; hand-off latency = from an actor's return
                 to the sink holding the arrays (p50/p90/p99), i.e. Ray's transfer between nodes
    paced        a fixed-rate sink (--rate rollouts/s): a learner that trains at a known pace
    bytes/step   bytes host 0 received on its link per agent step (everything: the arrays,
                 Ray's messages), measured from the link's own counters
    lz4          the same with observations LZ4-compressed in the actor, decompressed by the sink
    cpu          the machine's busy cores while each sink ran (/proc/stat: every process, the
                 delay lines and Ray's included), so CPU-seconds per step can be read off
    host cores   with --host_cores and --head_cores: each worker host (and host 0) runs on its own
                 budget of cores (a cgroup quota, herd/cluster/cpu_budget.py) and the cores each
                 host used are counted apart (host_cores_used: {host index: cores})

and, with --learner_seconds, herd's real learner (`herd train --multiprocessing_backend=ray`)
on host 0 with the same actors, its steady frames/s from train.csv.

Without budgets all hosts share this machine's cores (2 here), so frames/s cannot grow with
hosts the way a real cluster's does: what grows is the network's share. With budgets each
host has its own cores (together no more than the machine's). The throughput model built
from these numbers is in docs/netns-cluster.md. Needs root (network namespaces).
Usage: python benchmarks/netns_cluster.py [--hosts 1,2,4] [--bandwidths none,100,30] [--latencies 0,1]
       [--seconds 12] [--learner_seconds 30]
Last line: netns_cluster: hosts=<n> frames_per_s=<x> p50_ms=<y> bytes_per_step=<z> (the first
configuration of the largest host count, free sink, no compression; with --sinks 0, herd's
learner, raw, and p50_ms=None). A record made with --sinks 0 holds herd's rows only:
netns_model.py takes each configuration's sinks from the newest record that has them."""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from herd.cluster.cpu_budget import BudgetError, check_cores  # noqa: E402
from herd.cluster.netns import LinkShape, NetnsCluster  # noqa: E402
from herd.cluster.ray_hosts import RayHosts, measure_rtt  # noqa: E402


# ---------------------------------------------------------------- inside host 0 (the driver)

def rx_bytes() -> int:
    """Bytes received on this namespace's link (ip netns exec mounts the namespace's /sys)."""
    return int(Path("/sys/class/net/eth0/statistics/rx_bytes").read_text())


# An idle cluster of up to 5 nodes kept 0.07-0.24 of this machine's cores busy; more, or
# that much busy before the cluster existed, is another load, which every number of the
# configuration carries (the hosts share the cores): netns_model.py leaves such a
# configuration out.
ANOTHER_LOAD_CORES = 0.5


def busy_seconds() -> float:
    """CPU-seconds the whole machine has spent busy since boot (every core; /proc/stat is
    not per namespace): all hosts share these cores."""
    fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = fields[3] + fields[4]                       # idle + iowait
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def busy_cores(seconds: float) -> float:
    """The machine's busy cores over the next `seconds`."""
    start, busy = time.monotonic(), busy_seconds()
    time.sleep(seconds)
    return round((busy_seconds() - busy) / (time.monotonic() - start), 3)


def host_cpu_seconds(usage_fds: dict[str, int]) -> dict[str, float]:
    """{host index: CPU-seconds that budgeted host has used} (cpuacct.usage), read through
    descriptors the harness opened for this driver: inside a namespace /sys/fs/cgroup is not
    mounted."""
    return {host: int(os.pread(fd, 64, 0)) / 1e9 for host, fd in usage_fds.items()}


def cores_used(before: dict[str, float], after: dict[str, float], seconds: float) -> dict[str, float] | None:
    """{host index: cores it used} between two host_cpu_seconds readings, None without budgets."""
    return {host: round((after[host] - before[host]) / seconds, 3) for host in before} or None


def inner(options: dict) -> dict:
    """Runs on host 0: the actors on the worker nodes, then each sink; returns the numbers."""
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "1"    # hosts' own addresses (ray_scaling sets 0: loopback)
    import numpy as np
    import ray
    from ray_scaling import StampedWorker, spec_and_layout, take_rollouts
    from herd.actors.actor import ActorSpec
    from herd.backends.ray_actors import WeightsBoard
    from herd.backends.ray_wire import pack_obs, unpack_obs
    from herd.models import build_model

    class CompressingWorker(StampedWorker):
        """herd's actor, its observations LZ4-compressed before they leave the node (what
        --ray_compress_obs does: herd/backends/ray_wire.py)."""

        def next_rollout(self):
            rollout, arrays, stamp = super().next_rollout()
            return rollout, pack_obs(arrays), stamp

    def sink(actors, rate, seconds, compressed):
        """Takes rollouts as they come (rate None) or one every 1/rate s, for `seconds`
        (ray_scaling.take_rollouts), measuring the link, the cores and the compression."""
        sizes = {"raw": 0, "packed": 0}

        def receive(arrays):
            if compressed:
                sizes["packed"] += len(arrays["obs"].data)
                sizes["raw"] += unpack_obs(arrays)["obs"].nbytes

        received, busy, host_busy = rx_bytes(), busy_seconds(), host_cpu_seconds(options["usage_fds"])
        # One at a time, oldest first, as herd's learner reads: the sink stands in for it.
        took = take_rollouts(actors, options["inflight"], rate, seconds, receive, one_at_a_time=True)
        elapsed, steps = took["elapsed"], took["steps"]
        received, busy = rx_bytes() - received, busy_seconds() - busy
        host_used = cores_used(host_busy, host_cpu_seconds(options["usage_fds"]), elapsed)
        ray.get(took["pending"])                # the calls still queued finish before the next sink starts
        lat = np.array(took["latencies_s"] or [float("nan")]) * 1e3
        return {"rollouts_per_s": round(took["taken"] / elapsed, 2), "frames_per_s": round(steps / elapsed, 1),
                "p50_ms": round(float(np.median(lat)), 2), "p90_ms": round(float(np.percentile(lat, 90)), 2),
                "p99_ms": round(float(np.percentile(lat, 99)), 2),
                "bytes_per_step": round(received / max(steps, 1), 1),
                "lz4_ratio": round(sizes["raw"] / sizes["packed"], 2) if sizes["packed"] else None,
                "busy_cores": round(busy / elapsed, 3),
                "host_cores_used": host_used}

    spec, layout = spec_and_layout(options["env"], options["envs"], options["unroll"])
    ray.init(address=options["address"], logging_level="ERROR", log_to_driver=False)
    board = WeightsBoard()
    board.publish(build_model(**spec.model_kwargs), 0)
    results = {}
    for compressed in (False, True) if options["lz4"] else (False,):
        worker = ray.remote(CompressingWorker if compressed else StampedWorker)
        count = options["hosts"] * options["actors_per_host"]
        actors = [worker.options(num_cpus=options["host_cpus"] / options["actors_per_host"],
                                 scheduling_strategy="SPREAD")
                  .remote(i, ActorSpec(**{**spec.__dict__, "seed": 1 + 10_000 * i}), layout,
                          options["inflight"] + 2, *board.newest()) for i in range(count)]
        ray.get([a.where.remote() for a in actors])
        idle_cores = busy_cores(3.0)                              # every node up, nothing asked of it
        sink(actors, None, 4.0, compressed)                       # warm-up: first forward passes, resets
        name = "lz4" if compressed else "raw"
        results[name] = {"free": sink(actors, None, options["seconds"], compressed), "idle_busy_cores": idle_cores}
        if options["rate"]:
            results[name]["paced"] = sink(actors, options["rate"], options["seconds"], compressed)
        for actor in actors:
            ray.kill(actor)
    ray.shutdown()
    return results


# ---------------------------------------------------------------- outside (the harness)

def outside_busy_cores(window_s: float = 3.0, settle_s: float = 30.0) -> float:
    """The machine's busy cores before a cluster exists (ANOTHER_LOAD_CORES). The previous
    configuration's processes take a few seconds to end, so it waits up to settle_s for a
    quiet window (a quarter of a core)."""
    deadline = time.monotonic() + settle_s
    while True:
        cores = busy_cores(window_s)
        if cores <= 0.25 or time.monotonic() > deadline:
            return cores


def configuration(hosts: int, bandwidth: float | None, latency_ms: float, args) -> dict:
    """One cluster of 1 + `hosts` hosts, every link at `bandwidth` Mbit/s and `latency_ms` one
    way: the sinks, then herd's learner."""
    outside = outside_busy_cores()
    if outside > ANOTHER_LOAD_CORES:
        print(f"warning: {outside} cores busy before the cluster started: another load; this "
              "configuration's numbers carry it (benchmarks/netns_model.py leaves it out)", file=sys.stderr, flush=True)
    budgets = budgets_of(hosts, args)
    with NetnsCluster(hosts + 1, LinkShape(bandwidth_mbit=bandwidth, latency_ms=latency_ms), cores=budgets) as net:
        ray = RayHosts(net, cpus=[0] + [args.host_cpus] * hosts)
        usage = {str(h.index): open(h.budget.usage_path()) for h in net.hosts if h.budget}
        try:
            ray.start()
            rtt = measure_rtt(net, 1, 0)
            options = {"address": ray.address, "hosts": hosts, "env": args.env, "envs": args.envs,
                       "unroll": args.unroll, "actors_per_host": args.actors_per_host, "host_cpus": args.host_cpus,
                       "inflight": args.inflight, "seconds": args.seconds, "rate": args.rate, "lz4": args.lz4,
                       "usage_fds": {host: f.fileno() for host, f in usage.items()}}
            sinks = {}
            if args.sinks:
                done = net.hosts[0].run([sys.executable, str(Path(__file__).resolve()), "--inner",
                                         json.dumps(options)],
                                        env={**ray.env(), "PYTHONPATH": f"{HERE.parent}:{HERE}"}, capture_output=True,
                                        text=True, timeout=600, pass_fds=list(options["usage_fds"].values()))
                if done.returncode != 0:
                    raise RuntimeError(f"the driver failed: {done.stderr[-2000:]}")
                sinks = json.loads(done.stdout.strip().splitlines()[-1])
            learner = real_learner(net, ray, hosts, args) if args.learner_seconds else None
            learner_lz4 = real_learner(net, ray, hosts, args, ["--ray_compress_obs=True"]) \
                if args.learner_seconds and args.lz4 else None
        finally:
            ray.close()
            for f in usage.values():
                f.close()
    return {"hosts": hosts, "bandwidth_mbit": bandwidth, "latency_ms": latency_ms, "link_kind": net.link_kind,
            "rtt_ms": rtt, "outside_busy_cores": outside, "host_cores": budgets,
            **sinks, "learner": learner, "learner_lz4": learner_lz4}


def budgets_of(hosts: int, args) -> list[float | None] | None:
    """Each host's cores ([host 0, host 1, ...]), or None: no budgets (the machine's cores shared)."""
    return [args.head_cores] + [args.host_cores] * hosts if args.host_cores else None


def first_update_logged(results: Path) -> bool:
    """herd logs its first update at once (log.txt is written line by line)."""
    return any("first update" in log.read_text(errors="replace") for log in results.glob("*/log.txt"))


def steady_window(rows: list[dict]) -> tuple[dict, dict] | None:
    """The (first, last) train.csv rows of the steady part: the last two thirds of the time
    from the first update to the last (start-up, which grows with hosts and thin links, left
    out); the first is the last row at or before that mark, so a window always spans it
    whole even where rows come in bursts after stalls (a thin link)."""
    if len(rows) < 2:
        return None
    first, last = float(rows[0]["wall_time"]), float(rows[-1]["wall_time"])
    mark = first + (last - first) / 3
    start = [r for r in rows if float(r["wall_time"]) <= mark][-1]
    return (start, rows[-1]) if start is not rows[-1] else None


def real_learner(net, ray, hosts: int, args, extra: tuple = ()) -> dict:
    """herd train on host 0 with the same actors, for --learner_seconds after its first
    update, then Ctrl+C; its steady rate from train.csv (steady_window) and the machine's
    busy cores over the same window."""
    import csv
    import tempfile
    # herd's results (its checkpoints: nothing the record needs) go, however the run ends
    with tempfile.TemporaryDirectory(prefix="netns_learner_", ignore_cleanup_errors=True) as tmp:
        results = Path(tmp)
        before = {h.index: h.link_bytes() for h in net.hosts}
        argv = [sys.executable, "-m", "herd.cli", "train", f"--env={args.env}", "--multiprocessing_backend=ray",
                f"--ray_address={ray.address}", f"--worker_count={hosts * args.actors_per_host}",
                f"--envs_per_worker={args.envs}", f"--r_f_steps={args.unroll}", f"--actor_cpus={args.host_cpus / args.actors_per_host:g}",
                "--tensorboard=False", "--environment_max_steps=100000000", "--learner_compile=False",
                "--verbose_learner_out_int=1", f"--results_dir={results}", *extra]
        launch = time.monotonic()
        process = net.hosts[0].popen(argv, env={**ray.env(), "PYTHONPATH": str(HERE.parent)}, cwd=HERE.parent,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)
        while process.poll() is None and not first_update_logged(results) and time.monotonic() - launch < 600:
            time.sleep(0.25)
        first_update_at = time.monotonic()
        def sample() -> tuple:
            """(monotonic, the machine's busy CPU-seconds, {budgeted host: its CPU-seconds})"""
            return time.monotonic(), busy_seconds(), {str(h.index): h.budget.usage_s() for h in net.hosts if h.budget}
        busy = [sample()]                                # once a second
        while process.poll() is None and time.monotonic() - first_update_at < args.learner_seconds:
            time.sleep(1.0)
            busy.append(sample())
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGINT)
        _, err = process.communicate(timeout=300)
        after = {h.index: h.link_bytes() for h in net.hosts}
        # {host: {rx, tx}} bytes over the whole run: a worker host's rx is mostly the weights its
        # actors pulled, from host 0 or from another node that has them (Ray fetches from any copy)
        moved = {str(i): {way: after[i][way] - before[i][way] for way in ("rx", "tx")} for i in before}
        received, sent = moved["0"]["rx"], moved["0"]["tx"]
        runs = [p for p in results.iterdir() if p.is_dir()]
        if not runs or not (runs[0] / "summary.json").exists():
            # herd failed (it writes summary.json however it stops): the campaign goes on
            return {"error": f"herd exited {process.returncode} without summary.json: {err[-1500:]}"}
        rows = list(csv.DictReader((runs[0] / "train.csv").open()))
        summary = json.loads((runs[0] / "summary.json").read_text())
    window = steady_window(rows)
    if window is None:
        return {"error": f"too few updates logged ({len(rows)}): {err[-500:]}"}
    start, end = window
    frames = float(end["env_step"]) - float(start["env_step"])
    seconds = float(end["wall_time"]) - float(start["wall_time"])
    # The busy samples nearest the window's ends (train.csv's first row is the first update).
    def at(wall_time: str) -> tuple:
        when = first_update_at + float(wall_time) - float(rows[0]["wall_time"])
        return min(busy, key=lambda sample: abs(sample[0] - when))
    (t0, b0, h0), (t1, b1, h1) = at(start["wall_time"]), at(end["wall_time"])
    steps = max(summary.get("environment_steps") or 1, 1)          # the whole run's, as the link bytes
    return {"frames_per_s": round(frames / seconds, 1), "updates": summary.get("training_steps"),
            "start_up_s": round(first_update_at - launch, 1), "steady_s": round(seconds, 1),
            "rows": [[round(float(r["wall_time"]), 2), int(float(r["env_step"]))] for r in rows],  # the whole curve
            "busy_cores": round((b1 - b0) / (t1 - t0), 3) if t1 > t0 else None,
            "host_cores_used": cores_used(h0, h1, t1 - t0) if t1 > t0 else None,
            "environment_steps": summary.get("environment_steps"),
            # rollouts that came with newer weights than their actor's previous one: the versions taken up
            "weights_taken": summary.get("actor_weights_taken"),
            "actor_restarts": summary.get("actor_restarts"),     # a restarted actor's first rollout is not counted above
            "restart_reasons": [line[-200:] for line in err.splitlines() if "restarting it" in line][:5],
            "bytes_per_step": round(received / steps, 1),
            # what host 0 sent per step: the weights the actors pulled (and Ray's messages)
            "sent_bytes_per_step": round(sent / steps, 1),
            "link_bytes": moved}


def refuse(message: str) -> None:
    """Bad input: one line, exit 2, before any cluster is made."""
    print(f"netns_cluster: {message}", file=sys.stderr)
    sys.exit(2)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--inner", help=argparse.SUPPRESS)
    parser.add_argument("--hosts", default="1,2", help="worker hosts (besides host 0, the learner's)")
    parser.add_argument("--bandwidths", default="none,100,30", help="Mbit/s of every link (none: unshaped)")
    parser.add_argument("--latencies", default="0", help="one-way delays of every link, ms (each a configuration)")
    parser.add_argument("--env", default="PongNoFrameskip-v4")
    parser.add_argument("--envs", type=int, default=4, help="environments per actor")
    parser.add_argument("--unroll", type=int, default=20, help="steps per rollout (T)")
    parser.add_argument("--actors_per_host", type=int, default=1)
    parser.add_argument("--host_cpus", type=float, default=1, help="Ray CPUs of each worker node (placement only)")
    parser.add_argument("--host_cores", type=float, default=0,
                        help="each worker host's own cores, a cgroup quota (0: none, all hosts share the machine's)")
    parser.add_argument("--head_cores", type=float, default=0,
                        help="host 0's own cores (the learner's or the sink's), with --host_cores")
    parser.add_argument("--inflight", type=int, default=2, help="queued calls per actor")
    parser.add_argument("--rate", type=float, default=2.0, help="the paced sink's rollouts/s (0: no paced sink)")
    parser.add_argument("--seconds", type=float, default=12)
    parser.add_argument("--lz4", type=int, default=1, help="also measure LZ4-compressed observations")
    parser.add_argument("--learner_seconds", type=float, default=0,
                        help="also run herd's real learner this long after its first update")
    parser.add_argument("--sinks", type=int, default=1,
                        help="measure the sinks (0: herd's learner alone, which needs --learner_seconds)")
    parser.add_argument("--record", default="", help="suffix of the results file")
    args = parser.parse_args()
    if not args.sinks and not args.learner_seconds:
        refuse("--sinks 0 measures herd's learner alone: give --learner_seconds too")
    if bool(args.head_cores) != bool(args.host_cores):
        refuse("give --host_cores and --head_cores together (each host its own cores, host 0's too), or neither")
    for hosts in (int(h) for h in args.hosts.split(",")):     # every configuration's sizes, before the first runs
        try:
            check_cores(budgets_of(hosts, args) or [])
        except BudgetError as err:
            refuse(f"--hosts {hosts}: {err}")
    if args.inner:
        print(json.dumps(inner(json.loads(args.inner))))
        return
    from common import print_table, record
    runs = []
    try:
        for hosts in (int(h) for h in args.hosts.split(",")):
            for bandwidth in args.bandwidths.split(","):
                for latency in (float(x) for x in args.latencies.split(",")):
                    runs.append(configuration(hosts, None if bandwidth == "none" else float(bandwidth), latency, args))
                    print(json.dumps(runs[-1]), flush=True)
    except KeyboardInterrupt:
        # The cluster of the configuration under way has been taken down (NetnsCluster's
        # exit); a campaign cut short records nothing (the finished ones are printed above).
        sys.exit(f"interrupted after {len(runs)} configuration(s): nothing recorded")
    rows = []
    for r in runs:
        for name in ("raw", "lz4"):
            for mode in ("free", "paced"):
                m = r.get(name, {}).get(mode)
                if m:
                    rows.append([r["hosts"], r["bandwidth_mbit"] or "-", r["latency_ms"], f"{r['rtt_ms']['p50_ms']:.3f}",
                                 name, mode, m["frames_per_s"], m["p50_ms"], m["p90_ms"], m["p99_ms"],
                                 m["bytes_per_step"], m["busy_cores"]])
        for name in ("learner", "learner_lz4"):
            if r.get(name):
                rows.append([r["hosts"], r["bandwidth_mbit"] or "-", r["latency_ms"], f"{r['rtt_ms']['p50_ms']:.3f}",
                             "lz4" if name == "learner_lz4" else "raw", "learner", r[name].get("frames_per_s"), "", "",
                             "", r[name].get("bytes_per_step"), r[name].get("busy_cores")])
    print_table(["hosts", "Mbit/s", "lat ms", "rtt ms", "obs", "sink", "frames/s", "p50 ms", "p90 ms", "p99 ms",
                 "bytes/step", "busy cores"], rows)
    path = record(f"netns_cluster_{args.env.split('-')[0]}{args.record}",
                  {"command": " ".join(["python", "benchmarks/netns_cluster.py", *sys.argv[1:]]),
                   "note": (f"each worker host has {args.host_cores:g} cores of its own and host 0 {args.head_cores:g} "
                            "(cgroup quotas)" if args.host_cores else "all hosts share this machine's cores")
                           + " (machine.load_average_1min: its load when recorded)",
                   "args": vars(args),
                   "runs": runs})
    print(f"recorded {path}")
    largest = [r for r in runs if r["hosts"] == max(x["hosts"] for x in runs)][0]
    if args.sinks:
        top = largest["raw"]["free"]
        print(f"netns_cluster: hosts={largest['hosts']} frames_per_s={top['frames_per_s']} "
              f"p50_ms={top['p50_ms']} bytes_per_step={top['bytes_per_step']}")
    else:      # herd's learner alone: its rate, and no hand-off latency (nothing times it)
        top = largest["learner"] or {}
        print(f"netns_cluster: hosts={largest['hosts']} frames_per_s={top.get('frames_per_s')} "
              f"p50_ms=None bytes_per_step={top.get('bytes_per_step')}")


if __name__ == "__main__":
    main()
