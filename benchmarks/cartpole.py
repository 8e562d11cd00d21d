"""Time to solve CartPole with the default quick start: `herd train --env CartPole-v1`.

For each seed, the wall time from launching the process to the first moment the
100-episode average return reaches 475. With --peer, Sample Factory's CartPole example
then runs with the same seeds in the same command (peer_sf_cartpole.py), one after the
other, never beside herd. Usage: python benchmarks/cartpole.py [--seeds 1 2 3] [--peer]
"""
from __future__ import annotations

import argparse
import os
import shlex
import statistics
import sys
import tempfile
from pathlib import Path

from common import moving_averages, print_table, read_csv, record, run_herd

TARGET = 475.0


def time_to_target(episodes: list[dict], launch: float, window: int = 100) -> tuple[float | None, float | None]:
    """(seconds from launch, env steps) when the moving average first reaches TARGET."""
    for row, average, games in moving_averages(episodes, window):
        if games == window and average >= TARGET:
            return row["unix_time"] - launch, row["env_step"]
    return None, None


def first_update_after_run_folder(run_dir: Path) -> float | None:
    """Seconds from log.txt's "run folder" line to its "first update" line: the start-up
    of the actors and the learner (the goal: within 1 s)."""
    from datetime import datetime
    stamps = {}
    for line in (run_dir / "log.txt").read_text().splitlines():
        for key in ("run folder", "first update"):
            if key not in stamps and f" INFO {key}" in line:
                stamps[key] = datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f")
    if len(stamps) < 2:
        return None
    return (stamps["first update"] - stamps["run folder"]).total_seconds()


def lowest_after_target(episodes: list[dict], window: int = 100) -> float | None:
    """The lowest moving average after it first reached TARGET (None: it never did)."""
    averages = [average for _, average, games in moving_averages(episodes, window) if games == window]
    first = next((i for i, average in enumerate(averages) if average >= TARGET), None)
    return None if first is None else min(averages[first:])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--label", default="cartpole", help="names the results file")
    parser.add_argument("--timeout", type=float, default=600, help="seconds one run may take (more on a loaded machine)")
    parser.add_argument("--extra", default="", help="extra herd flags in one string, e.g. --extra='--lr=0.002 --batch_size=8'")
    parser.add_argument("--peer", action="store_true", help="then Sample Factory 2.1.1's CartPole example, same seeds")
    parser.add_argument("--peer_limit", type=float, default=300, help="seconds a peer run may take to reach 475")
    parser.add_argument("--keep", help="keep the run folders in DIR (for train.csv, herd plot)")
    args = parser.parse_args()
    extra = shlex.split(args.extra)
    runs, times = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for seed in args.seeds:
            run_dir, launch, code = run_herd(["train", "--env", "CartPole-v1", f"--seed={seed}", "--basic_verbose=False",
                                              *extra], Path(args.keep or tmp), timeout=args.timeout)
            episodes = read_csv(run_dir / "episodes.csv")
            seconds, steps = time_to_target(episodes, launch)
            best = max((sum(e["score"] for e in episodes[i - 100:i]) / 100 for i in range(100, len(episodes) + 1)),
                       default=float("nan"))
            last = sum(e["score"] for e in episodes[-100:]) / max(1, len(episodes[-100:]))
            lowest = lowest_after_target(episodes)
            times.append(seconds if seconds is not None else float("inf"))
            # Numbers as numbers (None where not reached); the table formats them.
            start_up = first_update_after_run_folder(run_dir)
            runs.append({"seed": seed, "exit": code, "seconds": round(seconds, 2) if seconds else None,
                         "run_folder_to_first_update_s": round(start_up, 2) if start_up is not None else None,
                         "load_average_1min": round(os.getloadavg()[0], 2),
                         "env_steps": int(steps) if steps else None, "best_avg100": round(best, 2),
                         "final_avg100": round(last, 2), "episodes": len(episodes),
                         # a collapse that recovers by the end shows here, not in final_avg100
                         "lowest_avg100_after_475": round(lowest, 2) if lowest is not None else None})
    median = statistics.median(times)
    print_table(["seed", "exit", "seconds to 475 (from launch)", "run folder to first update (s)", "env steps",
                 "best avg100", "final avg100", "episodes", "load (1 min)"],
                [[r["seed"], r["exit"], f"{r['seconds']:.1f}" if r["seconds"] else "not reached",
                  r["run_folder_to_first_update_s"],
                  r["env_steps"] or "-", f"{r['best_avg100']:.1f}", f"{r['final_avg100']:.1f}", r["episodes"],
                  r["load_average_1min"]]
                 for r in runs])
    reached = sum(r["seconds"] is not None for r in runs)
    # The check: every seed reaches 475 and still averages 475 or more at the end.
    held = sum(r["seconds"] is not None and r["final_avg100"] >= TARGET for r in runs)
    never_fell = sum(r["lowest_avg100_after_475"] is not None and r["lowest_avg100_after_475"] >= TARGET for r in runs)
    print(f"median_seconds_to_475={median:.1f} reached={reached}/{len(runs)} ended_at_475_or_more={held}/{len(runs)} "
          f"never_below_475_after_reaching={never_fell}/{len(runs)}")
    peer = run_peers(args.seeds, args.peer_limit) if args.peer else None
    record(args.label, {"command": "python benchmarks/cartpole.py " + " ".join(shlex.quote(a) for a in sys.argv[1:]),
                        "herd_command": "herd train --env CartPole-v1 " + args.extra, "target": TARGET, "runs": runs,
                        "median_seconds": median if median != float("inf") else None,
                        "median_run_folder_to_first_update_s": statistics.median(
                            [r["run_folder_to_first_update_s"] for r in runs if r["run_folder_to_first_update_s"]]
                            or [float("nan")]),
                        "reached": reached, "ended_at_or_above_target": held, "never_below_after_reaching": never_fell,
                        **({"peer": peer} if peer else {})})


def run_peers(seeds: list[int], limit: float) -> dict:
    """Sample Factory's CartPole example once per seed; prints its table, returns its record."""
    from peer_sample_factory import PeerError
    from peer_sf_cartpole import run_peer_cartpole
    try:
        runs = [run_peer_cartpole(seed, limit) for seed in seeds]
    except PeerError as e:
        raise SystemExit(f"cartpole: peer: {e}")
    times = [r["seconds"] if r["seconds"] is not None else float("inf") for r in runs]
    median = statistics.median(times)
    print_table(["Sample Factory seed", "seconds to 475 (from launch, 5 s reports)", "best avg100"],
                [[r["seed"], f"{r['seconds']:.1f}" if r["seconds"] is not None else f"not in {limit:.0f} s",
                  r["best_avg100"]] for r in runs])
    print(f"peer_median_seconds_to_475={median:.1f}")
    return {"peer": "sample-factory 2.1.1, sf_examples.train_gym_env", "command": runs[0]["command"],
            "runs": [{k: v for k, v in r.items() if k not in ("command", "log_tail")} for r in runs],
            "median_seconds": median if median != float("inf") else None}


if __name__ == "__main__":
    main()
