"""Time to solve Pong: the average score of the last 100 games against wall time from
launch and emulator frames, until it reaches the target (20 by default) or time runs out.

Meant for a GPU machine (the README's headline): `python benchmarks/pong.py --minutes 5`
runs `herd train` with herd's Atari defaults (herd/profiles.py) and the actors laid out as
below (the batched inference server on the GPU, the C++ vector env backend, one actor per
core). `--extra` adds or overrides herd flags. `--defaults` runs exactly what a user gets
with no flag:
  python benchmarks/pong.py --defaults --minutes 40 --tag _defaults
`--frames N` ends the run after N emulator frames (agent steps x 4) with the learning-rate
schedule of a default-length run, so that a run measured in frames learns as the default
run does up to that point; the frames-to-20 record (docs/benchmarks.md):
  python benchmarks/pong.py --defaults --extra "--algorithm=appo --device=cpu" --frames 5000000 --minutes 200
`--keep DIR` keeps the run folder there (its episodes.csv grows while the run goes on).
Writes benchmarks/results/pong_<device><tag>.json with the whole curve (every game), the
frames and seconds at which the 100-game average first reaches each of THRESHOLDS, the
average at every 5 minutes, the policy lag (mean and max), how many of the last 100 games
were won 21-0, the run's resolved config and its log tail.
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import tempfile
from pathlib import Path

from common import moving_averages, print_table, read_csv, record, run_herd

FRAME_SKIP = 4
THRESHOLDS = (-15.0, 0.0, 10.0, 18.0, 20.0)


def gpu_config(workers: int) -> list[str]:
    """herd's Atari defaults for learning (herd/profiles.py), with the actors laid out for
    one GPU and `workers` cores: the C++ vector env backend in env batches of 4."""
    return ["--env=PongNoFrameskip-v4", "--device=auto", "--actor_inference=auto", "--env_backend=ale_vector",
            f"--worker_count={workers}", "--envs_per_worker=8", "--env_batch_size=4", "--env_threads=1"]


def curve(episodes: list[dict], launch: float, window: int = 100) -> list[dict]:
    """The moving average after every game: seconds from launch, frames, average."""
    return [{"seconds": round(row["unix_time"] - launch, 1), "frames": int(row["env_step"]) * FRAME_SKIP,
             "average": round(average, 2), "games": games} for row, average, games in moving_averages(episodes, window)]


def first_reaching(full: list[dict], thresholds=THRESHOLDS) -> dict[str, dict | None]:
    """For each threshold, the first point of the 100-game average at or above it (None: never)."""
    return {f"{t:g}": next(({"frames": p["frames"], "seconds": p["seconds"]} for p in full if p["average"] >= t),
                           None) for t in thresholds}


def lag_of(train_rows: list[dict]) -> dict:
    """The policy lag over the run (train.csv: each row's interval mean and max, in updates)."""
    means = [r["policy_lag"] for r in train_rows if r.get("policy_lag") == r.get("policy_lag")]
    maxes = [r["policy_lag_max"] for r in train_rows if r.get("policy_lag_max") == r.get("policy_lag_max")]
    return {"mean": round(sum(means) / len(means), 2) if means else None, "max": max(maxes) if maxes else None}


def shutouts(episodes: list[dict], window: int = 100) -> int:
    """Games won 21-0 among the last `window`: a game that scores 21 won every rally,
    the opening one too (docs/benchmarks.md, "What the runs that stop at 19-19.6 lose")."""
    return sum(1 for row in episodes[-window:] if float(row["score"]) >= 21)


def minute_marks(full: list[dict], minutes: float, every: int = 5) -> dict[int, float | None]:
    """The 100-game average at every `every` minutes from launch (None before 100 games)."""
    marks = {}
    for minute in range(every, int(minutes) + 1, every):
        before = [p for p in full if p["seconds"] <= 60 * minute]
        marks[minute] = before[-1]["average"] if before else None
    return marks


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--minutes", type=float, default=5.0, help="stop the run after this long")
    parser.add_argument("--target", type=float, default=20.0)
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--extra", default="", help="extra herd flags in one string")
    parser.add_argument("--tag", default="", help="suffix of the results file name, to keep runs apart")
    parser.add_argument("--frames", type=int, default=None,
                        help="end the run after this many frames (agent steps x 4), with a default run's LR schedule")
    parser.add_argument("--keep", default=None, help="keep the run folder in this folder (default: a temporary one)")
    parser.add_argument("--defaults", action="store_true",
                        help="run `herd train --env PongNoFrameskip-v4` with herd's defaults for this machine and no "
                             "other flag (but --basic_verbose=False and --extra)")
    args = parser.parse_args()
    if args.defaults:
        herd_args = ["train", "--env=PongNoFrameskip-v4", "--basic_verbose=False", *shlex.split(args.extra)]
    else:
        herd_args = ["train", *gpu_config(args.workers), "--basic_verbose=False", "--tensorboard=False",
                     *shlex.split(args.extra)]
    if args.frames is not None:
        # The schedule of a default-length run (its decay horizon in updates: the length
        # herd/profiles.py gives this game and algorithm, or one given in --extra), cut at --frames.
        from herd.config import resolve
        from herd.envs.registry import profile_kind
        flags = dict(arg[2:].split("=", 1) for arg in herd_args[1:] if arg.startswith("--") and "=" in arg)
        herd_args.append(f"--environment_max_steps={args.frames // FRAME_SKIP}")
        if "lr_scheduler_steps" not in flags:       # a horizon given in --extra is kept
            horizon = resolve(flags, env_kind=profile_kind).train.lr_scheduler_steps
            herd_args.append(f"--lr_scheduler_steps={horizon}")
    with tempfile.TemporaryDirectory() as tmp:
        run_dir, launch, code = run_herd(herd_args, Path(args.keep or tmp), stop_after=args.minutes * 60,
                                         timeout=args.minutes * 60 + 300)
        episodes = read_csv(run_dir / "episodes.csv")
        points = curve(episodes, launch)
        lag = lag_of(read_csv(run_dir / "train.csv"))
        log_tail = (run_dir / "log.txt").read_text().splitlines()[-20:]
        config = (run_dir / "config.json").read_text()
    full = [p for p in points if p["games"] == 100]
    reached = next((p for p in full if p["average"] >= args.target), None)
    marks = [p for i, p in enumerate(full) if i % max(1, len(full) // 12) == 0][-12:]
    print_table(["seconds from launch", "frames", "avg of last 100 games"],
                [[p["seconds"], f"{p['frames']:,}", p["average"]] for p in marks])
    best = max((p["average"] for p in full), default=None)
    verdict = (f"reached {args.target} after {reached['seconds']} s and {reached['frames']:,} frames" if reached
               else f"did not reach {args.target} in {args.minutes} min (best 100-game average {best})")
    print(verdict)
    reached_at = first_reaching(full)
    print_table(["100-game average", "first at frames", "seconds from launch"],
                [[t, f"{r['frames']:,}" if r else "-", r["seconds"] if r else "-"] for t, r in reached_at.items()])
    print(f"policy lag (updates): mean {lag['mean']}, max {lag['max']}")
    won_all = shutouts(episodes)
    print(f"games won 21-0 (the opening rally won too) among the last 100: {won_all}")
    device = "cuda" if '"device": "cuda"' in config else "cpu"
    minutes = minute_marks(full, args.minutes)
    print_table(["minutes from launch", *map(str, minutes)], [["avg of last 100 games", *minutes.values()]])
    record(f"pong_{device}{args.tag}", {"command": "python benchmarks/pong.py " + " ".join(f"{k}={v}" for k, v in vars(args).items()),
                              "herd_args": herd_args, "exit_code": code, "target": args.target,
                              "reached": reached, "first_reaching": reached_at, "policy_lag": lag,
                              "best_average": best, "average_at_minute": minutes,
                              "won_21_0_of_last_100": won_all,
                              "config": json.loads(config), "log_tail": log_tail,
                              "curve": points})                       # every game: the whole curve


if __name__ == "__main__":
    main()
