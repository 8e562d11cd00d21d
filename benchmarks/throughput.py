"""Training throughput against the environment-only ceiling, on this machine.

1. Ceiling: `workers` processes, each stepping `envs` environments with herd's own
   preprocessing and random actions, nothing else.
2. herd: `herd train` with the same workers and envs; its steady-state rate is read from
   train.csv after a warm-up, then the run is stopped with SIGINT.

3. With --peer MODE: Sample Factory 2.1.1 with the same workers and envs, from its own venv
   (peer_sample_factory.py), after herd, so the two never share the cores.

Frames are emulator frames (agent steps x frame skip). Prints a table and a last line
`herd_fps=<n> ceiling_fps=<n> ratio=<r>` (plus ` peer_fps=<n>` with --peer), and records the numbers in results/.
Usage: python benchmarks/throughput.py [--env PongNoFrameskip-v4] [--workers 2] [--envs 4] [--seconds 60] [--peer serial]
"""
from __future__ import annotations

import argparse
import shlex
import multiprocessing as mp
import tempfile
import time
from pathlib import Path


from common import print_table, read_csv, record, run_herd


def random_steps(env_id: str, envs: int, seconds: float, seed: int) -> int:
    from herd.envs import make_env
    group = [make_env(env_id, seed=seed + i) for i in range(envs)]
    for env in group:
        env.reset()
    steps, deadline = 0, time.monotonic() + seconds
    while time.monotonic() < deadline:
        for env in group:
            _, _, terminated, truncated, _ = env.step(env.action_space.sample())
            if terminated or truncated:
                env.reset()
            steps += 1
    return steps


def ceiling(env_id: str, workers: int, envs: int, seconds: float) -> float:
    """Agent steps per second of random play, all processes together."""
    with mp.get_context("spawn").Pool(workers) as pool:
        counts = pool.starmap(random_steps, [(env_id, envs, seconds, 1000 * w) for w in range(workers)])
    return sum(counts) / seconds


def steady_state_rate(train_rows: list[dict], warmup: float) -> float:
    """Agent steps per second between the first row after the warm-up and the last row."""
    rows = [r for r in train_rows if r["wall_time"] >= warmup]
    if len(rows) < 2:
        raise SystemExit("the training run logged too little to measure: run longer (--seconds)")
    return (rows[-1]["env_step"] - rows[0]["env_step"]) / (rows[-1]["wall_time"] - rows[0]["wall_time"])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--env", default="PongNoFrameskip-v4")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--envs", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=60, help="length of the training run")
    parser.add_argument("--warmup", type=float, default=20, help="seconds of training not measured")
    parser.add_argument("--frame_skip", type=int, default=4)
    parser.add_argument("--label", default="default", help="names the results file (e.g. the config tried)")
    parser.add_argument("--extra", default="", help="extra herd flags in one string, e.g. --extra='--batch_size=8'")
    parser.add_argument("--peer", default="none", choices=["none", "serial", "async", "default"],
                        help="also run Sample Factory 2.1.1 in this mode (serial is its fastest here)")
    parser.add_argument("--peer_seconds", type=float, default=120, help="length of the peer's run, start-up included")
    args = parser.parse_args()
    extra = shlex.split(args.extra)

    ceiling_steps = ceiling(args.env, args.workers, args.envs, seconds=15)
    herd_args = ["train", f"--env={args.env}", f"--worker_count={args.workers}", f"--envs_per_worker={args.envs}",
                 "--environment_max_steps=100000000", "--basic_verbose=False", "--verbose_learner_out_int=5",
                 "--tensorboard=False", *extra]
    with tempfile.TemporaryDirectory() as tmp:
        run_dir, _, code = run_herd(herd_args, Path(tmp), stop_after=args.seconds)
        herd_steps = steady_state_rate(read_csv(run_dir / "train.csv"), args.warmup)
    peer = None
    if args.peer != "none":
        from peer_sample_factory import PeerError, run_peer
        try:
            peer = run_peer(args.env, args.workers, args.envs, args.peer_seconds, args.peer)
        except PeerError as e:
            raise SystemExit(f"throughput: peer: {e}")
    ceiling_fps, herd_fps = ceiling_steps * args.frame_skip, herd_steps * args.frame_skip
    ratio = herd_fps / ceiling_fps
    rows = [["env-only ceiling (random actions)", f"{ceiling_steps:,.0f}", f"{ceiling_fps:,.0f}", "100%"],
            ["herd training", f"{herd_steps:,.0f}", f"{herd_fps:,.0f}", f"{100 * ratio:.1f}%"]]
    if peer:
        rows.append([f"Sample Factory 2.1.1 ({args.peer})", f"{peer['agent_steps_per_s']:,.0f}",
                     f"{peer['frames_per_s']:,.0f}", f"{100 * peer['frames_per_s'] / ceiling_fps:.1f}%"])
    print_table(["what", "agent steps/s", "frames/s", "of ceiling"], rows)
    record(f"throughput_{args.env}_{args.workers}x{args.envs}_{args.label}", {
        "env": args.env, "workers": args.workers, "envs_per_worker": args.envs, "herd_args": herd_args,
        "exit_code": code, "ceiling_fps": round(ceiling_fps), "herd_fps": round(herd_fps), "ratio": round(ratio, 4),
        **({"peer": peer, "peer_fps": round(peer["frames_per_s"]),
            "herd_over_peer": round(herd_fps / peer["frames_per_s"], 3)} if peer else {})})
    print(f"herd_fps={herd_fps:.0f} ceiling_fps={ceiling_fps:.0f} ratio={ratio:.3f}"
          + (f" peer_fps={peer['frames_per_s']:.0f}" if peer else ""))


if __name__ == "__main__":
    main()
