"""Training throughput against the environment-only ceiling, on this machine, in one run.

1. Ceilings: `workers` processes, each stepping `envs` environments with random actions
   and nothing else, once with each env backend: herd's own gymnasium preprocessing
   (one env after another in Python) and ale-py's C++ vector env (one thread per process).
2. herd: `herd train` with the same workers and envs, once per configuration in CONFIGS
   (defaults; on-policy like Sample Factory's APPO, per env backend and inference path, and
   per execution backend: `on-policy-ray` is `on-policy` with the actors on Ray; with both
   in one run, the table and the record give Ray's frames/s as a share of local's).
   Each rate is the steady state read from train.csv after a warm-up; the run is then
   stopped with SIGINT. From the run's hardware.csv, each role's processes (actors,
   inference servers, learner) busy as a share of one core each, after the warm-up: the
   actors' share says how much of their time they step (goal on a GPU box: 0.85; a
   threaded configuration's actor process per core of its emulator threads), the
   servers' the load that decides how many a machine needs; from its summary.json, the
   servers' mean batch (rows, microseconds from a request to its launch, from launch to
   answers, and from answers to the actors' reading them).
3. With --peer MODE: Sample Factory 2.1.1 with the same workers and envs, from its own venv
   (peer_sample_factory.py) or from --peer_site (wheels installed to a folder, on a machine
   without a registry), its learner on --peer_device, after herd, so that the two never
   share the cores; twice (--peer_variants all): with one epoch per rollout (each sample
   trained once, herd's gradient work per frame: the headline ratio) and as its Atari
   example ships (4 epochs: each sample trained 4 times); equal-work: the first alone.

Frames are emulator frames (agent steps x frame skip). Prints a table and a last line
`herd_fps=<n> ceiling_fps=<n> ratio=<r>` for the headline configuration against the
higher ceiling (plus ` peer_fps=<n>` with --peer), and records the numbers in results/.
Usage: python benchmarks/throughput.py [--env PongNoFrameskip-v4] [--workers 2] [--envs 4] [--seconds 60]
       [--configs on-policy,defaults,...] [--peer serial] [--peer_variants equal-work]
       [--peer_site DIR --peer_device gpu]
"""
from __future__ import annotations

import argparse
import json
import math
import multiprocessing as mp
import shlex
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from common import busy_shares, print_table, read_csv, record, run_herd

# IMPALA named, not left to the machine's default (APPO on a GPU: herd/profiles.py), so that
# every machine runs the same configuration, one gradient pass per frame as the peer's one epoch.
ON_POLICY = ["--algorithm=impala", "--replay_parameters=[{\"type\": \"queue\", \"capacity\": 1, \"sample_ratio\": 1}]",
             "--batch_size=32", "--r_f_steps=20", "--learner_compile=True"]
# name -> extra herd flags; the first is the headline. Everything not given is herd's default
# (C++ vector envs, each actor acting with its own CPU model, bf16 learner where fast).
CONFIGS = {
    "on-policy": ON_POLICY,                                   # queue only, like Sample Factory's APPO
    "on-policy-gymnasium-envs": [*ON_POLICY, "--env_backend=gymnasium"],
    "on-policy-async-envs": [*ON_POLICY, "--env_batch_size=2"],
    "on-policy-inference-server": [*ON_POLICY, "--actor_inference=server", "--device=cpu"],
    # The same actors as Ray actors on a private Ray on this machine (pip install -e '.[ray]').
    "on-policy-ray": [*ON_POLICY, "--multiprocessing_backend=ray"],
    "on-policy-lstm": [*ON_POLICY, "--use_lstm=True"],       # the same with an LSTM core (256) after the CNN
    "defaults": [],                                           # the seed's replay mix, batch 100, T 10
    # The inference server's options whose defaults on a GPU wait for a measurement there:
    # single-buffered actors (the GPU default double-buffers them; on 2 CPU cores that did not
    # pay: docs/benchmarks.md), CUDA graphs of every batch size of the server's forward pass,
    # and the actors writing every frame into their slots themselves (--inference_records=off:
    # each frame then crosses to the GPU twice; the GPU default records them in the server).
    # Run only when named in --configs.
    "on-policy-server-single-buffer": [*ON_POLICY, "--actor_inference=server", "--actor_double_buffer=False"],
    "on-policy-server-cuda-graphs": [*ON_POLICY, "--actor_inference=server", "--inference_cuda_graphs=True"],
    "on-policy-server-records-off": [*ON_POLICY, "--actor_inference=server", "--inference_records=off"],
    # A fixed number of servers for 16 actors, against the default's count chosen from their
    # measured load (herd/backends/inference_servers.py), still to compare on a GPU box.
    "on-policy-server-servers-1": [*ON_POLICY, "--actor_inference=server", "--inference_servers=1"],
    "on-policy-server-servers-2": [*ON_POLICY, "--actor_inference=server", "--inference_servers=2"],
    "on-policy-server-servers-4": [*ON_POLICY, "--actor_inference=server", "--inference_servers=4"],
    # Requests and answers polled instead of slept on: no wake-up latency, where cores are idle.
    "on-policy-server-spin": [*ON_POLICY, "--actor_inference=server", "--inference_doorbell=spin"],
    # No server process: each actor runs the server's batched path on the device itself
    # (herd/inference/in_actor.py), as many actors as above, or (threaded, see THREADED) the
    # same games in a few actor processes stepped by ale_vector's threads: Sebulba's shape.
    "on-policy-server-in-actor": [*ON_POLICY, "--actor_inference=in_actor"],
    "on-policy-server-in-actor-threaded": [*ON_POLICY, "--actor_inference=in_actor"],
    "on-policy-server-threaded": [*ON_POLICY, "--actor_inference=server"],
}
# Configurations that fold up to this many actors into one actor process: the same games
# (workers x envs), stepped by as many ale_vector threads, half of them per batch (they
# step while the policy acts on the other half: --env_batch_size).
THREADED = {"on-policy-server-in-actor-threaded": 8, "on-policy-server-threaded": 8}


def fold_of(name: str, workers: int) -> int:
    """How many of the command's actors configuration `name` folds into one process (1: none)."""
    return math.gcd(workers, THREADED.get(name, 1))


def per_core(busy: dict, threads: int) -> dict:
    """A threaded actor process steps its games on `threads` cores: its busy share per core
    of those, comparable with one actor process per core (goal 0.85)."""
    return {role: round(share / threads, 3) if role == "actors" else share for role, share in busy.items()}


def actor_shape(name: str, workers: int, envs: int) -> list[str]:
    """The flags that give configuration `name` its actors: `workers` processes of `envs`
    games, or (THREADED) the same games folded into fewer processes with emulator threads."""
    fold = fold_of(name, workers)
    if fold == 1:
        return [f"--worker_count={workers}", f"--envs_per_worker={envs}"]
    games = envs * fold
    return [f"--worker_count={workers // fold}", f"--envs_per_worker={games}", f"--env_threads={fold}",
            f"--env_batch_size={games // 2}", "--env_backend=ale_vector"]
# What runs without --configs: all but the server options above.
DEFAULT_CONFIGS = [name for name in CONFIGS if not name.startswith("on-policy-server-")]


# Sample Factory's Atari example trains every sample 4 times (4 epochs of 4 minibatches per
# rollout); herd's IMPALA trains it once. With one epoch SF does herd's gradient work per
# frame, so that ratio compares the frameworks rather than how much each learns per frame.
PEER_VARIANTS = {"one epoch": ["--num_epochs=1"], "as shipped, 4 epochs": []}
EQUAL_WORK = "one epoch"


def run_peers(env: str, workers: int, envs: int, seconds: float, mode: str, variants: list[str],
              site: Path | None, device: str) -> dict[str, dict]:
    """Sample Factory in each of `variants` (names of PEER_VARIANTS), one after the other:
    variant -> its record."""
    from peer_sample_factory import PeerError, run_peer
    peers = {}
    for variant in variants:
        try:
            peers[variant] = run_peer(env, workers, envs, seconds, mode, PEER_VARIANTS[variant], site=site,
                                      device=device)
        except PeerError as e:          # herd's numbers are still recorded, without the peer's
            print(f"throughput: peer ({variant}) not measured: {e}", file=sys.stderr)
    return peers


def random_steps(backend: str, env_id: str, envs: int, seconds: float, seed: int) -> int:
    """Agent steps of one process in `seconds` of random play."""
    from herd.envs import describe_env
    from herd.envs.actor_envs import make_actor_envs
    actions = describe_env(env_id).num_actions
    group = make_actor_envs(backend, env_id, envs, seed=seed, threads=1, env_kwargs={})
    rng = np.random.default_rng(seed)
    batch = group.start()
    steps, deadline = 0, time.monotonic() + seconds
    while time.monotonic() < deadline:
        group.send(rng.integers(actions, size=len(batch.env_ids)))
        batch = group.recv()
        steps += len(batch.env_ids)
    group.close()
    return steps


def ceiling(backend: str, env_id: str, workers: int, envs: int, seconds: float) -> float:
    """Agent steps per second of random play, all processes together."""
    with mp.get_context("spawn").Pool(workers) as pool:
        counts = pool.starmap(random_steps, [(backend, env_id, envs, seconds, 1000 * w) for w in range(workers)])
    return sum(counts) / seconds


def steady_state_rate(train_rows: list[dict], warmup: float) -> float:
    """Agent steps per second between the first row after the warm-up and the last row."""
    rows = [r for r in train_rows if r["wall_time"] >= warmup]
    if len(rows) < 2:
        raise SystemExit("the training run logged too little to measure: run longer (--seconds)")
    return (rows[-1]["env_step"] - rows[0]["env_step"]) / (rows[-1]["wall_time"] - rows[0]["wall_time"])


def answer_us(tallies: list[dict]) -> str:
    """The servers' mean batch: rows, microseconds from a request to its launch, from
    launch to answers and from answers to the actors' reading them ("" without servers)."""
    batches = sum(t["batches"] for t in tallies)
    if not batches:
        return ""
    rows = sum(t["batches"] * t["mean_rows"] for t in tallies) / batches
    requests = sum(t["batches"] * t["mean_requests"] for t in tallies) or 1
    wait = sum(t["batches"] * t["mean_requests"] * t["mean_wait_us"] for t in tallies) / requests
    taken = sum(t["batches"] * t["mean_requests"] * t["mean_taken_us"] for t in tallies) / requests
    answer = sum(t["batches"] * t["mean_answer_us"] for t in tallies) / batches
    return f"{rows:.1f}, {wait:.0f}, {answer:.0f}, {taken:.0f}"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--env", default="PongNoFrameskip-v4")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--envs", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=75, help="length of each training run")
    parser.add_argument("--warmup", type=float, default=30, help="seconds of each run not measured (start-up, compile)")
    parser.add_argument("--frame_skip", type=int, default=4)
    parser.add_argument("--configs", default=",".join(DEFAULT_CONFIGS),
                        help=f"comma-separated names of configurations to run, of: {', '.join(CONFIGS)}")
    parser.add_argument("--label", default="backends", help="names the results file")
    parser.add_argument("--extra", default="", help="extra herd flags for every configuration")
    parser.add_argument("--peer", default="none", choices=["none", "serial", "async", "default"],
                        help="also run Sample Factory 2.1.1 in this mode (serial is its fastest here)")
    parser.add_argument("--peer_seconds", type=float, default=120, help="length of the peer's run, start-up included")
    parser.add_argument("--peer_variants", default="all", choices=["all", "equal-work"],
                        help=f"all: {', '.join(PEER_VARIANTS)}; equal-work: {EQUAL_WORK} only (half the time)")
    parser.add_argument("--peer_site", default=None,
                        help="a folder the peer's wheels were installed to (pip install --target) instead of its venv")
    parser.add_argument("--peer_device", default="cpu", choices=["cpu", "gpu"], help="the peer's learner device")
    args = parser.parse_args()
    names = [name.strip() for name in args.configs.split(",") if name.strip()]
    unknown = [name for name in names if name not in CONFIGS]
    if unknown:
        raise SystemExit(f"throughput: unknown configuration(s) {unknown}; known: {list(CONFIGS)}")
    if args.warmup >= args.seconds:
        print(f"throughput: --warmup {args.warmup:g} leaves nothing of each {args.seconds:g} s run to measure: "
              f"make it shorter than --seconds", file=sys.stderr)
        sys.exit(2)

    ceilings = {backend: ceiling(backend, args.env, args.workers, args.envs, seconds=15) * args.frame_skip
                for backend in ("gymnasium", "ale_vector")}
    best_ceiling = max(ceilings.values())
    runs = {}
    for name in names:
        herd_args = ["train", f"--env={args.env}", *actor_shape(name, args.workers, args.envs),
                     "--environment_max_steps=100000000", "--basic_verbose=False", "--verbose_learner_out_int=5",
                     "--tensorboard=False", *CONFIGS[name], *shlex.split(args.extra)]
        with tempfile.TemporaryDirectory() as tmp:
            run_dir, _, code = run_herd(herd_args, Path(tmp), stop_after=args.seconds)
            rows = read_csv(run_dir / "train.csv")
            lags = [r["policy_lag"] for r in rows if r["wall_time"] >= args.warmup and r["policy_lag"] == r["policy_lag"]]
            hardware, summary = run_dir / "hardware.csv", run_dir / "summary.json"
            # The servers' batches (herd/inference/channels.py tally): rows, requests, launch to answers.
            batches = json.loads(summary.read_text()).get("inference_server_batches", []) if summary.exists() else []
            runs[name] = {"herd_args": herd_args, "exit_code": code,
                          "fps": round(steady_state_rate(rows, args.warmup) * args.frame_skip),
                          "policy_lag": round(float(np.mean(lags)), 2) if lags else None,
                          # Each role's processes, share of a core busy (goal for actors: 0.85).
                          "busy": per_core(busy_shares(read_csv(hardware), args.warmup) if hardware.exists() else {},
                                           fold_of(name, args.workers)),
                          "server_batches": batches}
    variants = list(PEER_VARIANTS) if args.peer_variants == "all" else [EQUAL_WORK]
    peers = (run_peers(args.env, args.workers, args.envs, args.peer_seconds, args.peer, variants,
                       Path(args.peer_site) if args.peer_site else None, args.peer_device)
             if args.peer != "none" else {})
    peer = peers.get(EQUAL_WORK)          # every "vs peer" ratio is against equal gradient work

    table = [[f"env-only ceiling, {backend} (random actions)", f"{fps / args.frame_skip:,.0f}", f"{fps:,.0f}",
              f"{100 * fps / best_ceiling:.0f}%", "", "", "", "", "", ""] for backend, fps in ceilings.items()]
    for name, run in runs.items():
        versus = f"{run['fps'] / peer['frames_per_s']:.2f}x" if peer else ""
        busy = run["busy"]
        table.append([f"herd: {name}", f"{run['fps'] / args.frame_skip:,.0f}", f"{run['fps']:,}",
                      f"{100 * run['fps'] / best_ceiling:.1f}%", run["policy_lag"], versus,
                      busy.get("actors", ""), busy.get("servers", ""), busy.get("learner", ""),
                      answer_us(run["server_batches"])])
    for variant, result in peers.items():
        table.append([f"Sample Factory 2.1.1 ({args.peer}, {variant})", f"{result['agent_steps_per_s']:,.0f}",
                      f"{result['frames_per_s']:,.0f}", f"{100 * result['frames_per_s'] / best_ceiling:.1f}%", "",
                      f"{result['frames_per_s'] / peer['frames_per_s']:.2f}x", "", "", "", ""])
    print_table(["what", "agent steps/s", "frames/s", "of ceiling", "policy lag", "vs peer", "actors busy",
                 "servers busy", "learner busy", "server batch: rows, us to launch, to answer, to read"], table)
    ray_share = None
    if "on-policy" in runs and "on-policy-ray" in runs:
        ray_share = round(runs["on-policy-ray"]["fps"] / runs["on-policy"]["fps"], 3)
        print(f"ray backend: {runs['on-policy-ray']['fps']:,} frames/s = {100 * ray_share:.0f}% of the local "
              f"backend's {runs['on-policy']['fps']:,} (same workers and envs)")
    headline = names[0]
    herd_fps = runs[headline]["fps"]
    record(f"throughput_{args.env}_{args.workers}x{args.envs}_{args.label}", {
        "env": args.env, "workers": args.workers, "envs_per_worker": args.envs, "seconds": args.seconds,
        "warmup": args.warmup, "ceilings_fps": {k: round(v) for k, v in ceilings.items()}, "runs": runs,
        "headline": headline, "herd_fps": herd_fps, "ceiling_fps": round(best_ceiling),
        "ratio": round(herd_fps / best_ceiling, 4),
        **({"ray_over_local": ray_share} if ray_share is not None else {}),
        **({"peers": peers, "peer_equal_work": EQUAL_WORK, "peer_fps": round(peer["frames_per_s"]),
            "herd_over_peer": round(herd_fps / peer["frames_per_s"], 3),
            **({"peer_fps_as_shipped": round(peers["as shipped, 4 epochs"]["frames_per_s"]),
                "herd_over_peer_as_shipped": round(herd_fps / peers["as shipped, 4 epochs"]["frames_per_s"], 3)}
               if "as shipped, 4 epochs" in peers else {})}
           if peer else {})})
    print(f"herd_fps={herd_fps:.0f} ceiling_fps={best_ceiling:.0f} ratio={herd_fps / best_ceiling:.3f}"
          + (f" peer_fps={peer['frames_per_s']:.0f}" if peer else ""))


if __name__ == "__main__":
    main()
